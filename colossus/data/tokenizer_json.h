// What every reader of a tokenizer.json component shares (normalizer,
// pre_tokenizer, decoder, hf_bpe_files). Internal to colossus/data.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace colossus::data {

// A component's "type" field; empty when the node is not an object or has no string "type".
inline std::string component_type(const nlohmann::json& node) {
  if (!node.is_object()) return {};
  const auto it = node.find("type");
  return it != node.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace colossus::data

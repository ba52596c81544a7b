#include "colossus/checkpoint/hf_index.h"

#include "colossus/checkpoint/file_io.h"
#include "colossus/core/errors.h"

#include <fmt/format.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace colossus::checkpoint::hf {

namespace {

constexpr std::string_view kExtension = ".safetensors";

bool skip_digits(std::string_view& text) {
  std::size_t n = 0;
  while (n < text.size() && std::isdigit(static_cast<unsigned char>(text[n]))) ++n;
  text.remove_prefix(n);
  return n > 0;
}

bool skip(std::string_view& text, std::string_view literal) {
  if (!text.starts_with(literal)) return false;
  text.remove_prefix(literal.size());
  return true;
}

[[noreturn]] void bad_index(const std::string& path, std::string_view what) {
  throw CheckpointError(fmt::format("checkpoint index '{}': {}", path, what));
}

}  // namespace

std::string single_file_name(std::string_view prefix) { return fmt::format("{}{}", prefix, kExtension); }

std::string index_file_name(std::string_view prefix) { return fmt::format("{}{}.index.json", prefix, kExtension); }

std::string shard_file_name(std::string_view prefix, int64_t k, int64_t n) {
  return fmt::format("{}-{:05d}-of-{:05d}{}", prefix, k, n, kExtension);
}

std::string staged_shard_file_name(std::string_view prefix, int64_t k, int64_t n, int generation) {
  return fmt::format("{}-{:05d}-of-{:05d}.staged-{}{}", prefix, k, n, generation, kExtension);
}

bool is_shard_file_name(std::string_view name, std::string_view prefix) {
  if (!skip(name, prefix) || !skip(name, "-") || !skip_digits(name) || !skip(name, "-of-") || !skip_digits(name)) {
    return false;
  }
  if (name == kExtension) return true;
  return skip(name, ".staged-") && skip_digits(name) && name == kExtension;
}

Index read_index(const std::string& path) {
  // Large models' indexes are a few MB; 256 MB is a corrupt or foreign file.
  const std::string text = io::read_regular_file(path, std::size_t{256} << 20, "checkpoint index");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // Not e.what(): it quotes the bytes last read, and the file may be anything.
    bad_index(path, fmt::format("not valid JSON (syntax error at byte {})", e.byte));
  }
  if (!json.is_object()) bad_index(path, "not a JSON object");
  Index index;
  index.path = path;
  auto weight_map = json.find("weight_map");
  if (weight_map == json.end() || !weight_map->is_object()) bad_index(path, "has no \"weight_map\" object");
  for (const auto& [name, file] : weight_map->items()) {
    if (!file.is_string()) bad_index(path, fmt::format("weight_map entry '{}' is not a file name string", name));
    const auto& file_name = file.get_ref<const std::string&>();
    // An index only names files beside it; "../x" or "/x" would make loading
    // read files outside the checkpoint.
    std::filesystem::path relative(file_name);
    bool escapes = file_name.empty() || relative.is_absolute();
    for (const auto& part : relative) escapes = escapes || part == "..";
    if (escapes) bad_index(path, fmt::format("tensor '{}' maps to '{}', not a file beside the index", name, file_name));
    index.weight_map.emplace(name, file_name);
  }
  auto metadata = json.find("metadata");
  if (metadata != json.end() && metadata->is_object()) {
    auto total = metadata->find("total_size");
    if (total != metadata->end() && total->is_number_integer()) index.total_size = total->get<int64_t>();
  }
  return index;
}

void write_index(const std::string& path, const std::map<std::string, std::string>& weight_map, int64_t total_size) {
  nlohmann::json json;  // std::map keys: sorted, as transformers writes them
  json["metadata"] = {{"total_size", total_size}};
  json["weight_map"] = weight_map;
  std::string text = json.dump(2) + "\n";
  io::TempFile out(path, io::temp_path_for(path));
  out.write(text.data(), text.size());
  out.publish();
}

}  // namespace colossus::checkpoint::hf

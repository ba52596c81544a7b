#include "colossus/data/hf_bpe_files.h"

#include "colossus/core/errors.h"
#include "colossus/data/tokenizer_json.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

namespace colossus::data {

namespace {

using nlohmann::json;

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("tokenizer file '{}' cannot be opened (missing or unreadable)", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// node[key], or null when node is no object or lacks the key (the const
// operator[] of nlohmann::json must not be used on a missing key).
const json& field(const json& node, const char* key) {
  static const json null_json;
  if (!node.is_object()) return null_json;
  auto it = node.find(key);
  return it == node.end() ? null_json : *it;
}

bool flag(const json& node, const char* key, bool fallback) {
  if (!node.contains(key) || node[key].is_null()) return fallback;
  return node[key].get<bool>();
}

std::vector<std::pair<std::string, std::string>> read_merges(const json& merges, const std::string& path) {
  if (!merges.is_array()) throw ConfigError(fmt::format("{}: model.merges must be an array", path));
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (const auto& merge : merges) {
    if (merge.is_string()) {
      // Legacy form "left right": tokens never hold a plain space.
      const auto text = merge.get<std::string>();
      const auto space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        throw ConfigError(fmt::format("{}: merge '{}' must be two tokens separated by one space", path, text));
      }
      out.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      out.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      throw ConfigError(fmt::format("{}: merge {} must be \"a b\" or [\"a\", \"b\"]", path, merge.dump()));
    }
  }
  return out;
}

Vocab read_vocab(const json& vocab, const std::string& path) {
  if (!vocab.is_object()) throw ConfigError(fmt::format("{}: the vocabulary must be an object of token -> id", path));
  Vocab out;
  out.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer()) throw ConfigError(fmt::format("{}: id of token '{}' is not an integer", path, token));
    out.emplace(token, id.get<int32_t>());
  }
  return out;
}

void read_model(const json& model, const std::string& path, BpeTokenizerConfig& config) {
  const std::string type = component_type(model);
  if (type != "BPE" && !(type.empty() && model.contains("merges"))) {
    throw ConfigError(
        fmt::format("{}: model.type '{}' is not supported; expected a 'BPE' model (or a SentencePiece "
                    "tokenizer.model)",
                    path, type.empty() ? "<none>" : type));
  }
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0) {
    throw ConfigError(fmt::format("{}: BPE dropout {} is not supported; expected null", path, model["dropout"].dump()));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() && !model[key].get<std::string>().empty()) {
      throw ConfigError(fmt::format("{}: model.{} {} is not supported; expected null", path, key,
                                    model[key].dump()));
    }
  }
  if (!model.contains("vocab") || !model.contains("merges")) {
    throw ConfigError(fmt::format("{}: the BPE model needs 'vocab' and 'merges'", path));
  }
  config.vocab = read_vocab(model["vocab"], path);
  config.merges = read_merges(model["merges"], path);
  config.ignore_merges = flag(model, "ignore_merges", false);
  config.byte_fallback = flag(model, "byte_fallback", false);
  config.fuse_unk = flag(model, "fuse_unk", false);
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    config.unk_token = model["unk_token"].get<std::string>();
  }
}

// The ids of a special token named in a post processor: its own id if the
// processor gives one, else from the vocabulary or added tokens.
int32_t post_processor_token_id(const json& entry, const std::string& path) {
  // Roberta/Bert form: ["</s>", 2]
  if (entry.is_array() && entry.size() == 2 && entry[1].is_number_integer()) return entry[1].get<int32_t>();
  throw ConfigError(fmt::format("{}: post processor token {} must be [\"token\", id]", path, entry.dump()));
}

void read_template(const json& node, const std::string& path, BpeTokenizerConfig& config) {
  const json& single = field(node, "single");
  const json& specials = field(node, "special_tokens");
  if (!single.is_array()) throw ConfigError(fmt::format("{}: TemplateProcessing needs a 'single' template", path));
  bool after_sequence = false;
  for (const auto& item : single) {
    if (item.contains("Sequence")) {
      after_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken")) {
      throw ConfigError(fmt::format("{}: template item {} is not supported", path, item.dump()));
    }
    const std::string name = field(field(item, "SpecialToken"), "id").get<std::string>();
    if (!field(field(specials, name.c_str()), "ids").is_array()) {
      throw ConfigError(fmt::format("{}: template token '{}' has no entry in special_tokens", path, name));
    }
    auto& target = after_sequence ? config.suffix_ids : config.prefix_ids;
    for (const auto& id : field(field(specials, name.c_str()), "ids")) target.push_back(id.get<int32_t>());
  }
}

void read_post_processor(const json& node, const std::string& path, BpeTokenizerConfig& config) {
  if (node.is_null()) return;
  const std::string type = component_type(node);
  if (type == "ByteLevel") return;  // adds no ids; only adjusts offsets
  if (type == "TemplateProcessing") return read_template(node, path, config);
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    config.prefix_ids.push_back(post_processor_token_id(field(node, "cls"), path));
    config.suffix_ids.push_back(post_processor_token_id(field(node, "sep"), path));
    return;
  }
  if (type == "Sequence" && field(node, "processors").is_array()) {
    for (const auto& child : field(node, "processors")) read_post_processor(child, path, config);
    return;
  }
  throw ConfigError(
      fmt::format("{}: post_processor type '{}' is not supported; expected ByteLevel, "
                  "TemplateProcessing, RobertaProcessing, BertProcessing or a Sequence of them",
                  path, type));
}

ConfiguredToken configured_token(const json& config, const char* key, const std::string& path) {
  if (!config.contains(key)) return {};
  const json& node = field(config, key);
  if (node.is_null()) return {.given = true, .name = std::nullopt};
  if (node.is_string()) return {.given = true, .name = node.get<std::string>()};
  if (field(node, "content").is_string()) return {.given = true, .name = field(node, "content").get<std::string>()};
  throw ConfigError(
      fmt::format("{}: {} must be a token string, {{\"content\": ...}} or null; got {}", path, key, node.dump()));
}

}  // namespace

json read_json_file(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw ConfigError(fmt::format("tokenizer file '{}' is not valid JSON: {}", path, e.what()));
  }
}

bool is_bpe_tokenizer_json(const json& tokenizer) {
  const json& model = field(tokenizer, "model");
  return component_type(model) == "BPE" || (component_type(model).empty() && model.contains("merges"));
}

BpeTokenizerConfig read_hf_tokenizer_json(const json& json, const std::string& path) {
  if (!json.is_object() || !json.contains("model")) {
    throw ConfigError(fmt::format("{}: not a tokenizer.json (no 'model' object)", path));
  }
  BpeTokenizerConfig config;
  config.source = path;
  try {
    read_model(field(json, "model"), path, config);
    config.normalizer = Normalizer::from_json(json.value("normalizer", nlohmann::json()), path);
    config.pre_tokenizer = PreTokenizer::from_json(field(json, "pre_tokenizer"), path);
    config.decoder = Decoder::from_json(field(json, "decoder"), path);
    if (json.contains("post_processor")) read_post_processor(field(json, "post_processor"), path, config);
    for (const auto& entry : json.value("added_tokens", json::array())) {
      config.added_tokens.push_back({.content = entry.at("content").get<std::string>(),
                                     .id = entry.at("id").get<int32_t>(),
                                     .special = entry.value("special", false),
                                     .single_word = entry.value("single_word", false),
                                     .lstrip = entry.value("lstrip", false),
                                     .rstrip = entry.value("rstrip", false),
                                     .normalized = entry.value("normalized", false)});
    }
  } catch (const json::exception& e) {
    // Wrong JSON types deep inside (a string where an id belongs, ...).
    throw ConfigError(fmt::format("{}: unexpected tokenizer.json structure: {}", path, e.what()));
  }
  return config;
}

BpeTokenizerConfig read_gpt2_vocab_merges(const std::string& vocab_path, const std::string& merges_path) {
  BpeTokenizerConfig config;
  config.source = vocab_path + " + " + merges_path;
  config.pre_tokenizer = PreTokenizer::byte_level(/*add_prefix_space=*/false);
  config.decoder = Decoder::byte_level();
  config.vocab = read_vocab(read_json_file(vocab_path), vocab_path);
  std::istringstream lines(read_text_file(merges_path));
  std::string line;
  std::size_t line_number = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
    const auto space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      throw ConfigError(fmt::format("{}:{}: '{}' is not a merge; expected two tokens separated by one space",
                                    merges_path, line_number, line));
    }
    config.merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  if (auto it = config.vocab.find("<|endoftext|>"); it != config.vocab.end()) {
    config.added_tokens.push_back({.content = it->first, .id = it->second, .special = true});
    config.bos_token = config.eos_token = it->first;
  }
  return config;
}

SpecialTokenNames read_tokenizer_config(const std::string& path) {
  const json config = read_json_file(path);
  if (!config.is_object()) throw ConfigError(fmt::format("{}: expected a JSON object", path));
  return {.bos = configured_token(config, "bos_token", path),
          .eos = configured_token(config, "eos_token", path),
          .pad = configured_token(config, "pad_token", path)};
}

}  // namespace colossus::data

#include "colossus/data/decoder.h"

#include "colossus/core/errors.h"
#include "colossus/data/tokenizer_json.h"
#include "colossus/data/bpe_model.h"
#include "colossus/data/unicode.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace colossus::data {

namespace {

using nlohmann::json;

// ByteLevel: each char of a token back to its byte; a token with a char
// outside the byte alphabet (an added token like "<a b>") is taken as written.
void append_token_bytes(const std::string& token, std::string& out) {
  const std::size_t start = out.size();
  std::size_t pos = 0;
  while (pos < token.size()) {
    const Utf8Char ch = decode_utf8(token, pos);
    const auto byte = unicode_to_byte(ch.cp);
    if (!byte) {
      out.resize(start);
      out += token;
      return;
    }
    out.push_back(static_cast<char>(*byte));
    pos += ch.bytes;
  }
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte of a "<0xNN>" token (Rust's u8::from_str_radix: either case, a
// leading '+'), or -1.
int fallback_byte(const std::string& token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return -1;
  const int high = token[3] == '+' ? 0 : hex_digit(token[3]);
  const int low = hex_digit(token[4]);
  return high < 0 || low < 0 ? -1 : high * 16 + low;
}

bool valid_utf8(std::string_view bytes) { return utf8_lossy(bytes) == bytes; }

std::vector<char32_t> chars_of(const std::string& text) {
  std::vector<char32_t> chars;
  for (std::size_t pos = 0; pos < text.size();) {
    const Utf8Char ch = decode_utf8(text, pos);
    chars.push_back(ch.cp);
    pos += ch.bytes;
  }
  return chars;
}

}  // namespace

void Decoder::read(const json& node, const std::string& path, std::vector<Step>& steps) {
  const std::string type = component_type(node);
  if (type == "Sequence" && node.contains("decoders") && node["decoders"].is_array()) {
    for (const json& part : node["decoders"]) read(part, path, steps);
  } else if (type == "ByteLevel") {
    steps.push_back({.kind = Step::Kind::kByteLevel});
  } else if (type == "ByteFallback") {
    steps.push_back({.kind = Step::Kind::kByteFallback});
  } else if (type == "Fuse") {
    steps.push_back({.kind = Step::Kind::kFuse});
  } else if (type == "Replace" && node.contains("content") && node["content"].is_string()) {
    steps.push_back({.kind = Step::Kind::kReplace,
                     .pattern = TextPattern::from_json(node.value("pattern", json()), "decoder Replace", path),
                     .text = node["content"].get<std::string>()});
  } else if (type == "Strip" && node.contains("content") && node["content"].is_string()) {
    const std::string content = node["content"].get<std::string>();
    if (content.empty() || decode_utf8(content, 0).bytes != content.size()) {
      throw ConfigError(fmt::format("{}: decoder Strip content '{}' must be one character", path, content));
    }
    steps.push_back({.kind = Step::Kind::kStrip,
                     .strip_char = decode_utf8(content, 0).cp,
                     .start = node.value("start", std::size_t{0}),
                     .stop = node.value("stop", std::size_t{0})});
  } else if (type == "Metaspace") {
    const std::string scheme = node.value("prepend_scheme", "always");
    if (scheme != "always" && scheme != "first" && scheme != "never") {
      throw ConfigError(fmt::format("{}: decoder Metaspace prepend_scheme '{}' is not supported; expected always, "
                                    "first or never",
                                    path, scheme));
    }
    // The legacy add_prefix_space must agree with the scheme, as tokenizers requires.
    if (node.contains("add_prefix_space") && node["add_prefix_space"].is_boolean() &&
        node["add_prefix_space"].get<bool>() != (scheme != "never")) {
      throw ConfigError(fmt::format("{}: decoder Metaspace add_prefix_space {} contradicts prepend_scheme '{}'", path,
                                    node["add_prefix_space"].dump(), scheme));
    }
    steps.push_back(
        {.kind = Step::Kind::kMetaspace, .text = node.value("replacement", "\u2581"), .prepend = scheme != "never"});
  } else {
    throw ConfigError(fmt::format("{}: decoder {} is not supported; supported: ByteLevel, Metaspace, ByteFallback, "
                                  "Fuse, Strip, Replace and a Sequence of them",
                                  path, node.dump().substr(0, 200)));
  }
}

Decoder Decoder::from_json(const json& node, const std::string& path) {
  Decoder decoder;
  if (node.is_null()) return decoder;
  read(node, path, decoder.steps_);
  decoder.present_ = true;
  return decoder;
}

Decoder Decoder::byte_level() {
  Decoder decoder;
  decoder.steps_.push_back({.kind = Step::Kind::kByteLevel});
  decoder.present_ = true;
  return decoder;
}

void Decoder::run(const Step& step, std::vector<std::string>& tokens) {
  switch (step.kind) {
    case Step::Kind::kByteLevel: {
      std::string bytes;
      for (const std::string& token : tokens) append_token_bytes(token, bytes);
      tokens.assign(1, utf8_lossy(bytes));
      return;
    }
    case Step::Kind::kFuse: {
      std::string fused;
      for (const std::string& token : tokens) fused += token;
      tokens.assign(1, std::move(fused));
      return;
    }
    case Step::Kind::kReplace:
      for (std::string& token : tokens) token = step.pattern->replace_all(token, step.text);
      return;
    case Step::Kind::kByteFallback: {
      // Runs of <0xNN> tokens become their bytes' text, or one U+FFFD per
      // byte when those bytes are not valid UTF-8.
      std::vector<std::string> out;
      std::string bytes;
      std::size_t byte_count = 0;
      auto flush = [&] {
        if (byte_count == 0) return;
        if (valid_utf8(bytes)) {
          out.push_back(bytes);
        } else {
          for (std::size_t i = 0; i < byte_count; ++i) out.emplace_back("\uFFFD");
        }
        bytes.clear();
        byte_count = 0;
      };
      for (std::string& token : tokens) {
        if (const int byte = fallback_byte(token); byte >= 0) {
          bytes.push_back(static_cast<char>(byte));
          ++byte_count;
        } else {
          flush();
          out.push_back(std::move(token));
        }
      }
      flush();
      tokens = std::move(out);
      return;
    }
    case Step::Kind::kStrip:
      for (std::string& token : tokens) {
        const std::vector<char32_t> chars = chars_of(token);
        std::size_t begin = 0, end = chars.size();
        while (begin < std::min(step.start, chars.size()) && chars[begin] == step.strip_char) ++begin;
        for (std::size_t i = 0; i < step.stop && end > begin && chars[end - 1] == step.strip_char; ++i) --end;
        std::string stripped;
        for (std::size_t i = begin; i < end; ++i) append_utf8(chars[i], stripped);
        token = std::move(stripped);
      }
      return;
    case Step::Kind::kMetaspace: {
      // Replacement chars become spaces, except in the first token, which
      // loses all of them unless nothing was prepended.
      const char32_t replacement = decode_utf8(step.text, 0).cp;
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        std::string out;
        for (char32_t cp : chars_of(tokens[i])) {
          if (cp != replacement) {
            append_utf8(cp, out);
          } else if (i != 0 || !step.prepend) {
            out.push_back(' ');
          }
        }
        tokens[i] = std::move(out);
      }
      return;
    }
  }
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  std::string text;
  if (!present_) {
    for (std::size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
    return text;
  }
  for (const Step& step : steps_) run(step, tokens);
  for (const std::string& token : tokens) text += token;
  return text;
}

}  // namespace colossus::data

// The pre-tokenizer of a tokenizer.json: Split (any regex or string, every
// behaviour, invert), ByteLevel, Metaspace, Digits, Punctuation, Whitespace,
// WhitespaceSplit and Sequences of them, cutting each normalized text piece
// into the words the BPE model merges, as Hugging Face tokenizers does.
#pragma once
#include "colossus/data/pre_tokenize.h"
#include "colossus/data/text_pattern.h"

#include <nlohmann/json_fwd.hpp>

#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace colossus::data {

class PreTokenizer {
 public:
  PreTokenizer() = default;
  // A tokenizer.json "pre_tokenizer" node (null: the piece stays one word).
  // Throws ConfigError naming a pre-tokenizer or option that is not supported.
  static PreTokenizer from_json(const nlohmann::json& node, const std::string& path);
  // ByteLevel with its GPT-2 regex (GPT-2's vocab.json + merges.txt).
  static PreTokenizer byte_level(bool add_prefix_space);

  // Whether the words are raw bytes for GPT-2's alphabet (ByteLevel ran last).
  bool byte_level() const { return byte_level_; }

  // Appends the words of `text` to `words`. `at_origin`: the text starts at
  // offset 0 of the input (Metaspace's prepend_scheme "first"). Rewritten text
  // is kept in `arena`, which the words may view.
  void split(std::string_view text, bool at_origin, std::deque<std::string>& arena,
             std::vector<std::string_view>& words) const;

 private:
  enum class PrependScheme { kAlways, kFirst, kNever };
  struct Step {
    enum class Kind {
      kSplit,
      kKnownSplit,
      kByteLevel,
      kMetaspace,
      kDigits,
      kPunctuation,
      kWhitespace,
      kWhitespaceSplit
    };
    Kind kind;
    std::optional<TextPattern> pattern;        // kSplit
    SplitPattern known = SplitPattern::kGpt2;  // kKnownSplit (Isolated, hand-written)
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool flag = false;        // ByteLevel add_prefix_space; Metaspace split; Digits individual_digits
    bool use_regex = false;   // ByteLevel
    std::string replacement;  // Metaspace
    PrependScheme prepend = PrependScheme::kAlways;
  };
  struct Piece {
    std::string_view text;
    bool at_origin;
  };
  static void read(const nlohmann::json& node, const std::string& path, std::vector<Step>& steps);
  static void run(const Step& step, const Piece& piece, std::deque<std::string>& arena, std::vector<Piece>& out);

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace colossus::data

// The pre-tokenizer regexes of byte-level BPE tokenizers (GPT-2, LLaMA-3,
// Qwen2), hand-written over code point classes instead of a regex engine:
// same splits as Hugging Face's Split/ByteLevel pre-tokenizers, no backtracking.
#pragma once
#include <optional>
#include <string_view>
#include <vector>

namespace colossus::data {

// Which of the known regexes splits the text.
//   kGpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   kLlama3: (?i:'s|...|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2:  as kLlama3 with \p{N} (single digits) instead of \p{N}{1,3}
enum class SplitPattern { kGpt2, kLlama3, kQwen2 };

// The pattern a tokenizer.json regex string spells exactly, or nullopt.
std::optional<SplitPattern> split_pattern_from_regex(std::string_view regex);

// The regex source text of a pattern (for messages and tokenizer.json output).
std::string_view split_pattern_regex(SplitPattern pattern);

// Appends to `pieces` the consecutive matches of the pattern over `text`; they
// cover the text exactly. Bytes that are not valid UTF-8 count as punctuation.
void pre_tokenize(std::string_view text, SplitPattern pattern, std::vector<std::string_view>& pieces);

}  // namespace colossus::data

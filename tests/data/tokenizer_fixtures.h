// The tokenizer fixtures: made once per test process by
// make_tokenizer_fixtures.py (trained with the venv's tokenizers and
// sentencepiece) in a temporary directory, with the ids Python gives.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace colossus::data::testing {

struct TokenizerFixtures {
  std::string dir;          // the temporary directory
  nlohmann::json expected;  // expected.json
  std::string path(const std::string& relative) const { return dir + "/" + relative; }
  // The entry of expected["tokenizers"] with this name; fails the test if absent.
  const nlohmann::json& tokenizer(const std::string& name) const;
};

// Built on first use; the directory is removed when the test program ends.
const TokenizerFixtures& fixtures();

}  // namespace colossus::data::testing

// Test support for tests/lora: the PEFT oracle (peft_oracle.py in the
// project's venv), run once per process, tiny models, and the difference
// measure.
#pragma once
#include "colossus/models/causal_lm.h"

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <memory>
#include <string>

namespace colossus::lora::testing {

// A fresh directory for this test process, removed at exit.
const std::filesystem::path& scratch_dir();

struct OracleResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};
// Runs `peft_oracle.py <arguments>` with the venv's Python.
OracleResult run_oracle(const std::string& arguments);

// The directory `peft_oracle.py make` filled (bases under llama/, gpt2/; one
// folder per case). Made once per process; a failure fails the calling test.
const std::filesystem::path& peft_reference_dir();

// max |a - b| / max |b|, in double.
double max_rel_diff(const at::Tensor& a, const at::Tensor& b);

// Tiny seeded fp32 models (hidden 32, 2 layers) for tests that need no oracle.
std::shared_ptr<models::CausalLM> tiny_llama(uint64_t seed);
std::shared_ptr<models::CausalLM> tiny_gpt2(uint64_t seed);

}  // namespace colossus::lora::testing

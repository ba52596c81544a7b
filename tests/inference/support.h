// Test support for tests/inference: a scratch directory per test process,
// running a command (the HF oracle, the colossus binary) and capturing its
// output, and tiny models saved as Hugging Face directories.
#pragma once
#include "colossus/models/causal_lm.h"
#include "tests/testing/command.h"

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace colossus::inference::testing {

// A fresh directory for this test process, removed at exit.
const std::filesystem::path& scratch_dir();

using colossus::testing::CommandResult;
using colossus::testing::run_command;

// Runs tests/inference/hf_generate.py with the venv's Python.
CommandResult run_oracle(const std::string& arguments);
// hf_generate.py's batch command: each job (an argument list of one of its
// commands) in one oracle process; returns each job's printed line, in order
// (fewer on failure, which is reported through gtest). `name` names the jobs
// file in scratch_dir().
std::vector<std::string> run_oracle_batch(const std::vector<std::vector<std::string>>& jobs, const std::string& name);

// A tiny GPT-2 (n_positions 32) or LLaMA (GQA) with seeded weights of a
// larger scale than HF's default, so the logits have clear maxima and greedy
// choices do not hinge on rounding.
std::shared_ptr<models::CausalLM> tiny_gpt2(int64_t vocab = 96, int64_t n_positions = 32);
std::shared_ptr<models::CausalLM> tiny_llama(int64_t vocab = 96, int64_t max_positions = 64);
// A LLaMA-architecture family's preset ("qwen2-tiny", "qwen3-tiny",
// "mistral-tiny") at tiny_llama's scale, seeded.
std::shared_ptr<models::CausalLM> tiny_family(const std::string& preset, int64_t vocab = 96);
// The same with the preset's config changed first (e.g. Phi-3's longrope lengths).
std::shared_ptr<models::CausalLM> tiny_family_with(const std::string& preset,
                                                   const std::function<void(models::LlamaConfig&)>& change,
                                                   int64_t vocab = 96);
// phi3-tiny with partial RoPE: the first half of each head rotates (longrope's
// lists cut to its 4 frequencies), the rest passes.
std::shared_ptr<models::CausalLM> tiny_phi3_partial(int64_t vocab = 96);

}  // namespace colossus::inference::testing

// Test support for tests/models: a scratch directory for the test run and the
// Hugging Face oracle (hf_oracle.py in the project's venv), run on demand.
#pragma once
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <filesystem>
#include <string>

namespace colossus::models::testing {

// A fresh directory for this test process, removed at exit.
const std::filesystem::path& scratch_dir();

struct PythonResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// Runs `hf_oracle.py <arguments>` with the venv's Python.
PythonResult run_oracle(const std::string& arguments);

// The directory that `hf_oracle.py make` filled: one subfolder per HF case
// (HF checkpoint + reference.safetensors). Made once per process; a failure
// of the oracle fails the calling test with its output.
const std::filesystem::path& hf_reference_dir();

// max |a - b| in double.
double max_abs_diff(const at::Tensor& a, const at::Tensor& b);
// max |a - b| / max |b|: relative to the reference b's scale.
double max_rel_diff(const at::Tensor& a, const at::Tensor& b);

// Adds seeded noise of scale `scale` to every parameter, so biases (0) and norm
// weights (1) after init hold distinct values that a save/load must carry.
void perturb_parameters(torch::nn::Module& module, uint64_t seed, double scale = 0.1);

// (batch, seq) int64 ids in [0, vocab), from a seeded generator.
at::Tensor random_ids(int64_t batch, int64_t seq, int64_t vocab, uint64_t seed);

}  // namespace colossus::models::testing

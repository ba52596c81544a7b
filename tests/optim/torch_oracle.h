// Test support for tests/optim and tests/amp: runs torch_oracle.py (PyTorch
// and transformers in the project's venv, the oracle only) and reads the
// safetensors files it writes.
#pragma once
#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <string>

namespace colossus::optim::testing {

// A fresh directory for this test process, removed at exit.
const std::filesystem::path& scratch_dir();

bool python_available();

// Runs `torch_oracle.py <arguments>`; returns its exit code, output in `output`.
int run_oracle(const std::string& arguments, std::string& output);

// Every tensor of a safetensors file, copied out of the mapping.
std::map<std::string, at::Tensor> read_tensors(const std::filesystem::path& file);

// max |a - b| / max |b| in double (0 when both are all zero).
double max_rel_diff(const at::Tensor& a, const at::Tensor& b);

}  // namespace colossus::optim::testing

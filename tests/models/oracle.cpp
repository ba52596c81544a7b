#include "tests/models/oracle.h"

#include "tests/testing/command.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randint.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <sys/wait.h>

namespace colossus::models::testing {

namespace fs = std::filesystem;

const fs::path& scratch_dir() { return colossus::testing::scratch_dir("models"); }

PythonResult run_oracle(const std::string& arguments) {
  auto result = colossus::testing::run_command(
      fmt::format("'{}' '{}' {} 2>&1", COLOSSUS_PYTHON, COLOSSUS_MODELS_ORACLE, arguments));
  return {result.exit_code, std::move(result.output)};
}

const fs::path& hf_reference_dir() {
  static const fs::path dir = [] {
    fs::path out = scratch_dir() / "hf";
    PythonResult result = run_oracle(fmt::format("make '{}'", out.string()));
    if (result.exit_code != 0) {
      ADD_FAILURE() << "hf_oracle.py make failed (" << result.exit_code << "):\n" << result.output;
    }
    return out;
  }();
  return dir;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  double scale = b.to(at::kDouble).abs().max().item<double>();
  return max_abs_diff(a, b) / std::max(scale, 1e-30);
}

void perturb_parameters(torch::nn::Module& module, uint64_t seed, double scale) {
  at::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& p : module.parameters()) {
    at::Tensor noise = at::empty(p.sizes(), at::kFloat);
    noise.normal_(0.0, scale, generator);
    p.add_(noise.to(p.options()));
  }
}

at::Tensor random_ids(int64_t batch, int64_t seq, int64_t vocab, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {batch, seq}, generator, at::kLong);
}

}  // namespace colossus::models::testing

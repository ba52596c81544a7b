#include "tests/optim/torch_oracle.h"

#include "tests/testing/command.h"

#include "colossus/checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <sys/wait.h>

namespace colossus::optim::testing {

namespace fs = std::filesystem;

const fs::path& scratch_dir() { return colossus::testing::scratch_dir("optim"); }

bool python_available() { return fs::exists(COLOSSUS_PYTHON) && fs::exists(COLOSSUS_TORCH_ORACLE); }

int run_oracle(const std::string& arguments, std::string& output) {
  auto result = colossus::testing::run_command(
      fmt::format("'{}' '{}' {} 2>&1", COLOSSUS_PYTHON, COLOSSUS_TORCH_ORACLE, arguments));
  output += result.output;
  return result.exit_code == 127 ? -1 : result.exit_code;
}

std::map<std::string, at::Tensor> read_tensors(const fs::path& file) {
  std::map<std::string, at::Tensor> out;
  for (auto& [name, tensor] : checkpoint::load_state_dict(file.string())) out[name] = tensor.clone();
  return out;
}

double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const double diff = (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
  const double scale = b.to(at::kDouble).abs().max().item<double>();
  if (diff == 0.0) return 0.0;
  return diff / std::max(scale, 1e-30);
}

}  // namespace colossus::optim::testing

#include "tests/optim/torch_oracle.h"

#include "colossus/checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <sys/wait.h>

namespace colossus::optim::testing {

namespace fs = std::filesystem;

namespace {

struct ScratchDir {
  fs::path path;
  ScratchDir() {
    path = fs::temp_directory_path() / fmt::format("colossus-optim-test-{}", ::getpid());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

}  // namespace

const fs::path& scratch_dir() {
  static ScratchDir dir;
  return dir.path;
}

bool python_available() { return fs::exists(COLOSSUS_PYTHON) && fs::exists(COLOSSUS_TORCH_ORACLE); }

int run_oracle(const std::string& arguments, std::string& output) {
  const std::string command = fmt::format("'{}' '{}' {} 2>&1", COLOSSUS_PYTHON, COLOSSUS_TORCH_ORACLE, arguments);
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    output = "popen failed for: " + command;
    return -1;
  }
  std::array<char, 4096> buffer;
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
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

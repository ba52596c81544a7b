#include "tests/checkpoint/test_util.h"

#include "tests/testing/command.h"

#include "colossus/checkpoint/dtypes.h"
#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#ifndef COLOSSUS_PYTHON
#error "COLOSSUS_PYTHON must name the Python interpreter used as the test oracle"
#endif

namespace colossus::checkpoint::testing {

namespace fs = std::filesystem;

TempDir::TempDir(bool in_memory) {
  const char* base = std::getenv("TMPDIR");
  std::string root = base && *base ? base : "/tmp";
  if (in_memory && ::access("/dev/shm", W_OK) == 0) root = "/dev/shm";
  std::string pattern = fmt::format("{}/colossus_ckpt_XXXXXX", root);
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (::mkdtemp(buffer.data()) == nullptr) throw std::runtime_error("mkdtemp failed: " + pattern);
  path_ = buffer.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string raw_safetensors(const std::string& header, const std::string& data) {
  uint64_t n = header.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  return bytes + header + data;
}

::testing::AssertionResult throws_checkpoint_error(const std::function<void()>& fn,
                                                   const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    std::string message = e.what();
    for (const auto& part : parts) {
      if (message.find(part) == std::string::npos) {
        return ::testing::AssertionFailure() << "message lacks \"" << part << "\": " << message;
      }
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-CheckpointError: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

::testing::AssertionResult same_tensor(const at::Tensor& got, const at::Tensor& want) {
  if (got.scalar_type() != want.scalar_type()) {
    return ::testing::AssertionFailure() << "dtype " << got.scalar_type() << " != " << want.scalar_type();
  }
  if (got.sizes() != want.sizes())
    return ::testing::AssertionFailure() << "shape " << got.sizes() << " != " << want.sizes();
  at::Tensor a = got.contiguous();
  at::Tensor b = want.contiguous().resolve_conj().resolve_neg();
  if (std::memcmp(a.const_data_ptr(), b.const_data_ptr(), a.nbytes()) != 0) {
    return ::testing::AssertionFailure() << "bytes differ";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_state_dict(const std::map<std::string, at::Tensor>& got, const NamedTensors& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << got.size() << " tensors, want " << want.size();
  for (const auto& [name, tensor] : want) {
    auto it = got.find(name);
    if (it == got.end()) return ::testing::AssertionFailure() << "missing " << name;
    auto same = same_tensor(it->second, tensor);
    if (!same) return ::testing::AssertionFailure() << name << ": " << same.message();
  }
  return ::testing::AssertionSuccess();
}

at::Tensor sample_tensor(c10::ScalarType dtype, std::vector<int64_t> shape, int64_t seed) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  // Small integers and halves: exact in every dtype from bool to fp8.
  at::Tensor base = (at::arange(numel, at::kDouble) * 7 + seed).remainder(13) * 0.5 - 2.0;
  base = base.reshape(shape);
  if (dtype == at::kBool) return base.gt(0);
  if (dtype == at::kByte || dtype == at::kUInt16 || dtype == at::kUInt32 || dtype == at::kUInt64) {
    return (base * 2 + 4).to(at::kLong).to(dtype);
  }
  if (c10::isIntegralType(dtype, /*includeBool=*/false)) return (base * 2).to(dtype);
  if (c10::isComplexType(dtype)) return at::complex(base.to(at::kFloat), (base * -1).to(at::kFloat));
  return base.to(dtype);
}

std::vector<std::pair<std::string, c10::ScalarType>> all_dtypes() {
  std::vector<std::pair<std::string, c10::ScalarType>> out;
  for (auto name : {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL", "C64",
                    "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"}) {
    out.emplace_back(name, dtype_from_name(name).value().scalar_type);
  }
  return out;
}

bool python_available() { return ::access(COLOSSUS_PYTHON, X_OK) == 0; }

int run_python(const std::string& script, std::string& output) {
  output.clear();
  if (!python_available()) return -1;
  TempDir dir;
  std::string script_path = dir.file("oracle.py");
  write_bytes(script_path, script);
  std::string command = fmt::format("'{}' '{}' 2>&1", COLOSSUS_PYTHON, script_path);
  auto result = colossus::testing::run_command(command);
  output = std::move(result.output);
  return result.exit_code == 127 ? -1 : result.exit_code;
}

}  // namespace colossus::checkpoint::testing

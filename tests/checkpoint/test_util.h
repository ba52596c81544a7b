// Helpers for the checkpoint tests: scratch directories, raw file bytes,
// hand-made safetensors files, error-message checks and the Python oracle.
#pragma once
#include "colossus/checkpoint/safetensors.h"

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace colossus::checkpoint::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it.
// in_memory: under /dev/shm where there is one, for tests that write
// thousands of small files (on this ext4 with online discard each rewrite
// costs milliseconds, on tmpfs microseconds).
class TempDir {
 public:
  explicit TempDir(bool in_memory = false);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string read_bytes(const std::string& path);
void write_bytes(const std::string& path, const std::string& bytes);
std::vector<std::string> list_dir(const std::string& dir);  // file names, sorted

// An 8-byte little-endian length, `header` verbatim, then `data`.
std::string raw_safetensors(const std::string& header, const std::string& data);

// Passes when `fn` throws CheckpointError whose message contains every one of
// `parts`; reports the message otherwise.
::testing::AssertionResult throws_checkpoint_error(const std::function<void()>& fn,
                                                   const std::vector<std::string>& parts);

// Same bytes, same dtype, same shape (works for every dtype, fp8 included).
::testing::AssertionResult same_tensor(const at::Tensor& got, const at::Tensor& want);
::testing::AssertionResult same_state_dict(const std::map<std::string, at::Tensor>& got, const NamedTensors& want);

// One deterministic tensor of `dtype` and `shape` for round trips: distinct,
// non-trivial values that every dtype can hold.
at::Tensor sample_tensor(c10::ScalarType dtype, std::vector<int64_t> shape, int64_t seed);
// Every dtype safetensors and torch share, as (safetensors name, dtype).
std::vector<std::pair<std::string, c10::ScalarType>> all_dtypes();

// Runs `script` with the venv's Python (COLOSSUS_PYTHON); returns its exit
// status and fills `output` with stdout+stderr; -1 when it could not run.
int run_python(const std::string& script, std::string& output);
bool python_available();

}  // namespace colossus::checkpoint::testing

// Our std:: calls must run the libstdc++ our headers describe, not the copies
// the torch wheel's libtorch.so and libtorch_cpu.so export
// (cmake/colossus_target.cmake says why: libtorch.so's std::filesystem::remove_all
// segfaults when called from our code, which crashed `colossus train` on the
// GPU the first time keep_last pruned a checkpoint). Built and linked like
// every executable here, libtorch.so included, so this checks the link order
// they all get; without it both tests fail (the second by SIGSEGV).
#include "tests/testing/command.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/ones.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace {

namespace fs = std::filesystem;

// The file name of the shared object that defines the function at `address`.
std::string defining_object(const void* address) {
  Dl_info info{};
  if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "<unknown>";
  return fs::path(info.dli_fname).filename().string();
}

TEST(StdlibBinding, FilesystemSymbolsComeFromLibstdcxxNotTorch) {
  // Keep libtorch_cpu loaded the way every Colossus program has it.
  ASSERT_EQ(at::ones({2}).sum().item<float>(), 2.0f);
  using RemoveAll = std::uintmax_t (*)(const fs::path&, std::error_code&);
  using CreateDirectories = bool (*)(const fs::path&, std::error_code&);
  using Rename = void (*)(const fs::path&, const fs::path&, std::error_code&);
  const RemoveAll remove_all = &fs::remove_all;
  const CreateDirectories create_directories = &fs::create_directories;
  const Rename rename = &fs::rename;
  for (const auto& [name, address] : {std::pair<const char*, const void*>{"remove_all", reinterpret_cast<const void*>(remove_all)},
                                      {"create_directories", reinterpret_cast<const void*>(create_directories)},
                                      {"rename", reinterpret_cast<const void*>(rename)}}) {
    const std::string object = defining_object(address);
    EXPECT_EQ(object.rfind("libstdc++", 0), 0u) << "std::filesystem::" << name << " binds to " << object;
  }
}

TEST(StdlibBinding, RemoveAllDeletesANestedCheckpointTree) {
  const fs::path root = colossus::testing::scratch_dir("core");
  for (int round = 0; round < 3; ++round) {
    fs::create_directories(root / "step-00000020" / "model" / "shards");
    std::ofstream(root / "step-00000020" / "model" / "model.safetensors") << "weights";
    std::ofstream(root / "step-00000020" / "train_state.json") << "{}";
    std::error_code ec;
    EXPECT_EQ(fs::remove_all(root / "step-00000020", ec), 5u) << ec.message();
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_FALSE(fs::exists(root / "step-00000020"));
  }
}

}  // namespace

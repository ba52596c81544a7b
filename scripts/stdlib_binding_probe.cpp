// Device probe for issue 20's crash (scripts/device_train_smoke.sh builds it
// twice: linked as CMake linked `colossus` before the fix, libtorch ahead of
// libstdc++, and as now, libstdc++ first): which library's
// std::filesystem::remove_all a torch-linked program calls, and whether
// removing a checkpoint-like tree with it survives.
#include <dlfcn.h>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <ATen/core/Tensor.h>
#include <ATen/ops/ones.h>
namespace fs = std::filesystem;
int main() {
  auto t = at::ones({2});  // keep libtorch_cpu needed
  Dl_info info{};
  using Fn = std::uintmax_t (*)(const fs::path&, std::error_code&);
  Fn fn = &fs::remove_all;
  dladdr(reinterpret_cast<void*>(fn), &info);
  std::printf("remove_all(path, ec) from %s\n", info.dli_fname);
  const fs::path root = fs::temp_directory_path() / "colossus_remove_all_repro";
  for (int i = 0; i < 3; ++i) {
    fs::create_directories(root / "step" / "model" / "sub");
    std::ofstream(root / "step" / "model" / "a.safetensors") << "x";
    std::ofstream(root / "step" / "train_state.json") << "{}";
    std::error_code ec;
    auto n = fs::remove_all(root / "step", ec);
    std::printf("round %d: removed %ju entries, ec=%s\n", i, n, ec.message().c_str());
  }
  std::printf("ok %f\n", t.sum().item<float>());
}

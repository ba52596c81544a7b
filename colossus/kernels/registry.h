// The kernels compiled into this build, each with a self-test that runs it on
// fresh random inputs against its reference path (used by `colossus check`).
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace colossus::kernels {

struct KernelCheck {
  std::string name;    // e.g. "scale_and_check_finite/cuda"
  std::string device;  // "cpu" or "cuda"
  // Returns an empty string on success, else what differed.
  std::function<std::string()> self_test;
};

void register_kernel(KernelCheck check);
const std::vector<KernelCheck>& registered_kernels();

}  // namespace colossus::kernels

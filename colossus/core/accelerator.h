// What accelerator this process sees, reported by the CUDA library when it is
// linked in (CPU builds report none). Used by `colossus check` and the trainer.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace colossus {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
  int multiprocessors = 0;
};

struct AcceleratorInfo {
  std::map<std::string, std::string> versions;  // "CUDA runtime", "CUDA driver", "cuDNN", "NCCL"
  std::vector<DeviceInfo> devices;
  std::string error;  // set when the runtime is present but unusable (no driver, ...)
};

void register_accelerator_probe(std::function<AcceleratorInfo()> probe);
// nullopt in builds without CUDA.
std::optional<AcceleratorInfo> probe_accelerator();

}  // namespace colossus

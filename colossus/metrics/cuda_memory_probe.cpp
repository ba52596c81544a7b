// CUDA builds only (in the colossus_cuda bundle): fills the device-memory
// slots (the figures and the peak reset), so progress lines show the caching
// allocator's figures for this rank's GPU, and Gemini's auto policy its peaks,
// while the CPU libraries stay free of CUDA headers.
#include "colossus/metrics/memory.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

namespace colossus::metrics {

namespace {

std::optional<DeviceMemory> cuda_memory() {
  if (c10::cuda::device_count() == 0) return std::nullopt;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
  constexpr auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
  return DeviceMemory{.allocated_bytes = stats.allocated_bytes[all].current,
                               .reserved_bytes = stats.reserved_bytes[all].current,
                               .peak_allocated_bytes = stats.allocated_bytes[all].peak,
                               .free_bytes = static_cast<int64_t>(free_bytes),
                               .total_bytes = static_cast<int64_t>(total_bytes)};
}

void reset_cuda_peak() {
  if (c10::cuda::device_count() == 0) return;
  c10::cuda::CUDACachingAllocator::resetPeakStats(c10::cuda::current_device());
}

[[maybe_unused]] const bool registered = [] {
  set_device_memory_probe(cuda_memory);
  set_device_memory_peak_reset(reset_cuda_peak);
  return true;
}();

}  // namespace

}  // namespace colossus::metrics

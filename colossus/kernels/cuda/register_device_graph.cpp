// CUDA graphs for the engine's decode steps: at::cuda::CUDAGraph behind the
// DeviceGraph interface, registered in cuda_slots().make_device_graph. Its
// self-test runs the engine, so it lives in the inference layer
// (inference/engine/cuda_graph_check.cpp).
#include "colossus/kernels/cuda_slots.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace colossus::kernels {

namespace {

class CudaDeviceGraph final : public DeviceGraph {
 public:
  // Capture may not run on the legacy default stream: a side stream of its own.
  explicit CudaDeviceGraph(int device_index)
      : device_(static_cast<c10::DeviceIndex>(device_index)),
        side_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_)) {}

  void capture(const std::function<void()>& body) override {
    c10::cuda::CUDAGuard device_guard(device_);
    c10::cuda::device_synchronize();
    {
      c10::cuda::CUDAStreamGuard stream_guard(side_);
      graph_.capture_begin();
      try {
        body();
      } catch (...) {
        // End the broken capture so the stream and the allocator return to
        // normal work; the body's error is the one worth reporting.
        try {
          graph_.capture_end();
        } catch (...) {
        }
        graph_.reset();
        throw;
      }
      graph_.capture_end();
    }
    c10::cuda::device_synchronize();
  }

  void run_on_capture_stream(const std::function<void()>& body) override {
    c10::cuda::CUDAGuard device_guard(device_);
    c10::cuda::device_synchronize();
    {
      c10::cuda::CUDAStreamGuard stream_guard(side_);
      body();
    }
    c10::cuda::device_synchronize();
  }

  void replay() override {
    c10::cuda::CUDAGuard device_guard(device_);
    graph_.replay();
  }

 private:
  c10::DeviceIndex device_;
  c10::cuda::CUDAStream side_;
  at::cuda::CUDAGraph graph_;
};

std::unique_ptr<DeviceGraph> make_cuda_graph(int device_index) { return std::make_unique<CudaDeviceGraph>(device_index); }

[[maybe_unused]] const bool registered = [] {
  cuda_slots().make_device_graph = make_cuda_graph;
  return true;
}();

}  // namespace

}  // namespace colossus::kernels

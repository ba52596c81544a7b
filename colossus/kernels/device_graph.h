// A captured sequence of device work replayed with one launch (CUDA graphs),
// behind an interface the CPU libraries can hold: the CUDA build fills
// cuda_slots().make_device_graph; a CPU build leaves it null.
#pragma once
#include <functional>
#include <memory>

namespace colossus::kernels {

class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  // Records everything `body` launches on the device (on a side stream; the
  // tensors it allocates live in the graph's memory pool and keep their
  // addresses). Synchronises the device before and after.
  virtual void capture(const std::function<void()>& body) = 0;
  // Runs `body` eagerly on the stream capture() records on (synchronising
  // before and after): a warm-up there lets per-stream state (cuBLAS
  // workspaces) come into being outside the capture.
  virtual void run_on_capture_stream(const std::function<void()>& body) = 0;
  // Launches the recorded work on the current stream (asynchronous).
  virtual void replay() = 0;
};

using MakeDeviceGraphFn = std::unique_ptr<DeviceGraph> (*)(int device_index);

}  // namespace colossus::kernels

#include "colossus/amp/unscale.h"

#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/scale.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <atomic>

#include <map>

namespace colossus::amp {

bool unscale_and_check_finite(const std::vector<at::Tensor>& tensors, double inv_scale) {
  at::NoGradGuard no_grad;
  const float scale = static_cast<float>(inv_scale);
  bool nonfinite = false;
  std::map<int, std::pair<std::vector<float*>, std::vector<int64_t>>> cuda_by_device;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    const bool fused = t.scalar_type() == at::kFloat && t.is_contiguous();
    if (fused && t.is_cpu()) {
      // Offloaded master gradients run to billions of values: every core.
      std::atomic<bool> bad{false};
      float* data = t.data_ptr<float>();
      at::parallel_for(0, t.numel(), int64_t{1} << 18, [&](int64_t begin, int64_t end) {
        if (kernels::scale_and_check_finite_cpu(data + begin, end - begin, scale)) bad = true;
      });
      nonfinite |= bad.load();
    } else if (fused && t.is_cuda() && kernels::cuda_slots().scale_and_check_finite != nullptr) {
      auto& [data, numel] = cuda_by_device[t.get_device()];
      data.push_back(t.data_ptr<float>());
      numel.push_back(t.numel());
    } else {
      nonfinite |= !at::isfinite(t).all().item<bool>();
      t.mul_(inv_scale);
    }
  }
  for (const auto& [device, buffers] : cuda_by_device) {
    nonfinite |= kernels::cuda_slots().scale_and_check_finite(
        buffers.first.data(), buffers.second.data(), static_cast<int64_t>(buffers.first.size()), scale, device);
  }
  return nonfinite;
}

}  // namespace colossus::amp

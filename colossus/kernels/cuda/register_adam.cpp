// Connects the CUDA Adam and scale/check kernels to the layers built without
// CUDA (cuda_slots.h), and registers the CUDA Adam self-test for
// `colossus check`: random tensors of awkward sizes, spread over two launch
// tables, against the CPU reference bit for bit.
#include "colossus/kernels/adam.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/registry.h"
#include "colossus/kernels/scale.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/format.h>

namespace colossus::kernels {

namespace {

void cuda_adam(const AdamTensorPtrs* tensors, int64_t count, const AdamHyper& hyper, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  adam_step_cuda(tensors, count, hyper, at::cuda::getCurrentCUDAStream(device_index).stream());
}

void cuda_adam_mixed(const AdamMixedPtrs* tensors, int64_t count, const AdamHyper& hyper, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  adam_step_mixed_cuda(tensors, count, hyper, at::cuda::getCurrentCUDAStream(device_index).stream());
}

void cuda_adam_mixed_device(const AdamMixedPtrs* tensors, int64_t count, const AdamGroupConstants& c, const double* lr,
                            const int64_t* counters, const int32_t* skip, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  adam_step_mixed_device_cuda(tensors, count, c, lr, counters, skip,
                              at::cuda::getCurrentCUDAStream(device_index).stream());
}

void cuda_adam_device_finish(int64_t* counters, int32_t* skip, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  adam_device_step_finish_cuda(counters, skip, at::cuda::getCurrentCUDAStream(device_index).stream());
}

void cuda_nonfinite_bf16_into(const void* const* data, const int64_t* numel, int64_t count, int32_t* flag,
                              int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  bf16_nonfinite_check_cuda(data, numel, count, flag, at::cuda::getCurrentCUDAStream(device_index).stream());
}

bool cuda_nonfinite_bf16(const void* const* data, const int64_t* numel, int64_t count, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  auto flag = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(at::kCUDA, device_index));
  bf16_nonfinite_check_cuda(data, numel, count, flag.data_ptr<int32_t>(),
                            at::cuda::getCurrentCUDAStream(device_index).stream());
  return flag.item<int32_t>() != 0;  // the one synchronisation
}

bool cuda_scale_and_check(float* const* data, const int64_t* numel, int64_t count, float scale, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  auto flag = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(at::kCUDA, device_index));
  auto stream = at::cuda::getCurrentCUDAStream(device_index);
  for (int64_t i = 0; i < count; ++i) {
    scale_and_check_finite_cuda(data[i], numel[i], scale, flag.data_ptr<int32_t>(), stream.stream());
  }
  return flag.item<int32_t>() != 0;  // the one synchronisation
}

std::string check_adam_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  // 40 tensors (over the 32-entry table) and one of > 320 chunks of 64K.
  std::vector<int64_t> sizes = {1, 3, 4, 5, 1023, 65536, 65537, 321 * 65536 + 7};
  for (int i = 0; i < 32; ++i) sizes.push_back(17 * i + 1);
  for (bool decoupled : {true, false}) {
    const AdamHyper h = make_adam_hyper(1e-3, 0.9, 0.95, 1e-8, 0.1, decoupled, true, 5);
    std::vector<at::Tensor> host_p, host_g, host_m, host_v, dev_p, dev_g, dev_m, dev_v;
    std::vector<AdamTensorPtrs> dev_table;
    for (int64_t n : sizes) {
      host_p.push_back(at::randn({n}));
      host_g.push_back(at::randn({n}) * 1e-2);
      host_m.push_back(at::randn({n}) * 1e-3);
      host_v.push_back(at::rand({n}) * 1e-4);
      dev_p.push_back(host_p.back().cuda());
      dev_g.push_back(host_g.back().cuda());
      dev_m.push_back(host_m.back().cuda());
      dev_v.push_back(host_v.back().cuda());
      dev_table.push_back({dev_p.back().data_ptr<float>(), dev_g.back().data_ptr<float>(),
                           dev_m.back().data_ptr<float>(), dev_v.back().data_ptr<float>(), n});
    }
    cuda_adam(dev_table.data(), static_cast<int64_t>(dev_table.size()), h, 0);
    for (size_t i = 0; i < sizes.size(); ++i) {
      adam_step_reference({host_p[i].data_ptr<float>(), host_g[i].data_ptr<float>(), host_m[i].data_ptr<float>(),
                           host_v[i].data_ptr<float>(), sizes[i]},
                          h);
      if (!at::equal(dev_p[i].cpu(), host_p[i]) || !at::equal(dev_m[i].cpu(), host_m[i]) ||
          !at::equal(dev_v[i].cpu(), host_v[i])) {
        return fmt::format("tensor {} ({} elements, decoupled={}) differs from the CPU reference", i, sizes[i],
                           decoupled);
      }
    }
  }
  return {};
}

// The mixed form against the reference on float(bf16 grad), bit for bit, and
// the bf16 copy against round-to-nearest of the reference master. Sizes span
// the vector and scalar paths, misaligned views and several launches.
std::string check_adam_mixed_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  std::vector<int64_t> sizes = {1, 3, 4, 5, 1023, 65536, 65537, 257 * 65536 + 3};
  for (int i = 0; i < 34; ++i) sizes.push_back(13 * i + 2);
  const AdamHyper h = make_adam_hyper(1e-3, 0.9, 0.95, 1e-8, 0.1, true, true, 3);
  std::vector<at::Tensor> host_p, host_g, host_m, host_v, dev_p, dev_g, dev_m, dev_v, dev_low;
  std::vector<AdamMixedPtrs> table;
  for (int64_t n : sizes) {
    host_p.push_back(at::randn({n}));
    host_g.push_back((at::randn({n}) * 1e-2).to(at::kBFloat16));
    host_m.push_back(at::randn({n}) * 1e-3);
    host_v.push_back(at::rand({n}) * 1e-4);
    dev_p.push_back(host_p.back().cuda());
    // One element in: a 2-byte offset, so the bf16 pointers are misaligned.
    dev_g.push_back(at::cat({at::zeros({1}, at::kBFloat16), host_g.back()}).cuda().narrow(0, 1, n));
    dev_m.push_back(host_m.back().cuda());
    dev_v.push_back(host_v.back().cuda());
    dev_low.push_back(at::full({n + 1}, NAN, at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA)).narrow(0, 1, n));
    table.push_back({dev_p.back().data_ptr<float>(), dev_g.back().data_ptr(), dev_m.back().data_ptr<float>(),
                     dev_v.back().data_ptr<float>(), dev_low.back().data_ptr(), n});
  }
  // Half the table aligned: the small sizes get fresh aligned buffers.
  for (size_t i = 0; i < sizes.size(); i += 2) {
    dev_g[i] = host_g[i].cuda();
    dev_low[i] = at::full({sizes[i]}, NAN, at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA));
    table[i].grad_bf16 = dev_g[i].data_ptr();
    table[i].param_bf16 = dev_low[i].data_ptr();
  }
  // The overflow check over the same (finite) gradients, then with one inf
  // and one NaN planted past the first launch's 32 tensors.
  std::vector<const void*> grads;
  for (const auto& t : table) grads.push_back(t.grad_bf16);
  const int64_t count = static_cast<int64_t>(sizes.size());
  if (cuda_nonfinite_bf16(grads.data(), sizes.data(), count, 0)) return "nonfinite_bf16 flagged finite gradients";
  for (float bad : {INFINITY, NAN}) {
    at::Tensor saved = dev_g[35].clone();
    dev_g[35][dev_g[35].numel() - 1] = bad;
    const bool flagged = cuda_nonfinite_bf16(grads.data(), sizes.data(), count, 0);
    dev_g[35].copy_(saved);
    if (!flagged) return fmt::format("nonfinite_bf16 missed a planted {}", bad);
  }
  cuda_adam_mixed(table.data(), static_cast<int64_t>(table.size()), h, 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const at::Tensor g = host_g[i].to(at::kFloat);
    adam_step_reference({host_p[i].data_ptr<float>(), g.data_ptr<float>(), host_m[i].data_ptr<float>(),
                         host_v[i].data_ptr<float>(), sizes[i]},
                        h);
    if (!at::equal(dev_p[i].cpu(), host_p[i]) || !at::equal(dev_m[i].cpu(), host_m[i]) ||
        !at::equal(dev_v[i].cpu(), host_v[i]) || !at::equal(dev_low[i].cpu(), host_p[i].to(at::kBFloat16))) {
      return fmt::format("tensor {} ({} elements) differs from the CPU reference", i, sizes[i]);
    }
  }
  return {};
}

// The device-counted step against the host-constant one, bit for bit, over
// three steps with three lrs and a skipped step between them: same masters,
// moments and bf16 copies, counters (steps, skipped, last skipped) = (3, 1, 0)
// and skip cleared.
std::string check_adam_mixed_device_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const std::vector<int64_t> sizes = {1, 5, 1023, 65537, 70 * 65536 + 3};
  const AdamGroupConstants c{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  struct Copy {
    std::vector<at::Tensor> p, m, v, low;
    std::vector<AdamMixedPtrs> table;
  };
  std::vector<at::Tensor> grads;
  for (int64_t n : sizes) grads.push_back((at::randn({n}, cuda) * 1e-2).to(at::kBFloat16));
  auto make_copy = [&] {
    Copy copy;
    at::manual_seed(11);
    for (size_t i = 0; i < sizes.size(); ++i) {
      copy.p.push_back(at::randn({sizes[i]}, cuda));
      copy.m.push_back(at::randn({sizes[i]}, cuda) * 1e-3);
      copy.v.push_back(at::rand({sizes[i]}, cuda) * 1e-4);
      copy.low.push_back(at::empty({sizes[i]}, cuda.dtype(at::kBFloat16)));
      copy.table.push_back({copy.p[i].data_ptr<float>(), grads[i].data_ptr(), copy.m[i].data_ptr<float>(),
                            copy.v[i].data_ptr<float>(), copy.low[i].data_ptr(), sizes[i]});
    }
    return copy;
  };
  Copy host = make_copy(), device = make_copy();
  auto lr = at::empty({1}, cuda.dtype(at::kDouble));
  auto counters = at::zeros({3}, cuda.dtype(at::kLong));
  auto skip = at::zeros({1}, cuda.dtype(at::kInt));
  const auto count = static_cast<int64_t>(sizes.size());
  int64_t host_step = 0;
  for (const auto& [step_lr, skipped] : std::vector<std::pair<double, bool>>{{1e-3, false}, {5e-4, true}, {5e-4, false},
                                                                             {2e-4, false}}) {
    lr.fill_(step_lr);
    if (skipped) skip.fill_(1);
    cuda_adam_mixed_device(device.table.data(), count, c, lr.data_ptr<double>(), counters.data_ptr<int64_t>(),
                           skip.data_ptr<int32_t>(), 0);
    cuda_adam_device_finish(counters.data_ptr<int64_t>(), skip.data_ptr<int32_t>(), 0);
    if (skipped) continue;
    const AdamHyper h = make_adam_hyper(step_lr, c.beta1, c.beta2, c.eps, c.weight_decay, true, true, ++host_step);
    cuda_adam_mixed(host.table.data(), count, h, 0);
  }
  const auto got = counters.cpu();
  if (got[0].item<int64_t>() != 3 || got[1].item<int64_t>() != 1 || got[2].item<int64_t>() != 0 ||
      skip.item<int32_t>() != 0) {
    return fmt::format("device counters (steps, skipped, last skipped, skip) = ({}, {}, {}, {}), expected (3, 1, 0, 0)",
                       got[0].item<int64_t>(), got[1].item<int64_t>(), got[2].item<int64_t>(), skip.item<int32_t>());
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (!at::equal(host.p[i], device.p[i]) || !at::equal(host.m[i], device.m[i]) ||
        !at::equal(host.v[i], device.v[i]) || !at::equal(host.low[i], device.low[i])) {
      return fmt::format("tensor {} ({} elements): the device-counted step differs from the host-constant one", i,
                         sizes[i]);
    }
  }
  return {};
}

const bool registered = [] {
  cuda_slots().adam = cuda_adam;
  cuda_slots().adam_mixed = cuda_adam_mixed;
  cuda_slots().nonfinite_bf16 = cuda_nonfinite_bf16;
  cuda_slots().adam_mixed_device = cuda_adam_mixed_device;
  cuda_slots().adam_device_finish = cuda_adam_device_finish;
  cuda_slots().nonfinite_bf16_into = cuda_nonfinite_bf16_into;
  register_kernel({"adam_mixed_device", "cuda", check_adam_mixed_device_cuda});
  register_kernel({"adam_mixed_bf16", "cuda", check_adam_mixed_cuda});
  cuda_slots().scale_and_check_finite = cuda_scale_and_check;
  register_kernel({"adam", "cuda", check_adam_cuda});
  return true;
}();

}  // namespace

}  // namespace colossus::kernels

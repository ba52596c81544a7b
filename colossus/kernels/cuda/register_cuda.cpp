// Registers what the CUDA build adds: the accelerator probe (devices, CUDA,
// cuDNN and NCCL versions) and a self-test of each CUDA kernel against its
// CPU reference, for `colossus check`.
#include "colossus/core/accelerator.h"
#include "colossus/kernels/registry.h"
#include "colossus/kernels/scale.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

namespace colossus::kernels {

namespace {

std::string version_string(int v, int major_div, int minor_div) {
  return fmt::format("{}.{}", v / major_div, (v % major_div) / minor_div);
}

AcceleratorInfo probe_cuda() {
  AcceleratorInfo info;
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  info.versions["CUDA runtime"] = version_string(runtime, 1000, 10);
  info.versions["CUDA driver"] = driver ? version_string(driver, 1000, 10) : "none";
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) {
    info.versions["NCCL"] = fmt::format("{}.{}.{}", nccl / 10000, (nccl % 10000) / 100, nccl % 100);
  }
  long cudnn = at::detail::getCUDAHooks().versionCuDNN();
  if (cudnn > 0) info.versions["cuDNN"] = fmt::format("{}.{}.{}", cudnn / 10000, (cudnn % 10000) / 100, cudnn % 100);
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    info.error = cudaGetErrorString(status);
    return info;
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, d);
    size_t free_bytes = 0, total_bytes = 0;
    cudaSetDevice(d);
    cudaMemGetInfo(&free_bytes, &total_bytes);
    info.devices.push_back({d, prop.name, static_cast<int64_t>(total_bytes), static_cast<int64_t>(free_bytes),
                            prop.major, prop.minor, prop.multiProcessorCount});
  }
  return info;
}

// Fresh random input with planted inf, poisoned output compared to the CPU
// reference; NaN in the result never passes.
std::string check_scale_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  auto host = at::randn({1 << 20});
  host[12345] = std::numeric_limits<float>::infinity();
  auto expected = host.clone();
  bool ref_bad = scale_and_check_finite_cpu(expected.data_ptr<float>(), expected.numel(), 0.25f);
  auto device = host.cuda();
  auto flag = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(at::kCUDA));
  auto stream = at::cuda::getCurrentCUDAStream();
  scale_and_check_finite_cuda(device.data_ptr<float>(), device.numel(), 0.25f, flag.data_ptr<int32_t>(), stream.stream());
  auto got = device.cpu();
  bool bad = flag.item<int32_t>() != 0;
  if (bad != ref_bad) return fmt::format("non-finite flag {} but reference says {}", bad, ref_bad);
  auto finite = expected.isfinite();
  if (!at::equal(got.masked_select(finite), expected.masked_select(finite))) return "scaled values differ from reference";
  return {};
}

const bool registered = [] {
  register_accelerator_probe(probe_cuda);
  register_kernel({"scale_and_check_finite", "cuda", check_scale_cuda});
  return true;
}();

}  // namespace

}  // namespace colossus::kernels

// Connects the paged-attention kernels (kernels/paged_attention.h) to the
// inference layer through cuda_slots.h (device guard, current stream,
// workspace). Their `colossus check` self-tests compare against the inference
// layer's reference, so they live there
// (inference/attention/paged_attention_cuda_check.cpp).
#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/paged_attention.h"
#include "colossus/kernels/rope_cache.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace colossus::kernels {

namespace {

bool cuda_paged_attention(const PagedAttentionArgs& args, int device_index) {
  if (!paged_attention_cuda_supports(args)) return false;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  PagedAttentionArgs a = args;
  a.num_sms = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device_index))->multiProcessorCount;
  at::Tensor workspace;  // stream-ordered: reuse by a later allocation waits for these kernels
  if (const size_t bytes = paged_attention_workspace_bytes(a); bytes > 0) {
    workspace = at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(
                                                             at::kCUDA, static_cast<c10::DeviceIndex>(device_index)));
    a.workspace = workspace.data_ptr();
  }
  paged_attention_cuda(a, at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_index)).stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

bool cuda_reshape_and_cache(const ReshapeAndCacheArgs& args, int device_index) {
  if (!reshape_and_cache_cuda_supports(args)) return false;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  reshape_and_cache_cuda(args, at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_index)).stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

bool cuda_rope_qkv_cache(const RopeQkvCacheArgs& args, int device_index) {
  if (!rope_qkv_cache_cuda_supports(args)) return false;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  rope_qkv_cache_cuda(args, at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_index)).stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

[[maybe_unused]] const bool registered = [] {
  cuda_slots().paged_attention = cuda_paged_attention;
  cuda_slots().reshape_and_cache = cuda_reshape_and_cache;
  cuda_slots().paged_attention_head_dim = paged_attention_cuda_handles_head_dim;
  cuda_slots().rope_qkv_cache = cuda_rope_qkv_cache;
  return true;
}();

}  // namespace

}  // namespace colossus::kernels

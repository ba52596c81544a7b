// Entry points to CUDA kernels for layers built without CUDA (optim, amp).
// The CUDA build fills them at start-up (colossus_cuda, linked whole-archive,
// registers them); in a CPU build they stay null and callers report that the
// build has no CUDA kernels. This keeps the CPU libraries free of #ifdef.
#pragma once
#include "colossus/kernels/adam.h"
#include "colossus/kernels/cross_entropy.h"
#include "colossus/kernels/device_graph.h"
#include "colossus/kernels/fp8_quantize.h"
#include "colossus/kernels/gemv.h"
#include "colossus/kernels/moe_permute.h"
#include "colossus/kernels/nf4.h"
#include "colossus/kernels/norm.h"
#include "colossus/kernels/paged_attention.h"
#include "colossus/kernels/rope.h"
#include "colossus/kernels/rope_cache.h"
#include "colossus/kernels/swiglu.h"

#include <cstdint>

namespace colossus::kernels {

// Fused Adam over `count` tensors, all on CUDA device `device_index`, on that
// device's current stream (asynchronous).
using CudaAdamFn = void (*)(const AdamTensorPtrs* tensors, int64_t count, const AdamHyper& hyper, int device_index);
// Fused mixed-precision Adam (AdamMixedPtrs), same conventions.
using CudaAdamMixedFn = void (*)(const AdamMixedPtrs* tensors, int64_t count, const AdamHyper& hyper,
                                 int device_index);

// The graph-capturable forms (adam.h: adam_step_mixed_device_cuda,
// adam_device_step_finish_cuda, bf16_nonfinite_check_cuda into a device
// flag): nothing is read back to the host, so a captured step never waits.
using CudaAdamMixedDeviceFn = void (*)(const AdamMixedPtrs* tensors, int64_t count, const AdamGroupConstants& c,
                                       const double* lr, const int64_t* counters, const int32_t* skip,
                                       int device_index);
using CudaAdamDeviceFinishFn = void (*)(int64_t* counters, int32_t* skip, int device_index);
using CudaNonfiniteBf16IntoFn = void (*)(const void* const* data, const int64_t* numel, int64_t count, int32_t* flag,
                                         int device_index);

// Whether any of `count` bf16 device buffers holds an inf or NaN
// (synchronises the device's current stream once, at the end).
using CudaNonfiniteBf16Fn = bool (*)(const void* const* data, const int64_t* numel, int64_t count, int device_index);

// Multiplies each of `count` fp32 device buffers by `scale` in place and
// returns whether any input value was inf/NaN (synchronises the device's
// current stream once, at the end).
using CudaScaleCheckFn = bool (*)(float* const* data, const int64_t* numel, int64_t count, float scale,
                                  int device_index);

// Paged attention / KV-cache write (paged_attention.h) on CUDA device
// `device_index`, on that device's current stream (asynchronous; the slot
// fills num_sms and allocates the workspace). Return false, launching
// nothing, when the kernels do not handle the arguments: use the reference.
using CudaPagedAttentionFn = bool (*)(const PagedAttentionArgs& args, int device_index);
using CudaReshapeAndCacheFn = bool (*)(const ReshapeAndCacheArgs& args, int device_index);
// Whether the paged-attention kernels handle this head size at all (callers
// that must be sure the kernels run, such as CUDA graph capture, ask first).
using CudaPagedAttentionHeadDimFn = bool (*)(int32_t head_dim);
// RoPE on a packed q/k/v projection with the cache write (rope_cache.h), same
// conventions.
using CudaRopeQkvCacheFn = bool (*)(const RopeQkvCacheArgs& args, int device_index);

// Cross-entropy rows with the gradient in place (cross_entropy.h) on CUDA
// device `device_index`, on its current stream (asynchronous). Returns false,
// launching nothing, when the kernel does not handle the arguments.
using CudaCrossEntropyRowsFn = bool (*)(const CrossEntropyRowsArgs& args, int device_index);

// The fused training-step layers (norm.h, rope.h, swiglu.h) on CUDA device
// `device_index`, on its current stream (asynchronous). Each returns false,
// launching nothing, when its kernel does not handle the arguments. The norm
// backward slot allocates the fp32 partial-sum workspace itself (args.partial
// is ignored).
using CudaNormForwardFn = bool (*)(const NormForwardArgs& args, int device_index);
using CudaNormBackwardFn = bool (*)(const NormBackwardArgs& args, int device_index);
using CudaRopeFn = bool (*)(const RopeArgs& args, int device_index);
using CudaSwigluFn = bool (*)(const SwigluArgs& args, int device_index);
using CudaSwigluPackedFn = bool (*)(const SwigluPackedArgs& args, int device_index);

// MoE token dispatch (moe_permute.h) on CUDA device `device_index`, on its
// current stream (asynchronous). Each returns false, launching nothing, when
// its kernel does not handle the arguments.
using CudaMoeSortFn = bool (*)(const MoeSortArgs& args, int device_index);
using CudaMoePermuteFn = bool (*)(const MoePermuteArgs& args, int device_index);
using CudaMoeUnpermuteFn = bool (*)(const MoeUnpermuteArgs& args, int device_index);
using CudaMoeRowDotFn = bool (*)(const MoeRowDotArgs& args, int device_index);

// QLoRA's NF4 weights (nf4.h) on CUDA device `device_index`, on its current
// stream (asynchronous). Each returns false, launching nothing, when its
// kernel does not handle the arguments.
using CudaNf4DequantizeFn = bool (*)(const Nf4DequantizeArgs& args, int device_index);
using CudaNf4GemvFn = bool (*)(const Nf4GemvArgs& args, int device_index);

// FP8 quantisation of a matmul operand (fp8_quantize.h) on CUDA device
// `device_index`, on its current stream (asynchronous). False, launching
// nothing, when the kernel does not take the arguments.
using CudaFp8QuantizeFn = bool (*)(const Fp8QuantizeArgs& args, int device_index);

// The decode GEMV (gemv.h) on CUDA device `device_index`, on its current
// stream (asynchronous). False, launching nothing, when the kernel does not
// take the arguments.
using CudaGemvFn = bool (*)(const GemvArgs& args, int device_index);

struct CudaSlots {
  CudaAdamFn adam = nullptr;
  CudaAdamMixedFn adam_mixed = nullptr;
  CudaNonfiniteBf16Fn nonfinite_bf16 = nullptr;
  CudaAdamMixedDeviceFn adam_mixed_device = nullptr;
  CudaAdamDeviceFinishFn adam_device_finish = nullptr;
  CudaNonfiniteBf16IntoFn nonfinite_bf16_into = nullptr;
  CudaScaleCheckFn scale_and_check_finite = nullptr;
  CudaCrossEntropyRowsFn cross_entropy_rows = nullptr;
  CudaPagedAttentionFn paged_attention = nullptr;
  CudaReshapeAndCacheFn reshape_and_cache = nullptr;
  CudaPagedAttentionHeadDimFn paged_attention_head_dim = nullptr;
  CudaRopeQkvCacheFn rope_qkv_cache = nullptr;
  MakeDeviceGraphFn make_device_graph = nullptr;
  CudaMoeSortFn moe_sort = nullptr;
  CudaMoePermuteFn moe_permute = nullptr;
  CudaMoeUnpermuteFn moe_unpermute = nullptr;
  CudaMoeRowDotFn moe_row_dot = nullptr;
  CudaNormForwardFn norm_forward = nullptr;
  CudaNormBackwardFn norm_backward = nullptr;
  CudaRopeFn rope = nullptr;
  CudaSwigluFn swiglu_forward = nullptr;
  CudaSwigluFn swiglu_backward = nullptr;
  CudaSwigluPackedFn swiglu_packed_forward = nullptr;
  CudaSwigluPackedFn swiglu_packed_backward = nullptr;
  CudaNf4DequantizeFn nf4_dequantize = nullptr;
  CudaNf4GemvFn nf4_gemv = nullptr;
  CudaGemvFn gemv = nullptr;
  CudaFp8QuantizeFn fp8_quantize = nullptr;
};

CudaSlots& cuda_slots();

}  // namespace colossus::kernels

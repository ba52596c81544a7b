// Multi-tensor fused Adam on CUDA; no torch headers here by design.
// The host packs up to kMaxTensors tensors and kMaxBlocks chunks of
// kChunkElements into one table passed by value as the kernel argument (under
// the classic 4 KB parameter limit), so a model's group needs one launch or a
// few. Every float operation uses an explicit round-to-nearest intrinsic so
// nvcc cannot contract them into FMAs: the result equals the CPU reference
// (adam_step_reference) bit for bit.
#include "colossus/kernels/adam.h"
#include "colossus/kernels/adam_hyper_math.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace colossus::kernels {

namespace {

constexpr int kMaxTensors = 32;
constexpr int kMaxBlocks = 320;
constexpr int64_t kChunkElements = 65536;
constexpr int kThreads = 512;

struct AdamTable {
  float* param[kMaxTensors];
  const float* grad[kMaxTensors];
  float* exp_avg[kMaxTensors];
  float* exp_avg_sq[kMaxTensors];
  int64_t numel[kMaxTensors];
  int32_t block_tensor[kMaxBlocks];  // which table entry block b works on
  int32_t block_chunk[kMaxBlocks];   // and which kChunkElements-sized chunk of it
};
static_assert(sizeof(AdamTable) + sizeof(AdamHyper) <= 4096, "kernel parameters must fit the 4 KB limit");

__device__ __forceinline__ void adam_element(float& p, float g, float& m, float& v, const AdamHyper& h) {
  if (h.weight_decay != 0.0f) {
    if (h.decoupled) {
      p = __fmul_rn(p, h.decay_factor);
    } else {
      g = __fadd_rn(g, __fmul_rn(h.weight_decay, p));
    }
  }
  m = __fadd_rn(__fmul_rn(h.beta1, m), __fmul_rn(h.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(h.beta2, v), __fmul_rn(h.one_minus_beta2, __fmul_rn(g, g)));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), h.bias_correction2_sqrt), h.eps);
  p = __fsub_rn(p, __fmul_rn(h.step_size, __fdiv_rn(m, denom)));
}

__device__ __forceinline__ bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

__global__ void __launch_bounds__(kThreads) adam_multi_tensor_kernel(AdamTable table, AdamHyper h) {
  const int t = table.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kChunkElements;
  const int64_t n = table.numel[t];
  const int64_t end = begin + kChunkElements < n ? begin + kChunkElements : n;
  float* __restrict__ param = table.param[t];
  const float* __restrict__ grad = table.grad[t];
  float* __restrict__ exp_avg = table.exp_avg[t];
  float* __restrict__ exp_avg_sq = table.exp_avg_sq[t];
  // begin is a multiple of kChunkElements (so of 4): the chunk is 16-byte
  // aligned exactly when the tensors are.
  if (aligned16(param) && aligned16(grad) && aligned16(exp_avg) && aligned16(exp_avg_sq)) {
    const int64_t vec_end = begin + (end - begin) / 4 * 4;
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * 4; i < vec_end; i += kThreads * 4) {
      float4 p = *reinterpret_cast<float4*>(param + i);
      const float4 g = *reinterpret_cast<const float4*>(grad + i);
      float4 m = *reinterpret_cast<float4*>(exp_avg + i);
      float4 v = *reinterpret_cast<float4*>(exp_avg_sq + i);
      adam_element(p.x, g.x, m.x, v.x, h);
      adam_element(p.y, g.y, m.y, v.y, h);
      adam_element(p.z, g.z, m.z, v.z, h);
      adam_element(p.w, g.w, m.w, v.w, h);
      *reinterpret_cast<float4*>(param + i) = p;
      *reinterpret_cast<float4*>(exp_avg + i) = m;
      *reinterpret_cast<float4*>(exp_avg_sq + i) = v;
    }
    for (int64_t i = vec_end + threadIdx.x; i < end; i += kThreads) {
      adam_element(param[i], grad[i], exp_avg[i], exp_avg_sq[i], h);
    }
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
      adam_element(param[i], grad[i], exp_avg[i], exp_avg_sq[i], h);
    }
  }
}

// The mixed-precision table has two more pointer arrays, so fewer blocks per
// launch keep it under the same 4 KB.
constexpr int kMaxMixedBlocks = 256;

struct AdamMixedTable {
  float* param[kMaxTensors];
  const __nv_bfloat16* grad[kMaxTensors];
  float* exp_avg[kMaxTensors];
  float* exp_avg_sq[kMaxTensors];
  __nv_bfloat16* param_bf16[kMaxTensors];
  int64_t numel[kMaxTensors];
  int32_t block_tensor[kMaxMixedBlocks];
  int32_t block_chunk[kMaxMixedBlocks];
};
static_assert(sizeof(AdamMixedTable) + sizeof(AdamHyper) <= 4096, "kernel parameters must fit the 4 KB limit");
static_assert(sizeof(AdamMixedTable) + sizeof(AdamGroupConstants) + 3 * sizeof(void*) <= 4096,
              "kernel parameters must fit the 4 KB limit");

__device__ __forceinline__ void adam_mixed_block(const AdamMixedTable& table, const AdamHyper& h) {
  const int t = table.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kChunkElements;
  const int64_t n = table.numel[t];
  const int64_t end = begin + kChunkElements < n ? begin + kChunkElements : n;
  float* __restrict__ param = table.param[t];
  const __nv_bfloat16* __restrict__ grad = table.grad[t];
  float* __restrict__ exp_avg = table.exp_avg[t];
  float* __restrict__ exp_avg_sq = table.exp_avg_sq[t];
  __nv_bfloat16* __restrict__ model = table.param_bf16[t];
  // 4 elements per thread: 16-byte fp32 and 8-byte bf16 accesses when aligned.
  const bool vec = aligned16(param) && aligned16(exp_avg) && aligned16(exp_avg_sq) &&
                   (reinterpret_cast<uintptr_t>(grad) & 7u) == 0 && (reinterpret_cast<uintptr_t>(model) & 7u) == 0;
  int64_t scalar_begin = begin;
  if (vec) {
    const int64_t vec_end = begin + (end - begin) / 4 * 4;
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * 4; i < vec_end; i += kThreads * 4) {
      float4 p = *reinterpret_cast<float4*>(param + i);
      const uint2 graw = *reinterpret_cast<const uint2*>(grad + i);
      const __nv_bfloat16* g = reinterpret_cast<const __nv_bfloat16*>(&graw);
      float4 m = *reinterpret_cast<float4*>(exp_avg + i);
      float4 v = *reinterpret_cast<float4*>(exp_avg_sq + i);
      adam_element(p.x, __bfloat162float(g[0]), m.x, v.x, h);
      adam_element(p.y, __bfloat162float(g[1]), m.y, v.y, h);
      adam_element(p.z, __bfloat162float(g[2]), m.z, v.z, h);
      adam_element(p.w, __bfloat162float(g[3]), m.w, v.w, h);
      *reinterpret_cast<float4*>(param + i) = p;
      *reinterpret_cast<float4*>(exp_avg + i) = m;
      *reinterpret_cast<float4*>(exp_avg_sq + i) = v;
      uint2 out;
      __nv_bfloat16* o = reinterpret_cast<__nv_bfloat16*>(&out);
      o[0] = __float2bfloat16_rn(p.x);
      o[1] = __float2bfloat16_rn(p.y);
      o[2] = __float2bfloat16_rn(p.z);
      o[3] = __float2bfloat16_rn(p.w);
      *reinterpret_cast<uint2*>(model + i) = out;
    }
    scalar_begin = vec_end;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < end; i += kThreads) {
    adam_element(param[i], __bfloat162float(grad[i]), exp_avg[i], exp_avg_sq[i], h);
    model[i] = __float2bfloat16_rn(param[i]);
  }
}

__global__ void __launch_bounds__(kThreads) adam_mixed_multi_tensor_kernel(AdamMixedTable table, AdamHyper h) {
  adam_mixed_block(table, h);
}

// lr and the step count from device memory; every thread folds the
// constants itself (make_adam_hyper's few double operations: cheaper than a
// shared-memory broadcast and identical in every thread).
__global__ void __launch_bounds__(kThreads)
    adam_mixed_device_kernel(AdamMixedTable table, AdamGroupConstants c, const double* lr, const int64_t* counters,
                             const int32_t* skip) {
  if (*skip != 0) return;
  const AdamHyper h = fold_adam_hyper(*lr, c, counters[0] + 1);
  adam_mixed_block(table, h);
}

__global__ void adam_device_step_finish_kernel(int64_t* counters, int32_t* skip) {
  const bool skipped = *skip != 0;
  counters[skipped ? 1 : 0] += 1;
  counters[2] = skipped ? 1 : 0;
  *skip = 0;
}

// Packs AdamMixedPtrs into launch tables (a tensor whose chunks span two
// launches gets an entry in each) and calls launch(table, blocks) per table.
template <typename Launch>
void for_each_mixed_table(const AdamMixedPtrs* tensors, int64_t count, const Launch& launch) {
  AdamMixedTable table;
  int entries = 0, blocks = 0;
  auto flush = [&] {
    if (blocks > 0) launch(table, blocks);
    entries = 0;
    blocks = 0;
  };
  for (int64_t i = 0; i < count; ++i) {
    const AdamMixedPtrs& t = tensors[i];
    if (t.numel == 0) continue;
    const int64_t chunks = (t.numel + kChunkElements - 1) / kChunkElements;
    for (int64_t c = 0; c < chunks; ++c) {
      if (c == 0 || blocks == 0) {
        if (entries == kMaxTensors) flush();
        table.param[entries] = t.param;
        table.grad[entries] = static_cast<const __nv_bfloat16*>(t.grad_bf16);
        table.exp_avg[entries] = t.exp_avg;
        table.exp_avg_sq[entries] = t.exp_avg_sq;
        table.param_bf16[entries] = static_cast<__nv_bfloat16*>(t.param_bf16);
        table.numel[entries] = t.numel;
        ++entries;
      }
      table.block_tensor[blocks] = entries - 1;
      table.block_chunk[blocks] = static_cast<int32_t>(c);
      ++blocks;
      if (blocks == kMaxMixedBlocks) flush();
    }
  }
  flush();
}

struct CheckTable {
  const __nv_bfloat16* data[kMaxTensors];
  int64_t numel[kMaxTensors];
  int32_t block_tensor[kMaxBlocks];
  int32_t block_chunk[kMaxBlocks];
};

__global__ void __launch_bounds__(kThreads) bf16_nonfinite_kernel(CheckTable table, int32_t* found) {
  const int t = table.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kChunkElements;
  const int64_t n = table.numel[t];
  const int64_t end = begin + kChunkElements < n ? begin + kChunkElements : n;
  const __nv_bfloat16* __restrict__ data = table.data[t];
  bool bad = false;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const float v = __bfloat162float(data[i]);
    bad |= !isfinite(v);
  }
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x % 32) == 0) *found = 1;
}

}  // namespace

void bf16_nonfinite_check_cuda(const void* const* data, const int64_t* numel, int64_t count, int32_t* found_nonfinite,
                               void* stream) {
  CheckTable table;
  int entries = 0, blocks = 0;
  auto launch = [&] {
    if (blocks > 0) {
      bf16_nonfinite_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(table, found_nonfinite);
    }
    entries = 0;
    blocks = 0;
  };
  for (int64_t i = 0; i < count; ++i) {
    if (numel[i] == 0) continue;
    const int64_t chunks = (numel[i] + kChunkElements - 1) / kChunkElements;
    for (int64_t c = 0; c < chunks; ++c) {
      if (c == 0 || blocks == 0) {
        if (entries == kMaxTensors) launch();
        table.data[entries] = static_cast<const __nv_bfloat16*>(data[i]);
        table.numel[entries] = numel[i];
        ++entries;
      }
      table.block_tensor[blocks] = entries - 1;
      table.block_chunk[blocks] = static_cast<int32_t>(c);
      ++blocks;
      if (blocks == kMaxBlocks) launch();
    }
  }
  launch();
}

void adam_step_mixed_cuda(const AdamMixedPtrs* tensors, int64_t count, const AdamHyper& h, void* stream) {
  for_each_mixed_table(tensors, count, [&](const AdamMixedTable& table, int blocks) {
    adam_mixed_multi_tensor_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(table, h);
  });
}

void adam_step_mixed_device_cuda(const AdamMixedPtrs* tensors, int64_t count, const AdamGroupConstants& c,
                                 const double* lr, const int64_t* counters, const int32_t* skip, void* stream) {
  for_each_mixed_table(tensors, count, [&](const AdamMixedTable& table, int blocks) {
    adam_mixed_device_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(table, c, lr, counters,
                                                                                         skip);
  });
}

void adam_device_step_finish_cuda(int64_t* counters, int32_t* skip, void* stream) {
  adam_device_step_finish_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(counters, skip);
}

void adam_step_cuda(const AdamTensorPtrs* tensors, int64_t count, const AdamHyper& h, void* stream) {
  AdamTable table;
  int entries = 0, blocks = 0;
  auto launch = [&] {
    if (blocks > 0) {
      adam_multi_tensor_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(table, h);
    }
    entries = 0;
    blocks = 0;
  };
  for (int64_t i = 0; i < count; ++i) {
    const AdamTensorPtrs& t = tensors[i];
    if (t.numel == 0) continue;
    const int64_t chunks = (t.numel + kChunkElements - 1) / kChunkElements;
    for (int64_t c = 0; c < chunks; ++c) {
      // A tensor whose chunks span two launches gets an entry in each table.
      if (c == 0 || blocks == 0) {
        if (entries == kMaxTensors) launch();
        table.param[entries] = t.param;
        table.grad[entries] = t.grad;
        table.exp_avg[entries] = t.exp_avg;
        table.exp_avg_sq[entries] = t.exp_avg_sq;
        table.numel[entries] = t.numel;
        ++entries;
      }
      table.block_tensor[blocks] = entries - 1;
      table.block_chunk[blocks] = static_cast<int32_t>(c);
      ++blocks;
      if (blocks == kMaxBlocks) launch();
    }
  }
  launch();
}

}  // namespace colossus::kernels

// Paged-KV-cache attention on CUDA, part 1: writing K/V into cache slots,
// decode attention (q_len == 1) split over the context, the merge of the
// splits, and the host entry points. No torch headers here by design.
//
// Decode (flash-decoding): one thread block per (sequence, G query heads that
// share one KV head, partition of `partition_size` tokens). G = the largest
// power of two <= 8 dividing heads / kv_heads, so GQA loads each K/V row once
// for G heads. Within a block, a row of K/V is read by L threads with 16-byte
// loads (L = head_dim / 16 bytes' worth, a power of two <= 32; 128 / L rows in
// flight, four of them unrolled per thread), q.k is reduced across those L
// lanes by warp shuffles, the partition's logits stay in shared memory, its
// softmax is exact (max, then exp2 and sum), and P.V accumulates in fp32
// registers. A sequence that fits one partition writes its output directly;
// longer ones write (max, sum, unnormalised output) per partition and the
// merge kernel combines them with log-sum-exp rescaling. The partition size
// shrinks from 512 towards 64 tokens until there are about two thread blocks
// per multiprocessor, so a batch of one long sequence still fills the GPU.
// Under a sliding window the partitions tile only the window's span.
#include "colossus/kernels/cuda/paged_attention_common.cuh"

#include <algorithm>

namespace colossus::kernels {

namespace paged {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;            // K/V rows a thread loads before using the first
constexpr int kMaxPartitions = 4096;  // the merge keeps one weight per partition in shared memory
constexpr int kMaxHeadsPerBlock = 8;

// Where a thread reads its part of a K/V row of D elements of T.
template <typename T, int D>
struct RowLayout {
  static constexpr int kVecT = kVec<T>;
  static constexpr int kRowVecs = D / kVecT;  // 16-byte vectors per row
  static constexpr int kLanes = pow2_ceil(kRowVecs) < 32 ? pow2_ceil(kRowVecs) : 32;
  static constexpr int kVecsPerLane = ceil_div(kRowVecs, kLanes);
  static constexpr bool kFull = kRowVecs == kLanes * kVecsPerLane;  // no lane idles (head_dim 80/96 do)
  static constexpr int kRowsInFlight = kThreads / kLanes;
  static_assert(D % kVecT == 0, "rows must be whole 16-byte vectors");
};

struct DecodeWork {
  int32_t partition_size = 0;
  int32_t max_partitions = 0;
  float* part_out = nullptr;  // (num_seqs, heads, max_partitions, head_dim): unnormalised P.V
  float* part_max = nullptr;  // (num_seqs, heads, max_partitions): max logit (log2 units)
  float* part_sum = nullptr;  // (num_seqs, heads, max_partitions): sum of exp2(logit - max)
};

template <typename T, int D, int G>
__global__ void __launch_bounds__(kThreads) paged_decode_kernel(const PagedAttentionArgs a, const DecodeWork w) {
  using L = RowLayout<T, D>;
  // logits [G][partition_size]; after the P.V pass the same space holds the
  // warps' partial outputs [kWarps][G][D].
  extern __shared__ __align__(16) float smem[];
  __shared__ float red[kWarps][G];
  __shared__ float row_max[G], row_sum[G];

  const int seq = blockIdx.x;
  const int q_row = a.query_start[seq];
  if (a.query_start[seq + 1] - q_row != 1) return;
  const int context = a.context_lens[seq];
  // Partitions tile the visible span [first, context): under a sliding window
  // the keys before it are never read.
  const int first = window_start(a.window, context - 1);
  const int tok_begin = first + static_cast<int>(blockIdx.z) * w.partition_size;
  if (tok_begin >= context) return;
  const int tok_end = min(context, tok_begin + w.partition_size);
  const int num_partitions = (context - first + w.partition_size - 1) / w.partition_size;
  const int head0 = static_cast<int>(blockIdx.y) * G;
  const int kv_head = head0 / (a.heads / a.kv_heads);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int row_lane = tid % L::kLanes;  // which vectors of a row this thread handles
  const int row_slot = tid / L::kLanes;  // which of the rows in flight

  // q for the G heads, scaled so that exp2(logit) is the softmax numerator.
  const T* q = static_cast<const T*>(a.q) + static_cast<int64_t>(q_row) * a.q_token_stride +
               static_cast<int64_t>(head0) * a.q_head_stride;
  const float q_scale = a.scale * kLog2e;
  const float cap_log2 = softcap_log2(a);
  float qf[G][L::kVecsPerLane][L::kVecT];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int i = 0; i < L::kVecsPerLane; ++i) {
      const int vec = row_lane + i * L::kLanes;
#pragma unroll
      for (int e = 0; e < L::kVecT; ++e) {
        qf[g][i][e] =
            (L::kFull || vec < L::kRowVecs) ? to_float(q[g * a.q_head_stride + vec * L::kVecT + e]) * q_scale : 0.0f;
      }
    }
  }

  const int64_t block_elems = static_cast<int64_t>(a.kv_heads) * a.block_size * D;
  const int64_t head_offset = static_cast<int64_t>(kv_head) * a.block_size * D;
  const T* k_base = static_cast<const T*>(a.key_cache) + head_offset;
  const T* v_base = static_cast<const T*>(a.value_cache) + head_offset;
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.block_table_stride;
  const auto row_offset = [&](int tok) {
    return static_cast<int64_t>(table[tok / a.block_size]) * block_elems + static_cast<int64_t>(tok % a.block_size) * D;
  };
  // Loads this thread's vectors of kUnroll rows starting at `base`.
  const auto load_rows = [&](const T* cache, int base, uint4(&raw)[kUnroll][L::kVecsPerLane]) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int tok = base + u * L::kRowsInFlight + row_slot;
      const T* row = tok < tok_end ? cache + row_offset(tok) : nullptr;
#pragma unroll
      for (int i = 0; i < L::kVecsPerLane; ++i) {
        const int vec = row_lane + i * L::kLanes;
        raw[u][i] =
            (row != nullptr && (L::kFull || vec < L::kRowVecs)) ? load16(row + vec * L::kVecT) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  constexpr int kStep = L::kRowsInFlight * kUnroll;
  float* logits = smem;

  // Pass 1: logits of the partition.
  float thread_max[G];
#pragma unroll
  for (int g = 0; g < G; ++g) thread_max[g] = -INFINITY;
  for (int base = tok_begin; base < tok_end; base += kStep) {
    uint4 raw[kUnroll][L::kVecsPerLane];
    load_rows(k_base, base, raw);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float dot[G];
#pragma unroll
      for (int g = 0; g < G; ++g) dot[g] = 0.0f;
#pragma unroll
      for (int i = 0; i < L::kVecsPerLane; ++i) {
        float kf[L::kVecT];
        widen<T>(raw[u][i], kf);
#pragma unroll
        for (int e = 0; e < L::kVecT; ++e) {
#pragma unroll
          for (int g = 0; g < G; ++g) dot[g] = fmaf(qf[g][i][e], kf[e], dot[g]);
        }
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
#pragma unroll
        for (int offset = L::kLanes / 2; offset > 0; offset /= 2) {
          dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], offset);
        }
      }
      const int tok = base + u * L::kRowsInFlight + row_slot;
      if (tok < tok_end) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
          dot[g] = apply_softcap(dot[g], cap_log2);
          thread_max[g] = fmaxf(thread_max[g], dot[g]);
          if (row_lane == 0) logits[g * w.partition_size + (tok - tok_begin)] = dot[g];
        }
      }
    }
  }

  // Softmax of the partition: max, then numerators and their sum.
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float m = thread_max[g];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    if (lane == 0) red[warp][g] = m;
  }
  __syncthreads();
  if (tid < G) {
    float m = red[0][tid];
#pragma unroll
    for (int i = 1; i < kWarps; ++i) m = fmaxf(m, red[i][tid]);
    row_max[tid] = m;
  }
  __syncthreads();
  const int n_tok = tok_end - tok_begin;
  float thread_sum[G];
#pragma unroll
  for (int g = 0; g < G; ++g) thread_sum[g] = 0.0f;
  for (int i = tid; i < n_tok; i += kThreads) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float p = exp2f(logits[g * w.partition_size + i] - row_max[g]);
      logits[g * w.partition_size + i] = p;
      thread_sum[g] += p;
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float s = thread_sum[g];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (lane == 0) red[warp][g] = s;
  }
  __syncthreads();
  if (tid < G) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) s += red[i][tid];
    row_sum[tid] = s;
  }

  // Pass 2: P.V in fp32 registers.
  float acc[G][L::kVecsPerLane][L::kVecT];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int i = 0; i < L::kVecsPerLane; ++i) {
#pragma unroll
      for (int e = 0; e < L::kVecT; ++e) acc[g][i][e] = 0.0f;
    }
  }
  for (int base = tok_begin; base < tok_end; base += kStep) {
    uint4 raw[kUnroll][L::kVecsPerLane];
    load_rows(v_base, base, raw);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int tok = base + u * L::kRowsInFlight + row_slot;
      if (tok >= tok_end) continue;
      float p[G];
#pragma unroll
      for (int g = 0; g < G; ++g) p[g] = logits[g * w.partition_size + (tok - tok_begin)];
#pragma unroll
      for (int i = 0; i < L::kVecsPerLane; ++i) {
        float vf[L::kVecT];
        widen<T>(raw[u][i], vf);
#pragma unroll
        for (int e = 0; e < L::kVecT; ++e) {
#pragma unroll
          for (int g = 0; g < G; ++g) acc[g][i][e] = fmaf(p[g], vf[e], acc[g][i][e]);
        }
      }
    }
  }
  // Sum the rows in flight: first across the warp's row slots, then the warps.
#pragma unroll
  for (int offset = L::kLanes; offset < 32; offset *= 2) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int i = 0; i < L::kVecsPerLane; ++i) {
#pragma unroll
        for (int e = 0; e < L::kVecT; ++e) acc[g][i][e] += __shfl_xor_sync(0xffffffffu, acc[g][i][e], offset);
      }
    }
  }
  __syncthreads();  // every thread is done with the logits: reuse the space
  float* partial = smem;
  if (lane < L::kLanes) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int i = 0; i < L::kVecsPerLane; ++i) {
        const int vec = row_lane + i * L::kLanes;
        if (!L::kFull && vec >= L::kRowVecs) continue;
#pragma unroll
        for (int e = 0; e < L::kVecT; ++e) partial[(warp * G + g) * D + vec * L::kVecT + e] = acc[g][i][e];
      }
    }
  }
  __syncthreads();
  for (int idx = tid; idx < G * D; idx += kThreads) {
    const int g = idx / D, d = idx % D;
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) o += partial[(i * G + g) * D + d];
    if (num_partitions == 1) {
      T* out = static_cast<T*>(a.out) + static_cast<int64_t>(q_row) * a.out_token_stride +
               static_cast<int64_t>(head0 + g) * a.out_head_stride;
      out[d] = from_float<T>(o / row_sum[g]);
    } else {
      const int64_t slot = (static_cast<int64_t>(seq) * a.heads + head0 + g) * w.max_partitions + blockIdx.z;
      w.part_out[slot * D + d] = o;
    }
  }
  if (num_partitions > 1 && tid < G) {
    const int64_t slot = (static_cast<int64_t>(seq) * a.heads + head0 + tid) * w.max_partitions + blockIdx.z;
    w.part_max[slot] = row_max[tid];
    w.part_sum[slot] = row_sum[tid];
  }
}

// Sum (or max) of one float over the block; every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float v, float* red) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  __syncthreads();  // red may still be read from a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
#pragma unroll
  for (int i = 1; i < kWarps; ++i) v = kMax ? fmaxf(v, red[i]) : v + red[i];
  return v;
}

// One thread block per (sequence, head) whose context spans several
// partitions: out = sum_p 2^(m_p - M) o_p / sum_p 2^(m_p - M) l_p.
template <typename T>
__global__ void __launch_bounds__(kThreads) paged_decode_merge_kernel(const PagedAttentionArgs a, const DecodeWork w) {
  extern __shared__ float weight[];  // [partitions]
  __shared__ float red[kWarps];
  const int seq = blockIdx.x, head = blockIdx.y;
  const int q_row = a.query_start[seq];
  if (a.query_start[seq + 1] - q_row != 1) return;
  const int context = a.context_lens[seq];
  const int n = (context - window_start(a.window, context - 1) + w.partition_size - 1) / w.partition_size;
  if (n <= 1) return;
  const int64_t base = (static_cast<int64_t>(seq) * a.heads + head) * w.max_partitions;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < n; i += kThreads) m = fmaxf(m, w.part_max[base + i]);
  m = block_reduce<true>(m, red);
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float e = exp2f(w.part_max[base + i] - m);
    weight[i] = e;
    s += e * w.part_sum[base + i];
  }
  s = block_reduce<false>(s, red);  // its barriers also publish `weight`
  const float inv = 1.0f / s;
  T* out = static_cast<T*>(a.out) + static_cast<int64_t>(q_row) * a.out_token_stride +
           static_cast<int64_t>(head) * a.out_head_stride;
  for (int d = threadIdx.x; d < a.head_dim; d += kThreads) {
    float o = 0.0f;
    for (int i = 0; i < n; ++i) o = fmaf(weight[i], w.part_out[(base + i) * a.head_dim + d], o);
    out[d] = from_float<T>(o * inv);
  }
}

// Copies one token's K and V rows (all KV heads) into its slot; 16-byte
// copies when every address allows, else element by element.
template <typename E>
__global__ void reshape_and_cache_kernel(const ReshapeAndCacheArgs a, bool vec16) {
  const int64_t token = blockIdx.x;
  const int64_t slot = a.slot_mapping[token];
  if (slot < 0) return;
  const int64_t block = slot / a.block_size, offset = slot % a.block_size;
  const int per_unit = vec16 ? static_cast<int>(16 / sizeof(E)) : 1;
  const int row_units = a.head_dim / per_unit;
  for (int idx = threadIdx.x; idx < a.kv_heads * row_units; idx += blockDim.x) {
    const int h = idx / row_units, u = idx % row_units;
    const int64_t dst = ((block * a.kv_heads + h) * a.block_size + offset) * a.head_dim + u * per_unit;
    const int64_t k_src = token * a.k_token_stride + h * a.k_head_stride + u * per_unit;
    const int64_t v_src = token * a.v_token_stride + h * a.v_head_stride + u * per_unit;
    const E* k = static_cast<const E*>(a.k);
    const E* v = static_cast<const E*>(a.v);
    E* kc = static_cast<E*>(a.key_cache);
    E* vc = static_cast<E*>(a.value_cache);
    if (vec16) {
      *reinterpret_cast<uint4*>(kc + dst) = load16(k + k_src);
      *reinterpret_cast<uint4*>(vc + dst) = load16(v + v_src);
    } else {
      kc[dst] = k[k_src];
      vc[dst] = v[v_src];
    }
  }
}

int decode_heads_per_block(const PagedAttentionArgs& a) {
  return heads_per_block(a.heads / a.kv_heads, kMaxHeadsPerBlock);
}

int64_t partitions_for(int64_t context, int64_t partition_size) {
  return (context + partition_size - 1) / partition_size;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int G, typename F>
void with_heads_per_block(int g, F&& f) {
  if constexpr (G >= 1) {
    if (g == G) {
      f(std::integral_constant<int, G>{});
    } else {
      with_heads_per_block<G / 2>(g, f);
    }
  }
}

void launch_decode(const PagedAttentionArgs& a, cudaStream_t stream) {
  const int32_t partition = paged_attention_partition_size(a);
  const int64_t max_partitions = partitions_for(decode_span(a), partition);
  DecodeWork w{partition, static_cast<int32_t>(max_partitions)};
  if (max_partitions > 1) {
    const int64_t rows = static_cast<int64_t>(a.num_seqs) * a.heads * max_partitions;
    w.part_out = static_cast<float*>(a.workspace);
    w.part_max = w.part_out + rows * a.head_dim;
    w.part_sum = w.part_max + rows;
  }
  const int g = decode_heads_per_block(a);
  dispatch_dtype(a.dtype, [&](auto t) {
    using T = decltype(t);
    dispatch_head_dim(a.head_dim, [&](auto d) {
      constexpr int D = decltype(d)::value;
      with_heads_per_block<kMaxHeadsPerBlock>(g, [&](auto gc) {
        constexpr int G = decltype(gc)::value;
        const size_t smem = sizeof(float) * std::max<size_t>(static_cast<size_t>(G) * partition, kWarps * G * D);
        if (smem > 48 * 1024) {
          cudaFuncSetAttribute(paged_decode_kernel<T, D, G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem));
        }
        const dim3 grid(a.num_seqs, a.heads / G, static_cast<unsigned>(max_partitions));
        paged_decode_kernel<T, D, G><<<grid, kThreads, smem, stream>>>(a, w);
      });
    });
    if (max_partitions > 1) {
      const dim3 grid(a.num_seqs, a.heads);
      paged_decode_merge_kernel<T><<<grid, kThreads, sizeof(float) * max_partitions, stream>>>(a, w);
    }
  });
}

}  // namespace

}  // namespace paged

int32_t paged_attention_partition_size(const PagedAttentionArgs& a) {
  if (a.partition_size > 0) return a.partition_size;
  // Halve from 512 while the grid has fewer than two blocks per SM, but keep
  // the merge's per-partition state bounded.
  const int64_t blocks_per_partition = static_cast<int64_t>(a.num_seqs) * (a.heads / paged::decode_heads_per_block(a));
  const int64_t target = 2 * static_cast<int64_t>(std::max(a.num_sms, 1));
  int32_t partition = 512;
  const int64_t span = paged::decode_span(a);
  while (partition > 64 && blocks_per_partition * paged::partitions_for(span, partition) < target) {
    partition /= 2;
  }
  while (paged::partitions_for(span, partition) > paged::kMaxPartitions) partition *= 2;
  return partition;
}

bool paged_attention_cuda_handles_head_dim(int32_t head_dim) { return paged::is_supported_head_dim(head_dim); }

bool paged_attention_cuda_supports(const PagedAttentionArgs& a) {
  if (a.dtype != AttentionDtype::kFloat32 && a.dtype != AttentionDtype::kFloat16 &&
      a.dtype != AttentionDtype::kBFloat16) {
    return false;
  }
  if (!paged::is_supported_head_dim(a.head_dim)) return false;
  if (a.heads <= 0 || a.kv_heads <= 0 || a.heads % a.kv_heads != 0 || a.block_size <= 0) return false;
  if (a.num_seqs < 0 || a.num_seqs > 65535 || a.max_context_len < 0 || a.max_query_len < 0 || a.window < 0 ||
      !(a.softcap >= 0.0f)) {
    return false;
  }
  if (a.out == nullptr || a.q == nullptr || a.key_cache == nullptr || a.value_cache == nullptr ||
      a.block_tables == nullptr || a.query_start == nullptr || a.context_lens == nullptr) {
    return false;
  }
  if (!paged::aligned16(a.key_cache) || !paged::aligned16(a.value_cache)) return false;
  if (a.heads / paged::decode_heads_per_block(a) > 65535) return false;
  if (a.partition_size != 0) {
    const int64_t smem = int64_t{4} * paged::kMaxHeadsPerBlock * a.partition_size;
    if (a.partition_size < 1 || smem > 160 * 1024) return false;
    if (paged::partitions_for(paged::decode_span(a), a.partition_size) > paged::kMaxPartitions) return false;
  }
  return true;
}

size_t paged_attention_workspace_bytes(const PagedAttentionArgs& a) {
  if (!a.has_decode_seqs) return 0;
  const int64_t max_partitions = paged::partitions_for(paged::decode_span(a), paged_attention_partition_size(a));
  if (max_partitions <= 1) return 0;
  const int64_t rows = static_cast<int64_t>(a.num_seqs) * a.heads * max_partitions;
  return sizeof(float) * static_cast<size_t>(rows * (a.head_dim + 2));
}

void paged_attention_cuda(const PagedAttentionArgs& a, void* stream_ptr) {
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  if (a.num_seqs == 0 || a.num_tokens == 0) return;
  if (a.has_decode_seqs && a.max_context_len > 0) paged::launch_decode(a, stream);
  if (a.has_prefill_seqs && a.max_query_len > 1) paged::launch_paged_prefill(a, stream);
}

bool reshape_and_cache_cuda_supports(const ReshapeAndCacheArgs& a) {
  if (a.dtype != AttentionDtype::kFloat32 && a.dtype != AttentionDtype::kFloat16 &&
      a.dtype != AttentionDtype::kBFloat16) {
    return false;
  }
  return a.kv_heads > 0 && a.head_dim > 0 && a.block_size > 0 && a.num_tokens >= 0 &&
         a.num_tokens < (int64_t{1} << 31) && a.k != nullptr && a.v != nullptr && a.key_cache != nullptr &&
         a.value_cache != nullptr && a.slot_mapping != nullptr;
}

void reshape_and_cache_cuda(const ReshapeAndCacheArgs& a, void* stream_ptr) {
  if (a.num_tokens == 0) return;
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  const size_t elem = a.dtype == AttentionDtype::kFloat32 ? 4 : 2;
  const auto multiple16 = [&](int64_t elements) { return (static_cast<size_t>(elements) * elem) % 16 == 0; };
  const bool vec16 = paged::aligned16(a.k) && paged::aligned16(a.v) && paged::aligned16(a.key_cache) &&
                     paged::aligned16(a.value_cache) && multiple16(a.head_dim) && multiple16(a.k_token_stride) &&
                     multiple16(a.k_head_stride) && multiple16(a.v_token_stride) && multiple16(a.v_head_stride);
  const dim3 grid(static_cast<unsigned>(a.num_tokens));
  if (elem == 4) {
    paged::reshape_and_cache_kernel<uint32_t><<<grid, 128, 0, stream>>>(a, vec16);
  } else {
    paged::reshape_and_cache_kernel<uint16_t><<<grid, 128, 0, stream>>>(a, vec16);
  }
}

}  // namespace colossus::kernels

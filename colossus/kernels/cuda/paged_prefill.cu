// Paged-KV-cache attention on CUDA, part 2: chunked prefill (q_len > 1),
// varlen over the packed sequences, on CUDA cores: the path for fp32 and
// head_dim 256, and for bf16/fp16 when args.prefill_tensor_cores is false
// (paged_prefill_tc.cu has the tensor-core kernel). No torch headers here.
//
// Flash-attention style with fp32 FMAs: one
// thread block per (sequence, tile of query rows, group of query heads that
// share a KV head). A tile holds kRows rows, each a (token, head) pair: with
// gq heads per KV head in the block (the largest power of two <= 8 dividing
// heads / kv_heads) it covers kRows / gq tokens x gq heads, so every K/V row
// loaded serves all of them. The Q tile (pre-scaled by scale * log2 e) stays
// in shared memory; K/V tiles of kKeys cache positions are gathered through
// the block table into shared memory (16-byte loads, widened to fp32); each
// thread computes a kRowsPerThread x kKeysPerThread block of scores from
// float4 shared-memory reads, applies the causal limit (row at position p sees
// keys <= p), updates its rows' running max and sum (online softmax, exp2;
// the 8 threads sharing a row agree through shuffles), writes P to shared
// memory and accumulates P.V into its rows' fp32 output columns.
#include "colossus/kernels/cuda/paged_attention_common.cuh"

namespace colossus::kernels::paged {

namespace {

constexpr int kThreads = 128;  // 16 row groups x 8 lanes
constexpr int kMaxHeadsPerTile = 8;

template <typename T, int D>
struct PrefillTile {
  static constexpr int kDPad = ceil_div(D, 32) * 32;           // shared-memory columns (zeros past D)
  static constexpr int kRowsPerThread = kDPad <= 128 ? 4 : 2;  // per thread, in S and in O
  static constexpr int kRows = 16 * kRowsPerThread;            // query rows per tile
  static constexpr int kKeys = kDPad <= 64 ? 64 : 32;          // cache positions per K/V tile
  static constexpr int kKeysPerThread = kKeys / 8;             // keys lane, lane + 8, ...
  static constexpr int kLd = kDPad + 4;                        // Q/K/V row stride: conflict-free float4 reads
  static constexpr int kLdP = kKeys + 8 / kRowsPerThread;      // P row stride: conflict-free stores
  static constexpr int kChunks = kDPad / 32;                   // float4 output columns per thread
  static constexpr int kVecT = kVec<T>;
  static constexpr int kRowVecs = D / kVecT;
  static constexpr size_t kSmemBytes = sizeof(float) * (kRows * kLd + 2 * kKeys * kLd + kRows * kLdP);
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) paged_prefill_kernel(const PagedAttentionArgs a, const int heads_per_tile) {
  using P = PrefillTile<T, D>;
  constexpr int TM = P::kRowsPerThread;
  constexpr int TN = P::kKeysPerThread;
  extern __shared__ __align__(16) float smem[];
  float* q_s = smem;                     // [kRows][kLd]
  float* k_s = q_s + P::kRows * P::kLd;  // [kKeys][kLd]
  float* v_s = k_s + P::kKeys * P::kLd;  // [kKeys][kLd]
  float* p_s = v_s + P::kKeys * P::kLd;  // [kRows][kLdP]

  const int seq = blockIdx.y;
  const int q_begin = a.query_start[seq];
  const int q_len = a.query_start[seq + 1] - q_begin;
  // q_len == 1 rows belong to the decode kernel when it runs.
  if (q_len == 0 || (q_len == 1 && a.has_decode_seqs)) return;
  const int tokens_per_tile = P::kRows / heads_per_tile;
  const int tile_tok0 = static_cast<int>(blockIdx.x) * tokens_per_tile;
  if (tile_tok0 >= q_len) return;
  const int tile_tokens = min(tokens_per_tile, q_len - tile_tok0);
  const int first_pos = a.context_lens[seq] - q_len;        // cache position of the chunk's first token
  const int key_end = first_pos + tile_tok0 + tile_tokens;  // keys [0, key_end) are visible to some row
  const int head0 = static_cast<int>(blockIdx.z) * heads_per_tile;
  const int kv_head = head0 / (a.heads / a.kv_heads);
  const int tid = threadIdx.x;

  // Q tile: row r is token r / heads_per_tile (rows past the chunk repeat its
  // last token and are not written) of head head0 + r % heads_per_tile.
  const float q_scale = a.scale * kLog2e;
  const float cap_log2 = softcap_log2(a);
  const T* q = static_cast<const T*>(a.q);
  for (int idx = tid; idx < P::kRows * P::kDPad; idx += kThreads) {
    const int r = idx / P::kDPad, d = idx % P::kDPad;
    float x = 0.0f;
    if (d < D) {
      const int tok = q_begin + tile_tok0 + min(r / heads_per_tile, tile_tokens - 1);
      const int h = head0 + r % heads_per_tile;
      x = to_float(q[static_cast<int64_t>(tok) * a.q_token_stride + static_cast<int64_t>(h) * a.q_head_stride + d]) *
          q_scale;
    }
    q_s[r * P::kLd + d] = x;
  }
  if constexpr (P::kDPad != D) {
    for (int idx = tid; idx < P::kKeys * (P::kDPad - D); idx += kThreads) {
      const int key = idx / (P::kDPad - D), d = D + idx % (P::kDPad - D);
      k_s[key * P::kLd + d] = 0.0f;
      v_s[key * P::kLd + d] = 0.0f;
    }
  }

  const int group = tid / 8, lane8 = tid % 8;
  int pos[TM];  // cache position of each of my rows
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int r = group * TM + i;
    pos[i] = first_pos + tile_tok0 + min(r / heads_per_tile, tile_tokens - 1);
  }
  float m[TM], l[TM], o[TM][P::kChunks][4];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < P::kChunks; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][c][e] = 0.0f;
    }
  }

  const int64_t block_elems = static_cast<int64_t>(a.kv_heads) * a.block_size * D;
  const int64_t head_offset = static_cast<int64_t>(kv_head) * a.block_size * D;
  const T* k_base = static_cast<const T*>(a.key_cache) + head_offset;
  const T* v_base = static_cast<const T*>(a.value_cache) + head_offset;
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.block_table_stride;

  // Under a sliding window the tile's first row sees nothing before key_begin.
  const int key_begin = window_start(a.window, first_pos + tile_tok0);
  for (int kb = key_begin; kb < key_end; kb += P::kKeys) {
    __syncthreads();  // the previous tile's P.V is done with k_s, v_s, p_s (first time: q_s is written)
    for (int idx = tid; idx < P::kKeys * P::kRowVecs; idx += kThreads) {
      const int key = idx / P::kRowVecs, vec = idx % P::kRowVecs;
      const int t = kb + key;
      float kf[P::kVecT], vf[P::kVecT];
      if (t < key_end) {
        const int64_t off = static_cast<int64_t>(table[t / a.block_size]) * block_elems +
                            static_cast<int64_t>(t % a.block_size) * D + vec * P::kVecT;
        widen<T>(load16(k_base + off), kf);
        widen<T>(load16(v_base + off), vf);
      } else {
#pragma unroll
        for (int e = 0; e < P::kVecT; ++e) kf[e] = vf[e] = 0.0f;
      }
#pragma unroll
      for (int e = 0; e < P::kVecT; e += 4) {
        *reinterpret_cast<float4*>(&k_s[key * P::kLd + vec * P::kVecT + e]) =
            make_float4(kf[e], kf[e + 1], kf[e + 2], kf[e + 3]);
        *reinterpret_cast<float4*>(&v_s[key * P::kLd + vec * P::kVecT + e]) =
            make_float4(vf[e], vf[e + 1], vf[e + 2], vf[e + 3]);
      }
    }
    __syncthreads();

    // S = Q K^T for rows group*TM + i and keys lane8 + 8 j.
    float s[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) s[i][j] = 0.0f;
    }
#pragma unroll 4
    for (int d = 0; d < P::kDPad; d += 4) {
      float4 qv[TM];
#pragma unroll
      for (int i = 0; i < TM; ++i) qv[i] = *reinterpret_cast<const float4*>(&q_s[(group * TM + i) * P::kLd + d]);
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const float4 kv = *reinterpret_cast<const float4*>(&k_s[(lane8 + 8 * j) * P::kLd + d]);
#pragma unroll
        for (int i = 0; i < TM; ++i) {
          s[i][j] = fmaf(qv[i].x, kv.x, s[i][j]);
          s[i][j] = fmaf(qv[i].y, kv.y, s[i][j]);
          s[i][j] = fmaf(qv[i].z, kv.z, s[i][j]);
          s[i][j] = fmaf(qv[i].w, kv.w, s[i][j]);
        }
      }
    }

    // Causal limit, then the online softmax update of each row.
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int key = kb + lane8 + 8 * j;
        s[i][j] = (key > pos[i] || (a.window > 0 && key <= pos[i] - a.window)) ? -INFINITY
                                                                                 : apply_softcap(s[i][j], cap_log2);
        tile_max = fmaxf(tile_max, s[i][j]);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 4));
      const float m_new = fmaxf(m[i], tile_max);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet
      const float alpha = exp2f(m[i] - m_use);
      float p_sum = 0.0f;
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const float p = exp2f(s[i][j] - m_use);
        p_s[(group * TM + i) * P::kLdP + lane8 + 8 * j] = p;
        p_sum += p;
      }
      l[i] = l[i] * alpha + p_sum;
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < P::kChunks; ++c) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[i][c][e] *= alpha;
      }
    }
    __syncthreads();

    // O += P V over the tile's visible keys.
    const int keys = min(P::kKeys, key_end - kb);
    for (int k = 0; k < keys; ++k) {
      float p[TM];
#pragma unroll
      for (int i = 0; i < TM; ++i) p[i] = p_s[(group * TM + i) * P::kLdP + k];
#pragma unroll
      for (int c = 0; c < P::kChunks; ++c) {
        const float4 v = *reinterpret_cast<const float4*>(&v_s[k * P::kLd + (lane8 + 8 * c) * 4]);
#pragma unroll
        for (int i = 0; i < TM; ++i) {
          o[i][c][0] = fmaf(p[i], v.x, o[i][c][0]);
          o[i][c][1] = fmaf(p[i], v.y, o[i][c][1]);
          o[i][c][2] = fmaf(p[i], v.z, o[i][c][2]);
          o[i][c][3] = fmaf(p[i], v.w, o[i][c][3]);
        }
      }
    }
  }

  // Each of the 8 lanes summed its own keys' numerators.
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 4);
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int r = group * TM + i;
    const int tok_in_tile = r / heads_per_tile;
    if (tok_in_tile >= tile_tokens) continue;
    const int tok = q_begin + tile_tok0 + tok_in_tile;
    const int h = head0 + r % heads_per_tile;
    T* out = static_cast<T*>(a.out) + static_cast<int64_t>(tok) * a.out_token_stride +
             static_cast<int64_t>(h) * a.out_head_stride;
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
    for (int c = 0; c < P::kChunks; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = (lane8 + 8 * c) * 4 + e;
        if (col < D) out[col] = from_float<T>(o[i][c][e] * inv);
      }
    }
  }
}

}  // namespace

void launch_paged_prefill(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (launch_paged_prefill_tensor_cores(a, stream)) return;
  const int gq = heads_per_block(a.heads / a.kv_heads, kMaxHeadsPerTile);
  dispatch_dtype(a.dtype, [&](auto t) {
    using T = decltype(t);
    dispatch_head_dim(a.head_dim, [&](auto d) {
      constexpr int D = decltype(d)::value;
      using P = PrefillTile<T, D>;
      constexpr size_t smem = P::kSmemBytes;
      if constexpr (smem > 48 * 1024) {
        cudaFuncSetAttribute(paged_prefill_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem));
      }
      const int tokens_per_tile = P::kRows / gq;
      const dim3 grid(static_cast<unsigned>(ceil_div(a.max_query_len, tokens_per_tile)),
                      static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.heads / gq));
      paged_prefill_kernel<T, D><<<grid, kThreads, smem, stream>>>(a, gq);
    });
  });
}

}  // namespace colossus::kernels::paged

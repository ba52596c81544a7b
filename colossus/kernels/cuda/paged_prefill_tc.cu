// Paged-KV-cache attention on CUDA, part 3: chunked prefill on tensor cores
// for bf16/fp16 and head_dim <= 128 (paged_prefill.cu keeps fp32 and 256).
// No torch headers here by design.
//
// Flash-attention 2 style with warp-level mma.sync.m16n8k16 (fp32
// accumulate): one thread block per (sequence, tile of 64 query rows, group
// of query heads sharing a KV head), rows being (token, head) pairs exactly
// as in paged_prefill.cu. Each of the 4 warps owns 16 rows; its Q fragments
// stay in registers. Per tile of 64 cache positions, K is gathered through
// the block table into shared memory row-major and V transposed, so every
// B fragment is one 32-bit shared load (rows padded by 8 elements: no bank
// conflicts). S = Q K^T accumulates in fp32 fragments, is scaled, masked
// (causal: a row at position p sees keys <= p) and folded into each row's
// running max and sum (online softmax, exp2; the 4 lanes of a quad share a
// row); P is rounded to the input dtype in registers, reused directly as the
// A operand of O += P V, whose fp32 accumulators stay in registers.
#include "colossus/kernels/cuda/paged_attention_common.cuh"

namespace colossus::kernels::paged {

namespace {

constexpr int kThreads = 128;  // 4 warps x 16 rows
constexpr int kRows = 64;      // query rows per tile
constexpr int kKeys = 64;      // cache positions per K/V tile
constexpr int kMaxHeadsPerTile = 8;

template <typename T, int D>
struct TcTile {
  static constexpr int kLdQK = D + 8;          // Q and K row stride (elements)
  static constexpr int kLdVt = kKeys + 8;      // V^T row stride (elements)
  static constexpr int kKSteps = D / 16;       // k-steps of Q K^T
  static constexpr int kKeyTiles = kKeys / 8;  // n-tiles of S
  static constexpr int kDimTiles = D / 8;      // n-tiles of O
  static constexpr int kRowVecs = D / 8;       // 16-byte vectors per K/V row
  static constexpr size_t kSmemBytes = sizeof(T) * (kRows * kLdQK + kKeys * kLdQK + D * kLdVt);
  static_assert(D % 16 == 0 && D <= 128, "tensor-core prefill takes head_dim 32..128 in steps of 16");
};

// Two values as one 32-bit register of T (the first in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo))) |
         (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16);
}

// Two consecutive elements of T in shared memory (4-byte aligned).
template <typename T>
__device__ __forceinline__ uint32_t lds32(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// c += A (16x16, row-major fragments) * B (16x8, column-major fragments).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    paged_prefill_tc_kernel(const PagedAttentionArgs a, const int heads_per_tile) {
  using P = TcTile<T, D>;
  extern __shared__ __align__(16) float smem[];
  T* q_s = reinterpret_cast<T*>(smem);  // [kRows][kLdQK]
  T* k_s = q_s + kRows * P::kLdQK;      // [kKeys][kLdQK]
  T* vt_s = k_s + kKeys * P::kLdQK;     // [D][kLdVt]: V transposed

  const int seq = blockIdx.y;
  const int q_begin = a.query_start[seq];
  const int q_len = a.query_start[seq + 1] - q_begin;
  // q_len == 1 rows belong to the decode kernel when it runs.
  if (q_len == 0 || (q_len == 1 && a.has_decode_seqs)) return;
  const int tokens_per_tile = kRows / heads_per_tile;
  const int tile_tok0 = static_cast<int>(blockIdx.x) * tokens_per_tile;
  if (tile_tok0 >= q_len) return;
  const int tile_tokens = min(tokens_per_tile, q_len - tile_tok0);
  const int first_pos = a.context_lens[seq] - q_len;        // cache position of the chunk's first token
  const int key_end = first_pos + tile_tok0 + tile_tokens;  // keys [0, key_end) are visible to some row
  const int head0 = static_cast<int>(blockIdx.z) * heads_per_tile;
  const int kv_head = head0 / (a.heads / a.kv_heads);
  const int tid = threadIdx.x;

  // Q tile as is: row r is token r / heads_per_tile (rows past the chunk
  // repeat its last token and are not written) of head head0 + r % heads_per_tile.
  const T* q = static_cast<const T*>(a.q);
  for (int idx = tid; idx < kRows * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    const int tok = q_begin + tile_tok0 + min(r / heads_per_tile, tile_tokens - 1);
    const int h = head0 + r % heads_per_tile;
    q_s[r * P::kLdQK + d] =
        q[static_cast<int64_t>(tok) * a.q_token_stride + static_cast<int64_t>(h) * a.q_head_stride + d];
  }
  __syncthreads();

  // Fragment coordinates: this lane holds rows row0 + g and row0 + g + 8,
  // columns 2 t, 2 t + 1 of each 8-wide tile.
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row0 = warp * 16;
  int pos[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = row0 + g + 8 * i;
    pos[i] = first_pos + tile_tok0 + min(r / heads_per_tile, tile_tokens - 1);
  }
  uint32_t qa[P::kKSteps][4];
#pragma unroll
  for (int ks = 0; ks < P::kKSteps; ++ks) {
    const T* base = q_s + (row0 + g) * P::kLdQK + ks * 16 + 2 * t;
    qa[ks][0] = lds32(base);
    qa[ks][1] = lds32(base + 8 * P::kLdQK);
    qa[ks][2] = lds32(base + 8);
    qa[ks][3] = lds32(base + 8 * P::kLdQK + 8);
  }
  float o[P::kDimTiles][4];
#pragma unroll
  for (int dt = 0; dt < P::kDimTiles; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
  }
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float s_scale = a.scale * kLog2e;
  const float cap_log2 = softcap_log2(a);

  const int64_t block_elems = static_cast<int64_t>(a.kv_heads) * a.block_size * D;
  const int64_t head_offset = static_cast<int64_t>(kv_head) * a.block_size * D;
  const T* k_base = static_cast<const T*>(a.key_cache) + head_offset;
  const T* v_base = static_cast<const T*>(a.value_cache) + head_offset;
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.block_table_stride;
  const auto row_offset = [&](int t_pos) {
    return static_cast<int64_t>(table[t_pos / a.block_size]) * block_elems +
           static_cast<int64_t>(t_pos % a.block_size) * D;
  };
  uint16_t* vt_bits = reinterpret_cast<uint16_t*>(vt_s);

  // Under a sliding window the tile's first row sees nothing before key_begin.
  const int key_begin = window_start(a.window, first_pos + tile_tok0);
  for (int kb = key_begin; kb < key_end; kb += kKeys) {
    __syncthreads();  // the previous tile's fragments are read
    // K row-major (a row's vectors across neighbouring lanes: coalesced).
    for (int idx = tid; idx < kKeys * P::kRowVecs; idx += kThreads) {
      const int key = idx / P::kRowVecs, vec = idx % P::kRowVecs;
      const int t_pos = kb + key;
      const uint4 raw = t_pos < key_end ? load16(k_base + row_offset(t_pos) + vec * 8) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(k_s + key * P::kLdQK + vec * 8) = raw;
    }
    // V transposed (neighbouring lanes take neighbouring keys, so the
    // element-wise stores land in consecutive shared-memory words).
    for (int idx = tid; idx < kKeys * P::kRowVecs; idx += kThreads) {
      const int key = idx % kKeys, vec = idx / kKeys;
      const int t_pos = kb + key;
      const uint4 raw = t_pos < key_end ? load16(v_base + row_offset(t_pos) + vec * 8) : make_uint4(0, 0, 0, 0);
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        vt_bits[(vec * 8 + i) * P::kLdVt + key] = static_cast<uint16_t>(w[i / 2] >> (16 * (i % 2)));
      }
    }
    __syncthreads();

    // S = Q K^T (B = K^T: lane reads K[key = 8 nt + g][d = 16 ks + 2 t ..]).
    float s[P::kKeyTiles][4];
#pragma unroll
    for (int nt = 0; nt < P::kKeyTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < P::kKSteps; ++ks) {
        const T* kp = k_s + (nt * 8 + g) * P::kLdQK + ks * 16 + 2 * t;
        mma_16816<T>(s[nt], qa[ks], lds32(kp), lds32(kp + 8));
      }
    }

    // Scale, causal limit, online softmax update of the two rows.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < P::kKeyTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kb + nt * 8 + 2 * t + (e & 1);
        const bool hidden = key > pos[e / 2] || (a.window > 0 && key <= pos[e / 2] - a.window);
        const float v = hidden ? -INFINITY : apply_softcap(s[nt][e] * s_scale, cap_log2);
        s[nt][e] = v;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], v);
      }
    }
    float m_use[2], alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
      const float m_new = fmaxf(m[i], tile_max[i]);
      m_use[i] = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet
      alpha[i] = exp2f(m[i] - m_use[i]);
      m[i] = m_new;
    }
    float p_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < P::kKeyTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - m_use[e / 2]);
        p_sum[e / 2] += s[nt][e];
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + p_sum[i];
#pragma unroll
    for (int dt = 0; dt < P::kDimTiles; ++dt) {
      o[dt][0] *= alpha[0];
      o[dt][1] *= alpha[0];
      o[dt][2] *= alpha[1];
      o[dt][3] *= alpha[1];
    }

    // O += P V: S tiles 2 kk and 2 kk + 1 are the A fragment of keys
    // 16 kk .. 16 kk + 15; B = V: lane reads V^T[d = 8 dt + g][key = 16 kk + 2 t ..].
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dt = 0; dt < P::kDimTiles; ++dt) {
        const T* vp = vt_s + (dt * 8 + g) * P::kLdVt + kk * 16 + 2 * t;
        mma_16816<T>(o[dt], pa, lds32(vp), lds32(vp + 8));
      }
    }
  }

  // The quad's lanes each summed their own columns' numerators.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = row0 + g + 8 * i;
    const int tok_in_tile = r / heads_per_tile;
    if (tok_in_tile >= tile_tokens) continue;
    const int tok = q_begin + tile_tok0 + tok_in_tile;
    const int h = head0 + r % heads_per_tile;
    T* out = static_cast<T*>(a.out) + static_cast<int64_t>(tok) * a.out_token_stride +
             static_cast<int64_t>(h) * a.out_head_stride;
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
    for (int dt = 0; dt < P::kDimTiles; ++dt) {
      out[dt * 8 + 2 * t] = from_float<T>(o[dt][2 * i] * inv);
      out[dt * 8 + 2 * t + 1] = from_float<T>(o[dt][2 * i + 1] * inv);
    }
  }
}

}  // namespace

bool launch_paged_prefill_tensor_cores(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (!a.prefill_tensor_cores || a.dtype == AttentionDtype::kFloat32) return false;
  if (a.head_dim != 32 && a.head_dim != 64 && a.head_dim != 80 && a.head_dim != 96 && a.head_dim != 128) return false;
  const int gq = heads_per_block(a.heads / a.kv_heads, kMaxHeadsPerTile);
  const auto launch = [&](auto t, auto d) {
    using T = decltype(t);
    constexpr int D = decltype(d)::value;
    constexpr size_t smem = TcTile<T, D>::kSmemBytes;
    if constexpr (smem > 48 * 1024) {
      cudaFuncSetAttribute(paged_prefill_tc_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
    }
    const dim3 grid(static_cast<unsigned>(ceil_div(a.max_query_len, kRows / gq)), static_cast<unsigned>(a.num_seqs),
                    static_cast<unsigned>(a.heads / gq));
    paged_prefill_tc_kernel<T, D><<<grid, kThreads, smem, stream>>>(a, gq);
  };
  const auto with_dim = [&](auto t) {
    switch (a.head_dim) {
      case 32:
        launch(t, std::integral_constant<int, 32>{});
        break;
      case 64:
        launch(t, std::integral_constant<int, 64>{});
        break;
      case 80:
        launch(t, std::integral_constant<int, 80>{});
        break;
      case 96:
        launch(t, std::integral_constant<int, 96>{});
        break;
      case 128:
        launch(t, std::integral_constant<int, 128>{});
        break;
    }
  };
  if (a.dtype == AttentionDtype::kBFloat16) {
    with_dim(__nv_bfloat16{});
  } else {
    with_dim(__half{});
  }
  return true;
}

}  // namespace colossus::kernels::paged

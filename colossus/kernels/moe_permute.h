// Token dispatch of a mixture-of-experts layer without per-expert loops: the
// (token, slot) assignments sorted by expert (a stable counting sort, with an
// optional capacity), the token rows gathered into that order (permute), and
// the weighted sum of each token's expert rows back in token order
// (unpermute / combine), plus the backward pieces. Raw pointers only; the
// reference path (ATen ops, any device) is colossus/models/moe_layer.cpp's
// plan_dispatch / index_select / combine.
#pragma once
#include <cstdint>

namespace colossus::kernels {

enum class MoeRowsDtype : int32_t { kFloat32, kFloat16, kBFloat16 };

// experts: (N*k) int64 expert ids in [0, E) of assignment a = token * k + slot.
// A stable sort by expert (token order inside each expert's segment); with
// capacity >= 0 an expert keeps its first `capacity` assignments in token
// order, the rest are dropped. Writes:
//   total_counts (E) int64: assignments per expert before the capacity
//   counts (E) int64: kept rows per expert (M = sum counts)
//   token_index (N*k) int64: [0, M) the source token of each kept row, rows grouped by expert
//   row_assignment (N*k) int64: [0, M) the assignment a of each kept row (its
//     routing weight is weights[a]: the caller gathers it, differentiably)
//   row_of (N*k) int64: the row of each assignment, -1 when dropped
struct MoeSortArgs {
  const int64_t* experts = nullptr;
  int64_t tokens = 0;
  int64_t top_k = 1;
  int64_t num_experts = 0;
  int64_t capacity = -1;  // < 0: dropless
  int64_t* total_counts = nullptr;
  int64_t* counts = nullptr;
  int64_t* token_index = nullptr;
  int64_t* row_assignment = nullptr;
  int64_t* row_of = nullptr;
};

// Permute (gather): out[i, :] = in[source[i], :] * (scale ? scale[i] : 1) for
// i < rows; in (any, width), out (rows, width), both row-major contiguous of
// `dtype`; the product in fp32, rounded once. The forward dispatch (no scale)
// and the combine's backward for the expert rows (scale = routing weights,
// source = token_index).
struct MoePermuteArgs {
  const void* in = nullptr;
  void* out = nullptr;
  MoeRowsDtype dtype = MoeRowsDtype::kBFloat16;
  int64_t rows = 0;
  int64_t width = 0;
  const int64_t* source = nullptr;  // (rows)
  const float* scale = nullptr;     // (rows) or null
};

// Unpermute (combine): out[t, :] = sum over slots j < k with r = row_of[t*k+j]
// >= 0 of (row_weight ? row_weight[r] : 1) * in[r, :], summed in fp32 in slot
// order and rounded once; a token with every assignment dropped gets 0. in
// (M, width), out (tokens, width). The forward combine (with weights) and the
// dispatch's backward for the token rows (no weights).
struct MoeUnpermuteArgs {
  const void* in = nullptr;
  void* out = nullptr;
  MoeRowsDtype dtype = MoeRowsDtype::kBFloat16;
  int64_t tokens = 0;
  int64_t top_k = 1;
  int64_t width = 0;
  const int64_t* row_of = nullptr;     // (tokens * k)
  const float* row_weight = nullptr;   // (M) or null
};

// The combine's backward for the routing weights: grad_weight[i] =
// sum_h grad_out[token_index[i], h] * rows[i, h] in fp32, i < rows.
struct MoeRowDotArgs {
  const void* grad_out = nullptr;  // (tokens, width)
  const void* rows_in = nullptr;   // (rows, width): the expert outputs
  MoeRowsDtype dtype = MoeRowsDtype::kBFloat16;
  int64_t rows = 0;
  int64_t width = 0;
  const int64_t* token_index = nullptr;  // (rows)
  float* grad_weight = nullptr;          // (rows) fp32
};

#ifdef COLOSSUS_WITH_CUDA
// Each runs on `stream` (a cudaStream_t), asynchronously, and returns false,
// launching nothing, when it does not handle the arguments (use the
// reference). moe_sort_cuda needs num_experts <= 4096; the row kernels any
// width (16-byte vectors when rows are aligned to them, else scalar).
bool moe_sort_cuda(const MoeSortArgs& args, void* stream);
bool moe_permute_cuda(const MoePermuteArgs& args, void* stream);
bool moe_unpermute_cuda(const MoeUnpermuteArgs& args, void* stream);
bool moe_row_dot_cuda(const MoeRowDotArgs& args, void* stream);
#endif

}  // namespace colossus::kernels

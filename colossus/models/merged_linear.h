// Several linear layers that read the same input run as one matmul each way
// (LLaMA's q/k/v and gate/up projections in training) while their weights
// stay separate parameters under their own names: checkpoints, sharding
// plans, ZeRO/Gemini flattening and optimizers see no change.
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

namespace colossus::models {

// Whether the tensors (each (rows_i, ...) with one trailing shape, dtype and
// device) lie back to back in one storage: contiguous, each starting where
// the one before ends, so that merged_rows() can view them without a copy.
bool rows_adjacent(at::TensorList tensors);

// The tensors as one (sum rows_i, ...) tensor, detached: a view of their
// storage when rows_adjacent(), else a copy (at::cat).
at::Tensor merged_rows(at::TensorList tensors);

// Makes the parameters row views of one tensor (their values kept, each
// parameter the same object, so optimizer handles and names stay valid) and
// returns it detached; nothing is copied where they already are adjacent.
// Construction calls it so that training's merged matmul reads the weights in
// place; a later set_data (a dtype cast, lazy init's materialisation) may
// separate them again, and merged_linear then copies them per call.
at::Tensor pack_rows(std::vector<at::Tensor> params);

// x: (..., in); weights[i]: (out_i, in), x's dtype and device; biases: empty,
// or one (out_i) per weight. Returns (..., sum out_i), the outputs side by
// side: [x W_0^T + b_0 | x W_1^T + b_1 | ...]. One matmul forward against
// the merged weight; backward one matmul for dx = dy W and one for every
// weight's gradient (dW = dy^T x, each weight's gradient its rows of it).
// Only x and the parameters are kept for the backward (no memory beyond the
// separate layers'); where the weights are not adjacent the merged weight is
// a transient copy, made again in the backward. Same values as the separate
// layers up to summation order (dx sums over all outputs in one matmul).
at::Tensor merged_linear(const at::Tensor& x, at::TensorList weights, at::TensorList biases);

}  // namespace colossus::models

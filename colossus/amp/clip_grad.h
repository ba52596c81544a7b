// Gradient clipping by global norm, as torch.nn.utils.clip_grad_norm_ does,
// with a hook for the group reduction a sharded or parallel layout needs (each
// rank holds part of the gradients, so the norm must be combined over ranks).
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <limits>
#include <vector>

namespace colossus::amp {

// Combines a rank-local norm term over the ranks that share the gradients.
// `local` is a one-element fp32 tensor on the first gradient's device holding
// sum_i ||g_i||_p^p for finite p (for p = 2: the squared norm), or
// max_i ||g_i||_inf for p = inf. Must return the group-wide value: the SUM
// over ranks for finite p, the MAX for inf (e.g. an all-reduce).
using NormReducer = std::function<at::Tensor(const at::Tensor& local, double norm_type)>;

constexpr double kInfNorm = std::numeric_limits<double>::infinity();

// ||g||_p as a one-element tensor on g's device (fp32 for 16-bit and fp32
// input, accumulated in at least fp32). On the CPU, ATen's single fp32 reduction drifts with the length
// (1e-5 relative at 1M elements, 7e-5 at 4M), which a GPU's tree reduction
// does not: an offloaded optimizer's clip factor then differed from the
// device run's every step and the curves parted (issue 27). So CPU tensors
// are reduced in rows of 4096 in fp32 and the rows combined in fp64 (1e-9,
// no slower, no full-size temporary).
at::Tensor vector_norm(const at::Tensor& g, double norm_type);

// Scales `grads` in place by min(1, max_norm / (total_norm + 1e-6)) and returns
// total_norm, the p-norm over all of them together (before clipping).
// norm_type: any p > 0, or kInfNorm. Undefined tensors are skipped; with none
// left the norm is 0. Without `reduce` the local norm is the total. Throws
// ConfigError on max_norm < 0 or norm_type <= 0.
// weights (empty: 1 each; else one per entry of grads): for finite p the
// local term is sum_i weights[i] * ||g_i||_p^p, so a tensor that r ranks of
// the reduction hold identically counts once with weight 1/r (the max of
// p = inf needs no weighting).
double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, double norm_type = 2.0,
                      const NormReducer& reduce = {}, const std::vector<double>& weights = {});

// The total norm alone (same definition, hook and weights), nothing scaled.
double grad_norm(const std::vector<at::Tensor>& grads, double norm_type = 2.0, const NormReducer& reduce = {},
                 const std::vector<double>& weights = {});

}  // namespace colossus::amp

#include "colossus/models/merged_linear.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace colossus::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// y = x W^T + b over the merged weight (the MergedLinear note in merged_linear.h).
struct MergedLinearFunction : public torch::autograd::Function<MergedLinearFunction> {
  // x (..., in), weights[i] (out_i, in), biases empty or (out_i) each -> (..., sum out_i).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights,
                            at::TensorList biases) {
    // The merged weight lives only for this matmul (a view where adjacent);
    // the parameters themselves are saved, not it.
    const at::Tensor weight = merged_rows(weights);
    const at::Tensor bias = biases.empty() ? at::Tensor() : merged_rows(biases);
    tensor_list saved{x};
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["with_bias"] = !biases.empty();
    return at::linear(x, weight, bias);
  }

  // grads[0]: dy (..., sum out_i) -> {dx, dW_0.., db_0..}.
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::TensorList weights(saved.data() + 1, saved.size() - 1);
    const size_t n = weights.size();
    const bool with_bias = ctx->saved_data["with_bias"].toBool();
    tensor_list out(1 + n + (with_bias ? n : 0));
    const at::Tensor& dy = grads[0];
    if (!dy.defined()) return out;
    const int64_t in = x.size(-1), width = dy.size(-1);
    const at::Tensor dy2 = dy.reshape({-1, width});  // (rows, sum out_i)
    if (ctx->needs_input_grad(0)) out[0] = dy2.mm(merged_rows(weights)).view(x.sizes());  // (rows, in) -> (..., in)
    bool weight_grads = false, bias_grads = false;
    for (size_t i = 0; i < n; ++i) {
      weight_grads = weight_grads || ctx->needs_input_grad(1 + i);
      bias_grads = bias_grads || (with_bias && ctx->needs_input_grad(1 + n + i));
    }
    // One matmul for every weight's gradient; each gets its rows (a view:
    // accumulate-grad keeps it as the parameter's .grad where that has none).
    const at::Tensor dw = weight_grads ? dy2.t().mm(x.reshape({-1, in})) : at::Tensor();  // (sum out_i, in)
    const at::Tensor db = bias_grads ? dy2.sum(0) : at::Tensor();                         // (sum out_i)
    int64_t row = 0;
    for (size_t i = 0; i < n; ++i) {
      const int64_t rows = weights[i].size(0);
      if (ctx->needs_input_grad(1 + i)) out[1 + i] = dw.narrow(0, row, rows);
      if (with_bias && ctx->needs_input_grad(1 + n + i)) out[1 + n + i] = db.narrow(0, row, rows);
      row += rows;
    }
    return out;
  }
};

}  // namespace

bool rows_adjacent(at::TensorList tensors) {
  if (tensors.empty()) return false;
  const at::Tensor& first = tensors[0];
  int64_t offset = first.storage_offset();
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage() || t.dim() < 1 || t.scalar_type() != first.scalar_type() ||
        t.device() != first.device() || !t.is_contiguous() || !t.sizes().slice(1).equals(first.sizes().slice(1)) ||
        !t.storage().is_alias_of(first.storage()) || t.storage_offset() != offset) {
      return false;
    }
    offset += t.numel();
  }
  return true;
}

at::Tensor merged_rows(at::TensorList tensors) {
  TORCH_CHECK(!tensors.empty(), "merged_rows: no tensors");
  if (tensors.size() == 1) return tensors[0].detach();
  if (!rows_adjacent(tensors)) {
    std::vector<at::Tensor> detached;
    detached.reserve(tensors.size());
    for (const at::Tensor& t : tensors) detached.push_back(t.detach());
    return at::cat(detached, 0);
  }
  std::vector<int64_t> sizes = tensors[0].sizes().vec();
  for (size_t i = 1; i < tensors.size(); ++i) sizes[0] += tensors[i].size(0);
  at::Tensor merged = tensors[0].detach();
  // Contiguous strides over the rows that follow the first tensor's.
  std::vector<int64_t> strides(sizes.size(), 1);
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * sizes[d + 1];
  return merged.as_strided(sizes, strides, merged.storage_offset());
}

at::Tensor pack_rows(std::vector<at::Tensor> params) {
  if (rows_adjacent(params)) return merged_rows(params);
  const at::Tensor merged = merged_rows(params);  // a copy: the values kept
  int64_t row = 0;
  for (at::Tensor& p : params) {
    const int64_t rows = p.size(0);
    p.set_data(merged.narrow(0, row, rows));
    row += rows;
  }
  return merged;
}

at::Tensor merged_linear(const at::Tensor& x, at::TensorList weights, at::TensorList biases) {
  TORCH_CHECK(!weights.empty(), "merged_linear: no weights");
  TORCH_CHECK(biases.empty() || biases.size() == weights.size(), "merged_linear: ", biases.size(), " biases for ",
              weights.size(), " weights");
  return MergedLinearFunction::apply(x, weights, biases);
}

}  // namespace colossus::models

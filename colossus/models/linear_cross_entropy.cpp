#include "colossus/models/linear_cross_entropy.h"

#include "colossus/core/errors.h"
#include "colossus/kernels/cross_entropy.h"
#include "colossus/kernels/cuda_slots.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace colossus::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

kernels::LogitsDtype logits_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return kernels::LogitsDtype::kFloat32;
    case at::kHalf: return kernels::LogitsDtype::kFloat16;
    case at::kBFloat16: return kernels::LogitsDtype::kBFloat16;
    default:
      throw ConfigError(fmt::format("linear_cross_entropy: logits dtype {} is not supported (use fp32, fp16 or bf16)",
                                    c10::toString(t)));
  }
}

// grad_weight += dlogits^T @ hidden in fp32: the chunks' contributions add
// up without rounding to the weight's dtype in between.
void accumulate_weight_grad(at::Tensor& acc, const at::Tensor& dlogits, const at::Tensor& hidden) {
  if (acc.is_cuda() && dlogits.scalar_type() != at::kFloat) {
    at::addmm_out(acc, acc, dlogits.t(), hidden, at::kFloat);  // cuBLAS: half inputs, fp32 accumulate and output
  } else {
    acc.addmm_(dlogits.t().to(at::kFloat), hidden.to(at::kFloat));
  }
}

struct LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
  // num_items <= 0: divide by the counted rows.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden_in, const at::Tensor& weight,
                            const at::Tensor& targets, int64_t num_items, int64_t ignore_index, int64_t vocab_multiple,
                            int64_t chunk_bytes, bool grad_hidden_needed, bool grad_weight_needed) {
    const at::Tensor hidden = hidden_in.contiguous();
    const int64_t rows = hidden.size(0), width = hidden.size(1), vocab = weight.size(0);
    const bool write_grad = grad_hidden_needed || grad_weight_needed;
    const int64_t padded = (vocab + vocab_multiple - 1) / vocab_multiple * vocab_multiple;
    // Zero rows: their logits are 0 and the row kernel leaves them out.
    const at::Tensor w = padded == vocab ? weight.contiguous() : at::constant_pad_nd(weight, {0, 0, 0, padded - vocab});
    const int64_t chunk_rows =
        std::max<int64_t>(1, chunk_bytes / (padded * static_cast<int64_t>(hidden.element_size())));

    at::Tensor row_loss = at::empty({rows}, hidden.options().dtype(at::kFloat));
    at::Tensor grad_hidden = grad_hidden_needed ? at::empty_like(hidden) : at::Tensor();
    at::Tensor grad_weight = grad_weight_needed ? at::zeros({padded, width}, hidden.options().dtype(at::kFloat)) : at::Tensor();
    for (int64_t start = 0; start < rows; start += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - start);
      const at::Tensor h = hidden.narrow(0, start, n);
      at::Tensor logits = at::mm(h, w.t());  // (n, padded)
      row_loss.narrow(0, start, n)
          .copy_(cross_entropy_rows(logits, vocab, targets.narrow(0, start, n), ignore_index, 1.0, write_grad));
      if (grad_hidden_needed) {
        at::Tensor out = grad_hidden.narrow(0, start, n);
        at::mm_out(out, logits, w);
      }
      if (grad_weight_needed) accumulate_weight_grad(grad_weight, logits, h);
    }
    const at::Tensor divisor = num_items > 0 ? at::full({}, static_cast<double>(num_items), row_loss.options())
                                             : targets.ne(ignore_index).sum().to(at::kFloat);
    if (grad_weight_needed) grad_weight = grad_weight.narrow(0, 0, vocab);
    ctx->save_for_backward({grad_hidden, grad_weight, divisor});
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return row_loss.sum() / divisor;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor scale = grad_outputs[0].to(at::kFloat) / saved[2];
    at::Tensor grad_hidden, grad_weight;
    if (saved[0].defined()) grad_hidden = saved[0] * scale.to(saved[0].scalar_type());
    if (saved[1].defined()) {
      grad_weight = (saved[1] * scale).to(static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt()));
    }
    return {grad_hidden, grad_weight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor cross_entropy_rows_reference(const at::Tensor& logits, int64_t vocab, const at::Tensor& targets,
                                        int64_t ignore_index, double grad_scale, bool write_grad) {
  const at::Tensor x = logits.narrow(1, 0, vocab).to(at::kFloat);
  const at::Tensor lse = at::logsumexp(x, {1});
  const at::Tensor counted = targets.ne(ignore_index);
  const at::Tensor index = at::where(counted, targets, at::zeros_like(targets)).unsqueeze(1);
  const at::Tensor row_loss = at::where(counted, lse - x.gather(1, index).squeeze(1), at::zeros_like(lse));
  if (write_grad) {
    at::Tensor g = at::exp(x - lse.unsqueeze(1));
    g.scatter_add_(1, index, -at::ones_like(index, g.options()));
    g.mul_(counted.unsqueeze(1).to(at::kFloat) * grad_scale);
    logits.narrow(1, 0, vocab).copy_(g);
    if (logits.size(1) > vocab) logits.narrow(1, vocab, logits.size(1) - vocab).zero_();
  }
  return row_loss;
}

at::Tensor cross_entropy_rows(const at::Tensor& logits, int64_t vocab, const at::Tensor& targets, int64_t ignore_index,
                              double grad_scale, bool write_grad) {
  const auto fused = kernels::cuda_slots().cross_entropy_rows;
  if (fused != nullptr && logits.is_cuda() && logits.is_contiguous() && targets.is_contiguous() &&
      targets.scalar_type() == at::kLong) {
    at::Tensor row_loss = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
    const kernels::CrossEntropyRowsArgs args{.logits = logits.data_ptr(),
                                             .dtype = logits_dtype(logits.scalar_type()),
                                             .rows = logits.size(0),
                                             .vocab = vocab,
                                             .ld = logits.size(1),
                                             .targets = targets.data_ptr<int64_t>(),
                                             .ignore_index = ignore_index,
                                             .grad_scale = static_cast<float>(grad_scale),
                                             .write_grad = write_grad,
                                             .row_loss = row_loss.data_ptr<float>()};
    if (fused(args, logits.get_device())) return row_loss;
  }
  return cross_entropy_rows_reference(logits, vocab, targets, ignore_index, grad_scale, write_grad);
}

at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                std::optional<int64_t> num_items, const LinearCrossEntropyOptions& options) {
  if (hidden.dim() != 2 || weight.dim() != 2 || targets.dim() != 1 || hidden.size(1) != weight.size(1) ||
      hidden.size(0) != targets.size(0)) {
    throw ConfigError(fmt::format("linear_cross_entropy needs hidden (N, C), weight (V, C) and targets (N); got {}, {} and {}",
                                  c10::str(hidden.sizes()), c10::str(weight.sizes()), c10::str(targets.sizes())));
  }
  if (targets.scalar_type() != at::kLong) {
    throw ConfigError(fmt::format("linear_cross_entropy needs int64 targets; got {}", c10::toString(targets.scalar_type())));
  }
  if (hidden.scalar_type() != weight.scalar_type()) {
    throw ConfigError(fmt::format("linear_cross_entropy: hidden is {} but the weight is {}; cast one to the other",
                                  c10::toString(hidden.scalar_type()), c10::toString(weight.scalar_type())));
  }
  if (num_items && *num_items <= 0) {
    throw ConfigError(fmt::format("linear_cross_entropy: num_items is {} but must be > 0", *num_items));
  }
  if (options.vocab_multiple < 1 || options.chunk_bytes < 1) {
    throw ConfigError(fmt::format("linear_cross_entropy: vocab_multiple {} and chunk_bytes {} must be >= 1",
                                  options.vocab_multiple, options.chunk_bytes));
  }
  logits_dtype(hidden.scalar_type());  // throws for dtypes the row kernel has no form for
  // Without autograd (evaluation) only the loss is computed.
  const bool grad = at::GradMode::is_enabled();
  return LinearCrossEntropyFunction::apply(hidden, weight, targets.contiguous(), num_items.value_or(0),
                                           options.ignore_index, options.vocab_multiple, options.chunk_bytes,
                                           grad && hidden.requires_grad(), grad && weight.requires_grad());
}

at::Tensor causal_lm_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                          std::optional<int64_t> num_items, const LinearCrossEntropyOptions& options) {
  if (hidden.dim() != 3 || labels.dim() != 2 || hidden.size(0) != labels.size(0) || hidden.size(1) != labels.size(1)) {
    throw ConfigError(fmt::format("causal_lm_linear_cross_entropy needs hidden (B, T, C) and labels (B, T); got {} and {}",
                                  c10::str(hidden.sizes()), c10::str(labels.sizes())));
  }
  // Position t predicts token t+1; the last position has no target.
  const at::Tensor pad = at::full({labels.size(0), 1}, options.ignore_index, labels.options());
  const at::Tensor targets = at::cat({labels.narrow(1, 1, labels.size(1) - 1), pad}, 1).reshape(-1);
  return linear_cross_entropy(hidden.reshape({-1, hidden.size(2)}), weight, targets, num_items, options);
}

}  // namespace colossus::models

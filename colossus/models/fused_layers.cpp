#include "colossus/models/fused_layers.h"

#include "colossus/kernels/aten_element_dtype.h"
#include "colossus/kernels/cuda_slots.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <vector>

namespace colossus::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// A CUDA tensor the kernels can read as-is: contiguous, 16-byte aligned.
bool kernel_ready(const at::Tensor& t) {
  return t.is_cuda() && t.is_contiguous() && kernels::aligned16(t.data_ptr());
}

// (B, T, H, D) whose heads are contiguous and whose (b, t) rows are evenly
// strided (contiguous, or q/k read in place from a merged q/k/v projection):
// the RoPE kernel's input. Returns the row stride in elements, or 0.
int64_t rope_row_stride(const at::Tensor& t) {
  if (!t.is_cuda() || t.dim() != 4 || !kernels::aligned16(t.data_ptr())) return 0;
  if (t.is_contiguous()) return t.size(2) * t.size(3);
  const int64_t row = t.stride(1);
  const bool heads_contiguous = t.stride(3) == 1 && t.stride(2) == t.size(3) && row >= t.size(2) * t.size(3);
  return heads_contiguous && t.stride(0) == t.size(1) * row ? row : 0;
}

// A gradient in the layout the kernels need (autograd may hand over any);
// zeros when undefined (that output was not used).
at::Tensor grad_for_kernel(const at::Tensor& grad, const at::Tensor& like) {
  if (!grad.defined()) return at::zeros_like(like, at::MemoryFormat::Contiguous);
  if (grad.is_contiguous() && kernels::aligned16(grad.data_ptr()) && grad.scalar_type() == like.scalar_type()) return grad;
  return grad.to(like.scalar_type()).clone(at::MemoryFormat::Contiguous);  // a fresh block: aligned
}

// Saved tensors: s (the normalised input), weight, mean (kLayer), rstd.
struct FusedNormFunction : public torch::autograd::Function<FusedNormFunction> {
  // Returns {y} without a residual, {y, s} with one.
  // residual and bias are optional (not undefined tensors): autograd records
  // the device of every tensor argument, which an undefined tensor lacks.
  static tensor_list forward(AutogradContext* ctx, const at::Tensor& x, const std::optional<at::Tensor>& residual_arg,
                             const at::Tensor& weight, const std::optional<at::Tensor>& bias_arg, int64_t kind_value,
                             double eps) {
    const at::Tensor residual = residual_arg.value_or(at::Tensor()), bias = bias_arg.value_or(at::Tensor());
    const auto kind = static_cast<kernels::NormKind>(kind_value);
    const bool layer = kind == kernels::NormKind::kLayer, with_residual = residual.defined();
    const int64_t cols = x.size(-1), rows = x.numel() / cols;
    const auto stats = x.options().dtype(at::kFloat);
    at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
    at::Tensor sum = with_residual ? at::empty_like(x, at::MemoryFormat::Contiguous) : at::Tensor();
    at::Tensor mean = layer ? at::empty({rows}, stats) : at::Tensor(), rstd = at::empty({rows}, stats);
    const kernels::NormForwardArgs args{.kind = kind,
                                        .dtype = *kernels::element_dtype_of(x.scalar_type()),
                                        .rows = rows,
                                        .cols = cols,
                                        .x = x.data_ptr(),
                                        .residual = with_residual ? residual.data_ptr() : nullptr,
                                        .weight = weight.data_ptr(),
                                        .bias = bias.defined() ? bias.data_ptr() : nullptr,
                                        .eps = static_cast<float>(eps),
                                        .y = y.data_ptr(),
                                        .residual_out = with_residual ? sum.data_ptr() : nullptr,
                                        .mean = layer ? mean.data_ptr<float>() : nullptr,
                                        .rstd = rstd.data_ptr<float>()};
    TORCH_CHECK(kernels::cuda_slots().norm_forward(args, x.get_device()), "fused norm forward refused checked arguments");
    ctx->save_for_backward({with_residual ? sum : x, weight, mean, rstd});
    ctx->saved_data["kind"] = kind_value;
    ctx->saved_data["residual"] = with_residual;
    ctx->saved_data["bias"] = bias.defined();
    if (!with_residual) return {y};
    return {y, sum};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& s = saved[0];
    const at::Tensor& weight = saved[1];
    const auto kind = static_cast<kernels::NormKind>(ctx->saved_data["kind"].toInt());
    const bool with_residual = ctx->saved_data["residual"].toBool(), with_bias = ctx->saved_data["bias"].toBool();
    const at::Tensor dy = grad_for_kernel(grads[0], s);
    const at::Tensor dsum = with_residual && grads[1].defined() ? grad_for_kernel(grads[1], s) : at::Tensor();
    at::Tensor dx = at::empty_like(s, at::MemoryFormat::Contiguous), dweight = at::empty_like(weight);
    at::Tensor dbias = with_bias ? at::empty_like(weight) : at::Tensor();
    const int64_t cols = s.size(-1);
    const kernels::NormBackwardArgs args{.kind = kind,
                                         .dtype = *kernels::element_dtype_of(s.scalar_type()),
                                         .rows = s.numel() / cols,
                                         .cols = cols,
                                         .dy = dy.data_ptr(),
                                         .dresidual_out = dsum.defined() ? dsum.data_ptr() : nullptr,
                                         .s = s.data_ptr(),
                                         .weight = weight.data_ptr(),
                                         .mean = saved[2].defined() ? saved[2].data_ptr<float>() : nullptr,
                                         .rstd = saved[3].data_ptr<float>(),
                                         .dx = dx.data_ptr(),
                                         .dweight = dweight.data_ptr(),
                                         .dbias = with_bias ? dbias.data_ptr() : nullptr};
    TORCH_CHECK(kernels::cuda_slots().norm_backward(args, s.get_device()), "fused norm backward refused checked arguments");
    // x and residual were summed: both get dx.
    return {dx, with_residual ? dx : at::Tensor(), dweight, dbias, at::Tensor(), at::Tensor()};
  }
};

std::optional<std::pair<at::Tensor, at::Tensor>> fused_norm(kernels::NormKind kind, const at::Tensor& x,
                                                            const at::Tensor& residual, const at::Tensor& weight,
                                                            const at::Tensor& bias, double eps) {
  const auto& slots = kernels::cuda_slots();
  if (slots.norm_forward == nullptr || slots.norm_backward == nullptr || !x.is_cuda() || x.dim() < 1) return std::nullopt;
  const auto dtype = kernels::element_dtype_of(x.scalar_type());
  if (!dtype || !kernels::norm_cols_supported(kind, *dtype, x.size(-1)) || x.numel() == 0) return std::nullopt;
  if (!kernel_ready(x) || !kernel_ready(weight) || weight.dim() != 1 || weight.size(0) != x.size(-1) ||
      weight.scalar_type() != x.scalar_type()) {
    return std::nullopt;
  }
  if (bias.defined() && (!kernel_ready(bias) || !bias.sizes().equals(weight.sizes()) ||
                         bias.scalar_type() != x.scalar_type() || weight.device() != bias.device())) {
    return std::nullopt;
  }
  if (residual.defined() &&
      (!kernel_ready(residual) || !residual.sizes().equals(x.sizes()) || residual.scalar_type() != x.scalar_type() ||
       residual.device() != x.device())) {
    return std::nullopt;
  }
  if (weight.device() != x.device()) return std::nullopt;
  const auto optional = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
  const tensor_list out =
      FusedNormFunction::apply(x, optional(residual), weight, optional(bias), static_cast<int64_t>(kind), eps);
  return std::pair{out[0], residual.defined() ? out[1] : x};
}

struct FusedRopeFunction : public torch::autograd::Function<FusedRopeFunction> {
  static void run(const at::Tensor& q, at::Tensor& q_out, const at::Tensor& k, at::Tensor& k_out,
                  const at::Tensor& cos, const at::Tensor& sin, bool backward) {
    const kernels::RopeArgs args{.dtype = *kernels::element_dtype_of(q.scalar_type()),
                                 .batch = q.size(0),
                                 .seq = q.size(1),
                                 .head_dim = q.size(3),
                                 .q = q.data_ptr(),
                                 .q_out = q_out.data_ptr(),
                                 .q_heads = q.size(2),
                                 .k = k.data_ptr(),
                                 .k_out = k_out.data_ptr(),
                                 .k_heads = k.size(2),
                                 .q_row_stride = rope_row_stride(q),
                                 .k_row_stride = rope_row_stride(k),
                                 .cos = cos.data_ptr(),
                                 .sin = sin.data_ptr(),
                                 .backward = backward};
    TORCH_CHECK(kernels::cuda_slots().rope(args, q.get_device()), "fused RoPE refused checked arguments");
  }

  static tensor_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                             const at::Tensor& sin) {
    at::Tensor q_out = at::empty_like(q, at::MemoryFormat::Contiguous), k_out = at::empty_like(k, at::MemoryFormat::Contiguous);
    run(q, q_out, k, k_out, cos, sin, false);
    ctx->save_for_backward({cos, sin});
    // Shapes only (saving q and k would keep the projections alive): for a
    // gradient that is missing because that output went unused.
    ctx->saved_data["q_sizes"] = q.sizes().vec();
    ctx->saved_data["k_sizes"] = k.sizes().vec();
    return {q_out, k_out};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    // grad_for_kernel takes only the dtype from cos when the gradient is there.
    const auto prepared = [&](const at::Tensor& grad, const char* key) {
      return grad.defined() ? grad_for_kernel(grad, saved[0]) : at::zeros(ctx->saved_data[key].toIntVector(), saved[0].options());
    };
    const at::Tensor dq = prepared(grads[0], "q_sizes"), dk = prepared(grads[1], "k_sizes");
    at::Tensor dq_in = at::empty_like(dq), dk_in = at::empty_like(dk);
    run(dq, dq_in, dk, dk_in, saved[0], saved[1], true);
    return {dq_in, dk_in, at::Tensor(), at::Tensor()};
  }
};

struct FusedSwigluFunction : public torch::autograd::Function<FusedSwigluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    at::Tensor out = at::empty_like(gate, at::MemoryFormat::Contiguous);
    const kernels::SwigluArgs args{.dtype = *kernels::element_dtype_of(gate.scalar_type()),
                                   .n = gate.numel(),
                                   .gate = gate.data_ptr(),
                                   .up = up.data_ptr(),
                                   .out = out.data_ptr()};
    TORCH_CHECK(kernels::cuda_slots().swiglu_forward(args, gate.get_device()), "fused SwiGLU refused checked arguments");
    ctx->save_for_backward({gate, up});
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& gate = saved[0];
    const at::Tensor& up = saved[1];
    const at::Tensor dout = grad_for_kernel(grads[0], gate);
    at::Tensor dgate = at::empty_like(gate, at::MemoryFormat::Contiguous), dup = at::empty_like(up, at::MemoryFormat::Contiguous);
    const kernels::SwigluArgs args{.dtype = *kernels::element_dtype_of(gate.scalar_type()),
                                   .n = gate.numel(),
                                   .gate = gate.data_ptr(),
                                   .up = up.data_ptr(),
                                   .dout = dout.data_ptr(),
                                   .dgate = dgate.data_ptr(),
                                   .dup = dup.data_ptr()};
    TORCH_CHECK(kernels::cuda_slots().swiglu_backward(args, gate.get_device()), "fused SwiGLU backward refused its arguments");
    return {dgate, dup};
  }
};

// silu(gate) * up over a merged gate/up projection's output, whose gradient
// comes back in the same merged layout (no concatenation before the merged
// projection's backward).
struct FusedSwigluPackedFunction : public torch::autograd::Function<FusedSwigluPackedFunction> {
  static kernels::SwigluPackedArgs args_for(const at::Tensor& gate_up) {
    const int64_t width = gate_up.size(-1) / 2;
    return {.dtype = *kernels::element_dtype_of(gate_up.scalar_type()),
            .rows = width == 0 ? 0 : gate_up.numel() / (2 * width),
            .width = width,
            .gate_up = gate_up.data_ptr()};
  }

  // gate_up (..., 2F) -> (..., F)
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up) {
    std::vector<int64_t> sizes = gate_up.sizes().vec();
    sizes.back() /= 2;
    at::Tensor out = at::empty(sizes, gate_up.options());
    kernels::SwigluPackedArgs args = args_for(gate_up);
    args.out = out.data_ptr();
    TORCH_CHECK(kernels::cuda_slots().swiglu_packed_forward(args, gate_up.get_device()),
                "fused packed SwiGLU refused checked arguments");
    ctx->save_for_backward({gate_up});
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const at::Tensor gate_up = ctx->get_saved_variables()[0];
    std::vector<int64_t> sizes = gate_up.sizes().vec();
    sizes.back() /= 2;
    const at::Tensor dout = grads[0].defined() ? grad_for_kernel(grads[0], gate_up) : at::zeros(sizes, gate_up.options());
    at::Tensor dgate_up = at::empty_like(gate_up, at::MemoryFormat::Contiguous);
    kernels::SwigluPackedArgs args = args_for(gate_up);
    args.dout = dout.data_ptr();
    args.dgate_up = dgate_up.data_ptr();
    TORCH_CHECK(kernels::cuda_slots().swiglu_packed_backward(args, gate_up.get_device()),
                "fused packed SwiGLU backward refused its arguments");
    return {dgate_up};
  }
};

}  // namespace

std::optional<std::pair<at::Tensor, at::Tensor>> fused_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                                const at::Tensor& weight, double eps) {
  return fused_norm(kernels::NormKind::kRms, x, residual, weight, at::Tensor(), eps);
}

std::optional<std::pair<at::Tensor, at::Tensor>> fused_layer_norm(const at::Tensor& x, const at::Tensor& residual,
                                                                  const at::Tensor& weight, const at::Tensor& bias,
                                                                  double eps) {
  return fused_norm(kernels::NormKind::kLayer, x, residual, weight, bias, eps);
}

std::optional<std::pair<at::Tensor, at::Tensor>> fused_rope(const at::Tensor& q, const at::Tensor& k,
                                                            const at::Tensor& cos, const at::Tensor& sin) {
  if (kernels::cuda_slots().rope == nullptr || !q.is_cuda() || q.dim() != 4 || k.dim() != 4 || cos.dim() != 2 ||
      sin.dim() != 2) {
    return std::nullopt;
  }
  const auto dtype = kernels::element_dtype_of(q.scalar_type());
  if (!dtype || !kernels::rope_head_dim_supported(*dtype, q.size(3))) return std::nullopt;
  for (const at::Tensor* t : {&cos, &sin}) {
    if (!kernel_ready(*t) || t->scalar_type() != q.scalar_type() || t->device() != q.device()) return std::nullopt;
  }
  // q and k may be strided views of a merged q/k/v projection (read in place).
  if (rope_row_stride(k) == 0 || k.scalar_type() != q.scalar_type() || k.device() != q.device()) return std::nullopt;
  // The angles are constants here: a gradient for them would be dropped.
  if (rope_row_stride(q) == 0 || cos.requires_grad() || sin.requires_grad()) return std::nullopt;
  const int64_t t = q.size(1), d = q.size(3);
  if (k.size(0) != q.size(0) || k.size(1) != t || k.size(3) != d || cos.size(0) != t || cos.size(1) != d ||
      !sin.sizes().equals(cos.sizes())) {
    return std::nullopt;
  }
  const tensor_list out = FusedRopeFunction::apply(q, k, cos, sin);
  return std::pair{out[0], out[1]};
}

std::optional<at::Tensor> fused_swiglu(const at::Tensor& gate, const at::Tensor& up) {
  const auto& slots = kernels::cuda_slots();
  // An empty input (an expert no token was routed to) takes the ATen path.
  if (slots.swiglu_forward == nullptr || slots.swiglu_backward == nullptr || !gate.is_cuda() || gate.numel() == 0) {
    return std::nullopt;
  }
  if (!kernels::element_dtype_of(gate.scalar_type()) || up.scalar_type() != gate.scalar_type() ||
      !up.sizes().equals(gate.sizes()) || up.device() != gate.device() || !gate.is_contiguous() ||
      !up.is_contiguous()) {
    return std::nullopt;
  }
  return FusedSwigluFunction::apply(gate, up);
}

namespace {

std::atomic<bool> decode_gemv_on{true};

// Above 2 rows cuBLAS is as fast or faster (bench_gemv, H100: the GEMV at
// 0.5-0.76x of it at 8 rows before the block-wide split of K).
constexpr int64_t kDecodeGemvRows = 2;

// The GEMV's arguments for x (..., K) against weight (N, K), or nullopt.
std::optional<kernels::GemvArgs> gemv_args(const at::Tensor& x, const at::Tensor& weight,
                                           kernels::GemvEpilogue epilogue) {
  if (!decode_gemv_on.load(std::memory_order_relaxed) || kernels::cuda_slots().gemv == nullptr || !x.is_cuda() ||
      at::GradMode::is_enabled() || x.dim() < 1 || weight.dim() != 2 || x.size(-1) != weight.size(1) ||
      weight.scalar_type() != x.scalar_type() || weight.device() != x.device() || !x.is_contiguous() ||
      !weight.is_contiguous()) {
    return std::nullopt;
  }
  const auto dtype = kernels::element_dtype_of(x.scalar_type());
  if (!dtype || x.size(-1) == 0 || x.numel() / x.size(-1) > kDecodeGemvRows) return std::nullopt;
  kernels::GemvArgs args{.dtype = *dtype,
                         .epilogue = epilogue,
                         .rows = x.numel() / x.size(-1),
                         .in_features = weight.size(1),
                         .out_features = weight.size(0),
                         .x = x.data_ptr(),
                         .weight = weight.data_ptr()};
  // Placeholders for the check; the caller sets the output and the residual.
  args.y = x.data_ptr();
  if (epilogue == kernels::GemvEpilogue::kResidual) args.residual = x.data_ptr();
  if (!kernels::gemv_supported(args)) return std::nullopt;
  return args;
}

std::vector<int64_t> sizes_with_last(const at::Tensor& x, int64_t last) {
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = last;
  return sizes;
}

}  // namespace

void set_decode_gemv(bool enabled) { decode_gemv_on.store(enabled); }
bool decode_gemv_enabled() { return decode_gemv_on.load(); }

std::optional<at::Tensor> decode_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  auto args = gemv_args(x, weight, kernels::GemvEpilogue::kNone);
  if (!args) return std::nullopt;
  if (bias.defined()) {
    if (bias.scalar_type() != x.scalar_type() || bias.device() != x.device() || !bias.is_contiguous() ||
        bias.numel() != weight.size(0)) {
      return std::nullopt;
    }
    args->bias = bias.data_ptr();
  }
  at::Tensor y = at::empty(sizes_with_last(x, weight.size(0)), x.options());
  args->y = y.data_ptr();
  if (!kernels::cuda_slots().gemv(*args, x.device().index())) return std::nullopt;
  return y;
}

std::optional<at::Tensor> decode_linear_add(const at::Tensor& x, const at::Tensor& weight, at::Tensor& residual) {
  auto args = gemv_args(x, weight, kernels::GemvEpilogue::kResidual);
  if (!args || residual.scalar_type() != x.scalar_type() || residual.device() != x.device() ||
      !residual.is_contiguous() || residual.numel() != args->rows * weight.size(0) ||
      !kernels::aligned16(residual.data_ptr())) {
    return std::nullopt;
  }
  args->residual = residual.data_ptr();
  args->y = residual.data_ptr();
  if (!kernels::cuda_slots().gemv(*args, x.device().index())) return std::nullopt;
  return residual;
}

std::optional<at::Tensor> decode_gated(const at::Tensor& x, const at::Tensor& gate_up_weight) {
  auto args = gemv_args(x, gate_up_weight, kernels::GemvEpilogue::kGated);
  if (!args) return std::nullopt;
  at::Tensor y = at::empty(sizes_with_last(x, gate_up_weight.size(0) / 2), x.options());
  args->y = y.data_ptr();
  if (!kernels::cuda_slots().gemv(*args, x.device().index())) return std::nullopt;
  return y;
}

std::optional<at::Tensor> fused_swiglu_packed(const at::Tensor& gate_up) {
  const auto launch = kernels::cuda_slots().swiglu_packed_forward;
  if (launch == nullptr || !gate_up.is_cuda() || gate_up.dim() < 1 || gate_up.size(-1) % 2 != 0 ||
      !gate_up.is_contiguous()) {
    return std::nullopt;
  }
  if (gate_up.requires_grad() && at::GradMode::is_enabled()) {
    // Training: the backward kernel too. An empty input takes the ATen path.
    if (kernels::cuda_slots().swiglu_packed_backward == nullptr || gate_up.numel() == 0 ||
        !kernels::element_dtype_of(gate_up.scalar_type())) {
      return std::nullopt;
    }
    return FusedSwigluPackedFunction::apply(gate_up);
  }
  const auto dtype = kernels::element_dtype_of(gate_up.scalar_type());
  if (!dtype) return std::nullopt;
  std::vector<int64_t> sizes = gate_up.sizes().vec();
  const int64_t width = sizes.back() / 2;
  sizes.back() = width;
  at::Tensor out = at::empty(sizes, gate_up.options());
  const kernels::SwigluPackedArgs args{.dtype = *dtype,
                                       .rows = width == 0 ? 0 : out.numel() / width,
                                       .width = width,
                                       .gate_up = gate_up.data_ptr(),
                                       .out = out.data_ptr()};
  if (!launch(args, gate_up.device().index())) return std::nullopt;
  return out;
}

}  // namespace colossus::models

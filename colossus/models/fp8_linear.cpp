#include "colossus/models/fp8_linear.h"

#include "colossus/core/errors.h"
#include "colossus/kernels/aten_element_dtype.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/models/activation_checkpoint.h"
#include "colossus/models/causal_lm.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <mutex>
#include <optional>
#include <typeinfo>
#include <vector>

namespace colossus::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// An operand in FP8 and the fp32 scale that turns it back: value ~ q * scale.
struct Quantized {
  at::Tensor q;      // float8_e4m3fn or float8_e5m2, same shape
  at::Tensor scale;  // fp32: () per tensor, (rows, 1) per row
  at::Tensor q_t;    // where asked for: q transposed, contiguous (per tensor only)
};

double format_max(at::ScalarType format) { return format == at::kFloat8_e5m2 ? 57344.0 : 448.0; }

// The fused kernel's form of quantize (kernels/fp8_quantize.h); nullopt where
// it does not apply (not CUDA, not a contiguous 2-D float tensor, no kernel).
std::optional<Quantized> quantize_fused(const at::Tensor& x, at::ScalarType format, bool rowwise,
                                        bool transposed = false) {
  const auto slot = kernels::cuda_slots().fp8_quantize;
  if (slot == nullptr || !x.is_cuda() || x.dim() != 2 || !x.is_contiguous() || x.numel() == 0) return std::nullopt;
  const auto dtype = kernels::element_dtype_of(x.scalar_type());
  if (!dtype) return std::nullopt;
  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(format));
  at::Tensor scale = rowwise ? at::empty({x.size(0), 1}, f32) : at::empty({}, f32);
  at::Tensor scratch = rowwise ? at::Tensor() : at::empty({1}, f32);
  at::Tensor q_t = transposed ? at::empty({x.size(1), x.size(0)}, x.options().dtype(format)) : at::Tensor();
  const kernels::Fp8QuantizeArgs args{
      .dtype = *dtype,
      .format = format == at::kFloat8_e5m2 ? kernels::Fp8Format::kE5M2 : kernels::Fp8Format::kE4M3,
      .rowwise = rowwise,
      .rows = x.size(0),
      .cols = x.size(1),
      .x = x.data_ptr(),
      .q = q.data_ptr(),
      .scale = scale.data_ptr<float>(),
      .amax_scratch = rowwise ? nullptr : scratch.data_ptr<float>(),
      .q_t = transposed ? q_t.data_ptr() : nullptr};
  if (!slot(args, x.get_device())) return std::nullopt;
  return Quantized{q, scale, q_t};
}

// The scale that puts `amax` on the format's largest value; 1 for 0.
at::Tensor scale_for(const at::Tensor& amax, at::ScalarType format) {
  return at::where(amax > 0, amax / format_max(format), at::ones_like(amax));
}

// x (fp32) divided by `scale`, clamped to the format's range, in the format.
at::Tensor cast_at(const at::Tensor& x32, const at::Tensor& scale, at::ScalarType format) {
  const double top = format_max(format);
  return (x32 / scale).clamp(-top, top).to(format);
}

// Scaled so that the largest magnitude (of the tensor, or of each row) lands
// on the format's largest value; an all-zero tensor or row gets scale 1.
Quantized quantize(const at::Tensor& x, at::ScalarType format, bool rowwise, bool fused) {
  if (fused) {
    if (auto q = quantize_fused(x, format, rowwise)) return *q;
  }
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor scale = scale_for(rowwise ? x32.abs().amax({-1}, /*keepdim=*/true) : x32.abs().max(), format);
  return {cast_at(x32, scale, format), scale};
}

// Per tensor, with the transposed bytes too: one kernel pass where it
// applies, else the bytes above and a transposing copy (the same values).
Quantized quantize_both_layouts(const at::Tensor& x, at::ScalarType format, bool fused) {
  if (fused) {
    if (auto q = quantize_fused(x, format, /*rowwise=*/false, /*transposed=*/true)) return *q;
  }
  Quantized q = quantize(x, format, /*rowwise=*/false, fused);
  q.q_t = q.q.t().contiguous();
  return q;
}

// Delayed scaling: the scale from the largest of `history`'s past maxima
// (the current maximum where there are none yet), values beyond it
// saturated, then the current maximum recorded, newest first.
Quantized quantize_delayed(const at::Tensor& x, at::ScalarType format, at::Tensor& history, int64_t len,
                           bool record) {
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor amax = x32.abs().max();
  if (!history.defined()) history = at::zeros({len}, x32.options());
  const at::Tensor past = history.max();
  const at::Tensor scale = scale_for(at::where(past > 0, past, amax), format);
  Quantized q{cast_at(x32, scale, format), scale, at::Tensor()};
  q.q_t = q.q.t().contiguous();
  if (record) history.copy_(at::cat({amax.reshape({1}), history.narrow(0, 0, len - 1)}));
  return q;
}

// W^T in e4m3 at a given scale (the forward's): the backward's weight operand
// where the forward did not keep it.
at::Tensor quantize_transposed_at(const at::Tensor& w, const at::Tensor& scale) {
  return cast_at(w.to(at::kFloat), scale, at::kFloat8_e4m3fn).t().contiguous();
}

bool fits_scaled_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb) {
  if (a.is_cuda()) {
    // Hopper's FP8 GEMM: every dimension a multiple of 16; not e5m2 x e5m2.
    if (a.size(0) % 16 != 0 || a.size(1) % 16 != 0 || b.size(1) % 16 != 0) return false;
    return !(a.scalar_type() == at::kFloat8_e5m2 && b.scalar_type() == at::kFloat8_e5m2);
  }
  return a.is_cpu() && sa.numel() == 1 && sb.numel() == 1;  // the CPU kernel scales per tensor only
}

// (M, K) x (K, N) from FP8 operands with their scales -> (M, N) in out_dtype,
// fp32 sums. b must be a transposed view of a row-major (N, K) tensor where
// _scaled_mm runs; elsewhere the operands are dequantised and multiplied.
at::Tensor scaled_matmul(const Quantized& a, const Quantized& b_t, at::ScalarType out_dtype) {
  const at::Tensor b = b_t.q;
  const at::Tensor sb = b_t.scale.dim() == 2 ? b_t.scale.t() : b_t.scale;  // per row of (N, K) -> per column of (K, N)
  if (fits_scaled_mm(a.q, b, a.scale, sb)) {
    const at::Tensor bm = b.stride(0) == 1 ? b : b.t().contiguous().t();  // column-major (K, N)
    const at::Tensor am = a.q.is_contiguous() ? a.q : a.q.contiguous();
    const bool rowwise = a.scale.numel() > 1 || sb.numel() > 1;
    // Hopper's rowwise kernel writes bf16 only.
    const at::ScalarType dtype = rowwise ? at::kBFloat16 : out_dtype;
    return at::_scaled_mm(am, bm, a.scale, sb, std::nullopt, std::nullopt, dtype).to(out_dtype);
  }
  return at::matmul(a.q.to(at::kFloat) * a.scale, b.to(at::kFloat) * sb).to(out_dtype);
}

// The last input quantised per tensor at its current maximum: q/k/v_proj
// (and gate/up_proj) read the same x, so it is quantised once for all of
// them, and its FP8 x^T saved once. Keyed by the tensor itself (held, so its
// identity cannot be reused) and its version (an in-place change is a new
// input). Process-wide, not per thread: the first backward clears it, and
// on CUDA the backward runs on the autograd engine's device thread, so a
// per-thread copy would keep the last input through the whole backward.
struct LastInput {
  at::Tensor source;
  int64_t version = 0;
  bool fused = false;
  Quantized quantized;
};
std::mutex last_input_mutex;
std::optional<LastInput> last_input;

Quantized quantize_input(const at::Tensor& x, const at::Tensor& x2, bool fused) {
  std::lock_guard lock(last_input_mutex);
  if (last_input && last_input->source.is_same(x) && last_input->version == x._version() &&
      last_input->fused == fused) {
    return last_input->quantized;
  }
  last_input.reset();  // free the previous one before making the next
  Quantized q = quantize_both_layouts(x2, at::kFloat8_e4m3fn, fused);
  last_input = LastInput{x, x._version(), fused, q};
  return q;
}

void forget_last_input() {
  std::lock_guard lock(last_input_mutex);
  last_input.reset();
}

struct Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
  // history: the layer's Fp8AmaxHistory as an integer (saved_data holds
  // IValues), 0 without delayed scaling; len its length; record: the call's
  // maxima go into it (training, not evaluation). keep_weight: the FP8 W^T
  // is kept for the backward, else W itself (Gemini releases it between).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, bool rowwise, int64_t grad_format_code,
                            bool fused, int64_t history_address, int64_t history_len, bool record,
                            bool keep_weight) {
    auto* history = reinterpret_cast<Fp8AmaxHistory*>(history_address);
    const int64_t in = weight.size(1), out = weight.size(0);
    const at::Tensor x2 = x.reshape({-1, in});
    at::Tensor y;
    if (rowwise) {
      const Quantized xq = quantize(x2, at::kFloat8_e4m3fn, true, fused), wq = quantize(weight, at::kFloat8_e4m3fn, true, fused);
      y = scaled_matmul(xq, {wq.q.t(), wq.scale}, x.scalar_type());
      // The backward quantises x and W per tensor (its contractions run over
      // the dims a forward row scale spans); the tensors themselves are what
      // a plain linear saves.
      ctx->save_for_backward({x2, weight});
    } else {
      // Per tensor the backward's operands are the forward's: kept in FP8 in
      // the layouts the backward's GEMMs take (x^T and W^T, one byte an
      // element), so nothing is quantised or transposed twice.
      const Quantized xq = history ? quantize_delayed(x2, at::kFloat8_e4m3fn, history->x, history_len, record)
                                   : quantize_input(x, x2, fused),
                      wq = history ? quantize_delayed(weight, at::kFloat8_e4m3fn, history->w, history_len, record)
                                   : quantize_both_layouts(weight, at::kFloat8_e4m3fn, fused);
      y = scaled_matmul(xq, {wq.q.t(), wq.scale}, x.scalar_type());
      // W^T costs a byte a parameter from here to the backward; without
      // keep_weight the backward quantises W again at the same scale.
      ctx->save_for_backward({xq.q_t, xq.scale, keep_weight ? wq.q_t : weight, wq.scale});
      ctx->saved_data["keep_weight"] = keep_weight;
      ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
      ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    }
    if (bias && bias->defined()) y = y + bias->to(y.scalar_type());
    ctx->saved_data["rowwise"] = rowwise;
    ctx->saved_data["grad_format"] = grad_format_code;
    ctx->saved_data["fused"] = fused;
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    ctx->saved_data["history"] = history_address;
    ctx->saved_data["history_len"] = history_len;
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = out;
    return y.view(sizes);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    forget_last_input();
    const auto saved = ctx->get_saved_variables();
    const bool fused = ctx->saved_data["fused"].toBool();
    // x^T (K, M) and W^T (K, N) in e4m3 with their scales, and the dtypes of
    // dx and dW.
    at::Tensor x_t, w_t, x_scale, w_scale;
    at::ScalarType x_dtype, w_dtype;
    if (ctx->saved_data["rowwise"].toBool()) {
      const Quantized xq = quantize_both_layouts(saved[0], at::kFloat8_e4m3fn, fused),
                      wq = quantize_both_layouts(saved[1], at::kFloat8_e4m3fn, fused);
      x_t = xq.q_t, x_scale = xq.scale, w_t = wq.q_t, w_scale = wq.scale;
      x_dtype = saved[0].scalar_type(), w_dtype = saved[1].scalar_type();
    } else {
      x_t = saved[0], x_scale = saved[1], w_t = saved[2], w_scale = saved[3];
      if (!ctx->saved_data["keep_weight"].toBool()) {
        // Current scaling recomputes the forward's scale from W (the fused
        // kernel where it applies); delayed scaling quantises at the saved one.
        if (ctx->saved_data["history"].toInt() == 0) {
          const Quantized wq = quantize_both_layouts(w_t, at::kFloat8_e4m3fn, fused);
          w_t = wq.q_t, w_scale = wq.scale;  // the pair from one quantisation
        } else {
          w_t = quantize_transposed_at(w_t, w_scale);
        }
      }
      x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
      w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    }
    const int64_t in = w_t.size(0), out = w_t.size(1);
    const at::Tensor dy = grad_outputs[0].reshape({-1, out});
    const auto format = ctx->saved_data["grad_format"].toInt() == 1 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
    auto* history = reinterpret_cast<Fp8AmaxHistory*>(ctx->saved_data["history"].toInt());
    const Quantized dyq =
        history ? quantize_delayed(dy, format, history->dy, ctx->saved_data["history_len"].toInt(), /*record=*/true)
                : quantize_both_layouts(dy.is_contiguous() ? dy : dy.contiguous(), format, fused);
    // dx (M, K) = dy (M, N) W (N, K): W as the transposed view of W^T.
    const at::Tensor dx = scaled_matmul({dyq.q, dyq.scale}, {w_t.t(), w_scale}, x_dtype);
    // dW (N, K) = dy^T (N, M) x (M, K).
    const at::Tensor dw = scaled_matmul({dyq.q_t, dyq.scale}, {x_t.t(), x_scale}, w_dtype);
    at::Tensor db;
    if (ctx->saved_data["has_bias"].toBool()) db = dy.sum(0).to(w_dtype);
    std::vector<int64_t> sizes = grad_outputs[0].sizes().vec();
    sizes.back() = in;
    return {dx.view(sizes), dw,          db,          at::Tensor(), at::Tensor(),
            at::Tensor(),   at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void Fp8Recipe::validate() const {
  if (grad_format != "e5m2" && grad_format != "e4m3") {
    throw ConfigError(fmt::format("fp8 grad_format is \"{}\"; use \"e5m2\" (the default: range for gradients) or \"e4m3\"",
                                  grad_format));
  }
  if (amax_history_len < 0) {
    throw ConfigError(fmt::format("fp8 amax_history_len is {}; use 0 (current scaling) or a positive length",
                                  amax_history_len));
  }
  if (amax_history_len > 0 && rowwise) {
    throw ConfigError(fmt::format("fp8 amax_history_len = {} needs tensorwise scaling (delayed scaling keeps one "
                                  "maximum a tensor); set fp8_scaling = \"tensorwise\" or amax_history_len = 0",
                                  amax_history_len));
  }
}

at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const Fp8Recipe& recipe,
                      Fp8AmaxHistory* history) {
  TORCH_CHECK(weight.dim() == 2 && x.size(-1) == weight.size(1), "fp8_linear: x ", x.sizes(), " does not fit weight ",
              weight.sizes());
  TORCH_CHECK(recipe.amax_history_len == 0 || history != nullptr,
              "fp8_linear: amax_history_len > 0 needs the layer's Fp8AmaxHistory");
  const bool delayed = recipe.amax_history_len > 0 && !recipe.rowwise;
  if (delayed && in_checkpoint_rerun()) {
    // The rerun would quantise at scales the forward's own maxima have since
    // moved, so its gradients would not be the forward's.
    throw ConfigError(
        "fp8: delayed scaling (amax_history_len > 0) cannot run inside activation checkpointing's rerun; turn one "
        "of them off");
  }
  return Fp8LinearFunction::apply(x, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt,
                                  recipe.rowwise, recipe.grad_format == "e4m3" ? 1 : 0, recipe.fused_quantize,
                                  delayed ? reinterpret_cast<int64_t>(history) : int64_t{0}, recipe.amax_history_len,
                                  /*record=*/at::GradMode::is_enabled(), recipe.keep_weight_for_backward);
}

Fp8Linear::Fp8Linear(const Linear& base, Fp8Recipe recipe) : Linear(base.weight, base.bias), recipe_(std::move(recipe)) {
  recipe_.validate();
}

at::Tensor Fp8Linear::forward(const at::Tensor& x) { return fp8_linear(x, weight, bias, recipe_, history_.get()); }

Fp8Conv1D::Fp8Conv1D(const Conv1D& base, Fp8Recipe recipe) : Conv1D(base.weight, base.bias), recipe_(std::move(recipe)) {
  recipe_.validate();
}

at::Tensor Fp8Conv1D::forward(const at::Tensor& x) { return fp8_linear(x, weight.t(), bias, recipe_, history_.get()); }

int64_t enable_fp8(CausalLM& model, const Fp8Recipe& recipe, bool keep_first_last) {
  recipe.validate();
  const auto& blocks = model.blocks();
  const auto n = static_cast<int64_t>(blocks.size());
  int64_t replaced = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (keep_first_last && n > 2 && (i == 0 || i == n - 1)) continue;
    std::vector<std::shared_ptr<torch::nn::Module>> hosts = {blocks[static_cast<size_t>(i)]};
    for (const auto& child : blocks[static_cast<size_t>(i)]->modules(/*include_self=*/false)) hosts.push_back(child);
    for (const auto& module : hosts) {
      auto* host = dynamic_cast<LayerHost*>(module.get());
      if (host == nullptr) continue;
      for (const auto& child : module->named_children()) {
        torch::nn::Module* leaf = child.value().get();
        // Only plain leaves: not the FP8 forms, a LoRA wrapper or a parallel layer.
        if (typeid(*leaf) == typeid(Linear)) {
          host->replace_layer(child.key(), std::make_shared<Fp8Linear>(*static_cast<Linear*>(leaf), recipe));
        } else if (typeid(*leaf) == typeid(Conv1D)) {
          host->replace_layer(child.key(), std::make_shared<Fp8Conv1D>(*static_cast<Conv1D*>(leaf), recipe));
        } else {
          continue;
        }
        ++replaced;
      }
    }
  }
  return replaced;
}

}  // namespace colossus::models

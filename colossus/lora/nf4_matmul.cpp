#include "colossus/lora/nf4_matmul.h"

#include "colossus/kernels/aten_element_dtype.h"
#include "colossus/kernels/cuda_slots.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <vector>

namespace colossus::lora {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// W (out, in) in `dtype`: by the kernel when the forward used the kernels,
// else by the ATen reference.
at::Tensor dequantized(const Nf4Tensor& weight, const at::Tensor& tables, at::ScalarType dtype, bool fused) {
  return fused ? dequantize_nf4_fused(weight, tables, dtype) : dequantize_nf4(weight, dtype);
}

// x (..., in) contiguous with rows = numel / in in [1, kNf4GemvMaxRows] -> (..., out).
at::Tensor fused_gemv(const at::Tensor& x, const Nf4Tensor& weight, const at::Tensor& tables, const at::Tensor& bias) {
  const int64_t out_features = weight.shape[0], in_features = weight.shape[1];
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = out_features;
  at::Tensor y = at::empty(sizes, x.options());
  const kernels::Nf4GemvArgs args{.weight = nf4_weight_ptrs(weight, tables),
                                  .dtype = *kernels::element_dtype_of(x.scalar_type()),
                                  .rows = x.numel() / in_features,
                                  .x = x.data_ptr(),
                                  .bias = bias.defined() ? bias.data_ptr() : nullptr,
                                  .y = y.data_ptr()};
  TORCH_CHECK(kernels::cuda_slots().nf4_gemv(args, x.get_device()), "NF4 gemv refused checked arguments");
  return y;
}

// Saved: the NF4 storage's own tensors (references, not copies) and the
// tables; W itself is made again in the backward.
struct Nf4LinearFunction : public torch::autograd::Function<Nf4LinearFunction> {
  // bias is optional rather than an undefined tensor: autograd records the
  // device of every tensor argument, which an undefined tensor lacks.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const std::optional<at::Tensor>& bias_arg,
                            const Nf4Tensor& weight, const at::Tensor& tables) {
    const at::Tensor bias = bias_arg.value_or(at::Tensor());
    const bool fused = nf4_kernels_take(x);
    const int64_t rows = x.numel() / weight.shape[1];
    at::Tensor y;
    if (fused && rows >= 1 && rows <= kernels::kNf4GemvMaxRows) {
      y = fused_gemv(x.contiguous(), weight, tables, bias.defined() ? bias.contiguous() : bias);
    } else {
      y = at::linear(x, dequantized(weight, tables, x.scalar_type(), fused), bias);
    }
    ctx->save_for_backward({weight.packed, weight.absmax, weight.absmax_scale, tables});
    ctx->saved_data["shape"] = weight.shape;
    ctx->saved_data["blocksize"] = weight.blocksize;
    ctx->saved_data["double_quant"] = weight.double_quant;
    ctx->saved_data["offset"] = weight.offset;
    ctx->saved_data["fused"] = fused;
    ctx->saved_data["bias"] = bias.defined();
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    Nf4Tensor weight;
    weight.packed = saved[0];
    weight.absmax = saved[1];
    weight.absmax_scale = saved[2];
    weight.shape = ctx->saved_data["shape"].toIntVector();
    weight.blocksize = ctx->saved_data["blocksize"].toInt();
    weight.double_quant = ctx->saved_data["double_quant"].toBool();
    weight.offset = ctx->saved_data["offset"].toDouble();
    const at::Tensor& grad_y = grads[0];
    at::Tensor grad_x, grad_bias;
    // grad_x = grad_y @ W, the gradient that reaches the adapters below
    // this layer (W itself is frozen and gets none).
    if (ctx->needs_input_grad(0)) {
      grad_x = at::matmul(grad_y, dequantized(weight, saved[3], grad_y.scalar_type(), ctx->saved_data["fused"].toBool()));
    }
    // Edges are counted over tensor arguments only: with a bias it is edge 1.
    const bool with_bias = ctx->saved_data["bias"].toBool();
    if (with_bias && ctx->needs_input_grad(1)) grad_bias = grad_y.reshape({-1, grad_y.size(-1)}).sum(0);
    return {grad_x, grad_bias, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool nf4_kernels_take(const at::Tensor& x) {
  const auto& slots = kernels::cuda_slots();
  return slots.nf4_gemv != nullptr && slots.nf4_dequantize != nullptr && x.is_cuda() &&
         kernels::element_dtype_of(x.scalar_type()).has_value();
}

kernels::Nf4WeightPtrs nf4_weight_ptrs(const Nf4Tensor& weight, const at::Tensor& tables) {
  TORCH_CHECK(tables.scalar_type() == at::kFloat && tables.numel() == 16 + 256 && tables.is_contiguous() &&
                  tables.device() == weight.packed.device(),
              "NF4 lookup tables must be nf4_lookup_tables() on the weight's device");
  TORCH_CHECK(weight.packed.is_contiguous() && weight.absmax.is_contiguous(), "NF4 storage must be contiguous");
  const int64_t rows = weight.shape.empty() ? 1 : weight.shape[0];
  const float* table = tables.data_ptr<float>();
  return {.packed = weight.packed.data_ptr<uint8_t>(),
          .absmax = weight.absmax.data_ptr(),
          .absmax_scale = weight.double_quant ? weight.absmax_scale.data_ptr<float>() : nullptr,
          .offset = static_cast<float>(weight.offset),
          .code = table,
          .dynamic_map = table + 16,
          .out_features = rows,
          .in_features = weight.numel() / rows,
          .blocksize = weight.blocksize,
          .double_quant = weight.double_quant};
}

at::Tensor dequantize_nf4_fused(const Nf4Tensor& weight, const at::Tensor& tables, c10::ScalarType dtype) {
  at::Tensor out = at::empty(weight.shape, weight.packed.options().dtype(dtype));
  const auto element = kernels::element_dtype_of(dtype);
  TORCH_CHECK(element && kernels::cuda_slots().nf4_dequantize != nullptr && weight.packed.is_cuda(),
              "the NF4 dequantisation kernel needs a CUDA build, a CUDA weight and fp32 / fp16 / bf16");
  const kernels::Nf4DequantizeArgs args{.weight = nf4_weight_ptrs(weight, tables), .dtype = *element, .out = out.data_ptr()};
  TORCH_CHECK(kernels::cuda_slots().nf4_dequantize(args, weight.packed.get_device()),
              "NF4 dequantisation refused checked arguments");
  return out;
}

at::Tensor nf4_linear(const at::Tensor& x, const Nf4Tensor& weight, const at::Tensor& tables, const at::Tensor& bias) {
  TORCH_CHECK(weight.shape.size() == 2 && x.dim() >= 1 && x.size(-1) == weight.shape[1],
              "nf4_linear: x's last dimension must be the weight's in_features");
  TORCH_CHECK(weight.packed.device() == x.device(), "nf4_linear: the NF4 weight must be on x's device");
  TORCH_CHECK(!bias.defined() || (bias.scalar_type() == x.scalar_type() && bias.numel() == weight.shape[0]),
              "nf4_linear: bias must be (out) in x's dtype");
  const at::Tensor table = tables.defined() ? tables : nf4_lookup_tables(x.device());
  return Nf4LinearFunction::apply(x, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt, weight, table);
}

}  // namespace colossus::lora

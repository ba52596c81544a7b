#include "colossus/models/layers.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/rms_norm.h>

#include "colossus/core/errors.h"
#include "colossus/models/fused_layers.h"

#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/silu.h>
#include <fmt/format.h>

namespace colossus::models {

// Parameters start uninitialised: create_model initialises them by seed and
// load_pretrained overwrites every one of them, so filling here would be work
// thrown away (and impossible on the meta device).

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias, const at::TensorOptions& options)
    : Layer("Linear") {
  weight = register_parameter("weight", at::empty({out_features, in_features}, options));
  if (with_bias) bias = register_parameter("bias", at::empty({out_features}, options));
}

Linear::Linear(at::Tensor weight_, at::Tensor bias_) : Layer("Linear") {
  // requires_grad read before the move: argument order is unspecified.
  const bool weight_grad = weight_.requires_grad();
  weight = register_parameter("weight", std::move(weight_), weight_grad);
  if (bias_.defined()) {
    const bool bias_grad = bias_.requires_grad();
    bias = register_parameter("bias", std::move(bias_), bias_grad);
  }
}

at::Tensor Linear::forward(const at::Tensor& x) {
  // Decode on CUDA (a few rows, autograd off): the GEMV kernel.
  if (auto y = decode_linear(x, weight, bias)) return *y;
  return at::linear(x, weight, bias);
}

Conv1D::Conv1D(int64_t in_features, int64_t out_features, const at::TensorOptions& options) : Layer("Conv1D") {
  weight = register_parameter("weight", at::empty({in_features, out_features}, options));
  bias = register_parameter("bias", at::empty({out_features}, options));
}

Conv1D::Conv1D(at::Tensor weight_, at::Tensor bias_) : Layer("Conv1D") {
  const bool weight_grad = weight_.requires_grad(), bias_grad = bias_.requires_grad();
  weight = register_parameter("weight", std::move(weight_), weight_grad);
  bias = register_parameter("bias", std::move(bias_), bias_grad);
}

// The transposed view costs nothing; at::linear picks the same GEMM as x @ W.
at::Tensor Conv1D::forward(const at::Tensor& x) { return at::linear(x, weight.t(), bias); }

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx_,
                     const at::TensorOptions& options)
    : Layer("Embedding"), padding_idx(padding_idx_) {
  weight = register_parameter("weight", at::empty({num_embeddings, embedding_dim}, options));
}

at::Tensor Embedding::forward(const at::Tensor& ids) { return at::embedding(weight, ids, padding_idx.value_or(-1)); }

LayerNorm::LayerNorm(int64_t dim, double eps_, const at::TensorOptions& options) : Layer("LayerNorm"), eps(eps_) {
  weight = register_parameter("weight", at::empty({dim}, options));
  bias = register_parameter("bias", at::empty({dim}, options));
}

at::Tensor LayerNorm::forward(const at::Tensor& x) {
  if (auto fused = fused_layer_norm(x, at::Tensor(), weight, bias, eps)) return fused->first;
  return at::layer_norm(x, {weight.size(0)}, weight, bias, eps);
}

std::pair<at::Tensor, at::Tensor> LayerNorm::forward_add(const at::Tensor& x, const at::Tensor& residual) {
  if (auto fused = fused_layer_norm(x, residual, weight, bias, eps)) return *fused;
  at::Tensor sum = residual + x;
  return {forward(sum), sum};
}

RMSNorm::RMSNorm(int64_t dim, double eps_, const at::TensorOptions& options) : Layer("RMSNorm"), eps(eps_) {
  weight = register_parameter("weight", at::empty({dim}, options));
}

at::Tensor RMSNorm::forward(const at::Tensor& x) {
  // On CUDA: Colossus's fused kernel (fused_layers.h) where it applies, else
  // ATen's fused kernel, forward and backward (fp32 statistics, one
  // rounding) in place of eight kernels each way; elsewhere HF's exact
  // sequence of operations (the CPU parity tests compare with it bit-closely).
  if (auto fused = fused_rms_norm(x, at::Tensor(), weight, eps)) return fused->first;
  if (x.is_cuda() && x.scalar_type() == weight.scalar_type()) {
    return at::rms_norm(x, {x.size(-1)}, weight, eps);
  }
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * h.to(x.scalar_type());
}

std::pair<at::Tensor, at::Tensor> RMSNorm::forward_add(const at::Tensor& x, const at::Tensor& residual) {
  if (auto fused = fused_rms_norm(x, residual, weight, eps)) return *fused;
  at::Tensor sum = residual + x;
  return {forward(sum), sum};
}

Activation parse_activation(const std::string& name) {
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return Activation::GeluTanh;
  if (name == "gelu") return Activation::Gelu;
  if (name == "relu") return Activation::Relu;
  if (name == "silu") return Activation::Silu;
  throw ConfigError(fmt::format("activation \"{}\" is not supported; use gelu_new, gelu_pytorch_tanh, gelu, relu or silu", name));
}

at::Tensor apply_activation(Activation activation, const at::Tensor& x) {
  switch (activation) {
    case Activation::GeluTanh: return at::gelu(x, "tanh");
    case Activation::Gelu: return at::gelu(x);
    case Activation::Relu: return at::relu(x);
    case Activation::Silu: return at::silu(x);
  }
  TORCH_CHECK(false, "unknown activation");
}

void LayerHost::replace_layer(const std::string& name, std::shared_ptr<Layer> layer) {
  if (!has_layer(name)) {
    std::string known;
    for (const auto& [key, _] : layers_) known += (known.empty() ? "" : ", ") + key;
    throw ConfigError(fmt::format("{} has no layer \"{}\"; its layers are: {}", this->name(), name, known));
  }
  if (!layer) throw ConfigError(fmt::format("replacement for layer \"{}\" of {} is null", name, this->name()));
  replace_module(name, layer);
  layers_[name] = std::move(layer);
}

Layer& LayerHost::layer(const std::string& name) const {
  auto it = layers_.find(name);
  TORCH_CHECK(it != layers_.end(), this->name(), " has no layer ", name);
  return *it->second;
}

void replace_layer(torch::nn::Module& root, const std::string& path, std::shared_ptr<Layer> layer) {
  auto dot = path.rfind('.');
  std::string parent_path = dot == std::string::npos ? "" : path.substr(0, dot);
  std::string leaf = dot == std::string::npos ? path : path.substr(dot + 1);
  torch::nn::Module* parent = &root;
  if (!parent_path.empty()) {
    auto modules = root.named_modules("", /*include_self=*/false);
    auto* found = modules.find(parent_path);
    if (found == nullptr) throw ConfigError(fmt::format("replace_layer: no module at \"{}\" (from path \"{}\")", parent_path, path));
    parent = found->get();
  }
  auto* host = dynamic_cast<LayerHost*>(parent);
  if (host == nullptr) {
    throw ConfigError(fmt::format("replace_layer: \"{}\" is not a layer host, so \"{}\" cannot be replaced", parent_path, path));
  }
  host->replace_layer(leaf, std::move(layer));
}

}  // namespace colossus::models

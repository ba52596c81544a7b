// The leaf layers the models are built from (Linear, HF's Conv1D, Embedding,
// LayerNorm, RMSNorm), all behind one virtual `Layer::forward`, and
// `LayerHost`, the parent that looks its layers up by name at forward time.
// Together they let a tensor-parallel sharder swap `model.layers.3.self_attn.q_proj`
// for a parallel layer from outside (torch's C++ Module has no hooks and a
// parent's typed members would go stale after `replace_module`).
#pragma once
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace colossus::models {

class Layer : public torch::nn::Module {
 public:
  explicit Layer(std::string name) : torch::nn::Module(std::move(name)) {}
  // x: (..., in_features) -> (..., out_features); Embedding: ids (B, T) -> (B, T, C).
  virtual at::Tensor forward(const at::Tensor& x) = 0;
};

// PyTorch's nn.Linear: weight (out, in), y = x W^T + b.
class Linear : public Layer {
 public:
  Linear(int64_t in_features, int64_t out_features, bool with_bias, const at::TensorOptions& options);
  // Over existing tensors (the same parameters, no copy); bias may be undefined.
  Linear(at::Tensor weight, at::Tensor bias);
  // x: (..., in) -> (..., out)
  at::Tensor forward(const at::Tensor& x) override;
  at::Tensor weight;  // (out, in)
  at::Tensor bias;    // (out), undefined without bias
};

// Hugging Face's Conv1D (GPT-2): a linear layer whose weight is stored
// transposed, (in, out), y = x W + b.
class Conv1D : public Layer {
 public:
  Conv1D(int64_t in_features, int64_t out_features, const at::TensorOptions& options);
  // Over existing tensors (the same parameters, no copy).
  Conv1D(at::Tensor weight, at::Tensor bias);
  // x: (..., in) -> (..., out)
  at::Tensor forward(const at::Tensor& x) override;
  at::Tensor weight;  // (in, out)
  at::Tensor bias;    // (out)
};

class Embedding : public Layer {
 public:
  // padding_idx: that row gets no gradient (nn.Embedding's padding_idx).
  Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx,
            const at::TensorOptions& options);
  // ids: (B, T) int64 -> (B, T, C)
  at::Tensor forward(const at::Tensor& ids) override;
  at::Tensor weight;  // (V, C)
  std::optional<int64_t> padding_idx;
};

class LayerNorm : public Layer {
 public:
  LayerNorm(int64_t dim, double eps, const at::TensorOptions& options);
  // x: (..., C) -> (..., C)
  at::Tensor forward(const at::Tensor& x) override;
  // x, residual: (..., C) -> {forward(residual + x), residual + x}; one fused
  // kernel each way on CUDA (fused_layers.h), the two ATen ops elsewhere.
  std::pair<at::Tensor, at::Tensor> forward_add(const at::Tensor& x, const at::Tensor& residual);
  at::Tensor weight;  // (C)
  at::Tensor bias;    // (C)
  double eps;
};

// LLaMA's RMSNorm exactly as HF computes it: normalise in fp32, cast back to
// the input dtype, then scale (so bf16 runs round where HF rounds).
class RMSNorm : public Layer {
 public:
  RMSNorm(int64_t dim, double eps, const at::TensorOptions& options);
  // x: (..., C) -> (..., C)
  at::Tensor forward(const at::Tensor& x) override;
  // x, residual: (..., C) -> {forward(residual + x), residual + x}; one fused
  // kernel each way on CUDA (fused_layers.h), the two ATen ops elsewhere.
  std::pair<at::Tensor, at::Tensor> forward_add(const at::Tensor& x, const at::Tensor& residual);
  at::Tensor weight;  // (C)
  double eps;
};

enum class Activation { GeluTanh, Gelu, Relu, Silu };
// HF names: gelu_new / gelu_pytorch_tanh (tanh approximation), gelu, relu, silu.
Activation parse_activation(const std::string& name);
at::Tensor apply_activation(Activation activation, const at::Tensor& x);

class LayerHost : public torch::nn::Module {
 public:
  explicit LayerHost(std::string name) : torch::nn::Module(std::move(name)) {}

  // Swaps the child layer `name` for `layer`; this host's forward uses it from
  // then on and named_parameters() shows its parameters under the same name.
  // Throws ConfigError when `name` is not one of this host's layers.
  void replace_layer(const std::string& name, std::shared_ptr<Layer> layer);
  bool has_layer(const std::string& name) const { return layers_.contains(name); }
  // Whether this host's forward reads the parameters of layer `name` through
  // a merged tensor of its own (LLaMA's fuse_projections() for inference),
  // bypassing the layer: a replacement of that layer (a LoRA wrapper) would
  // be ignored, so it must be refused.
  virtual bool reads_merged(const std::string& /*name*/) const { return false; }
  Layer& layer(const std::string& name) const;
  template <class T>
  T& layer_as(const std::string& name) const {
    auto* typed = dynamic_cast<T*>(&layer(name));
    TORCH_CHECK(typed != nullptr, "layer ", name, " of ", this->name(), " has an unexpected type");
    return *typed;
  }

 protected:
  template <class T>
  std::shared_ptr<T> add_layer(const std::string& name, std::shared_ptr<T> layer) {
    register_module(name, layer);
    layers_[name] = layer;
    return layer;
  }

 private:
  std::map<std::string, std::shared_ptr<Layer>> layers_;
};

// Replaces the layer at a dotted path from root ("model.layers.3.self_attn.q_proj").
// Throws ConfigError when the path does not end in a replaceable layer.
void replace_layer(torch::nn::Module& root, const std::string& path, std::shared_ptr<Layer> layer);

}  // namespace colossus::models

#include "colossus/lora/lora_linear.h"

#include "colossus/core/errors.h"
#include "colossus/lora/nf4_linear.h"
#include "colossus/parallel/sequence/split_gather.h"
#include "colossus/parallel/tensor/comm.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <fmt/format.h>

#include <cmath>

namespace colossus::lora {

namespace {

// nn.Linear's default (and PEFT's init_lora_weights=true for A):
// kaiming_uniform_(a = sqrt(5)) on a (rows, fan_in) weight is U(-b, b) with
// b = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + a^2)) = sqrt(1/3),
// so b = 1 / sqrt(fan_in).
void kaiming_uniform_a_sqrt5(at::Tensor& weight, at::Generator& generator) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(weight.size(1)));
  weight.uniform_(-bound, bound, generator);
}

std::shared_ptr<torch::nn::Module> weight_holder(const std::string& name, at::Tensor weight) {
  auto holder = std::make_shared<torch::nn::Module>(name);
  holder->register_parameter("weight", std::move(weight));
  return holder;
}

}  // namespace

LoraLinear::LoraLinear(std::shared_ptr<models::Layer> base, int64_t r, double scaling, double dropout, LoraInit init,
                       uint64_t generator_seed, c10::ScalarType adapter_dtype)
    : models::Layer("LoraLinear"), base_(std::move(base)), scaling_(scaling), dropout_(dropout) {
  if (!base_) throw ConfigError("LoraLinear: the base layer is null");
  int64_t in = 0, out = 0;
  if (auto* linear = dynamic_cast<models::Linear*>(base_.get())) {
    base_weight_ = linear->weight;
    base_bias_ = linear->bias;
    out = linear->weight.size(0);
    in = linear->weight.size(1);
  } else if (auto* conv = dynamic_cast<models::Conv1D*>(base_.get())) {
    conv1d_ = true;
    base_weight_ = conv->weight;
    base_bias_ = conv->bias;
    in = conv->weight.size(0);
    out = conv->weight.size(1);
  } else if (auto* nf4 = dynamic_cast<Nf4Linear*>(base_.get())) {
    nf4_base_ = true;  // QLoRA: no full-precision weight to register or merge from
    base_bias_ = nf4->bias;
    out = nf4->out_features();
    in = nf4->in_features();
  } else {
    throw ConfigError(fmt::format("LoRA wraps Linear, Conv1D and NF4 Linear layers; got a {}", base_->name()));
  }
  if (r <= 0) throw ConfigError(fmt::format("LoRA rank r = {} must be positive", r));
  // The same tensors as the base layer's, frozen: registering them here (not
  // the base as a child) keeps the HF names "<path>.weight" / "<path>.bias".
  if (!nf4_base_) register_parameter("weight", base_weight_, /*requires_grad=*/false);
  if (base_bias_.defined()) register_parameter("bias", base_bias_, /*requires_grad=*/false);

  // Values drawn in fp32 on the CPU from one seeded generator (the same
  // numbers on any device), then moved to the base's device.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(generator_seed);
  at::Tensor a = at::empty({r, in}, at::kFloat), b = at::empty({out, r}, at::kFloat);
  {
    at::NoGradGuard no_grad;
    switch (init) {
      case LoraInit::Kaiming:
        kaiming_uniform_a_sqrt5(a, generator);
        b.zero_();
        break;
      case LoraInit::Gaussian:
        a.normal_(0.0, 1.0 / static_cast<double>(r), generator);
        b.zero_();
        break;
      case LoraInit::Off:  // both keep nn.Linear's default init
        kaiming_uniform_a_sqrt5(a, generator);
        kaiming_uniform_a_sqrt5(b, generator);
        break;
    }
  }
  const auto device = nf4_base_ ? static_cast<Nf4Linear&>(*base_).weight().packed.device() : base_weight_.device();
  const auto options = at::TensorOptions().dtype(adapter_dtype).device(device);
  lora_A = a.to(options).set_requires_grad(true);
  lora_B = b.to(options).set_requires_grad(true);
  register_module("lora_A", weight_holder("lora_A", lora_A));
  register_module("lora_B", weight_holder("lora_B", lora_B));
}

at::Tensor LoraLinear::forward(const at::Tensor& x) {
  at::Tensor result = base_->forward(x);  // (..., out), base dtype
  if (use_snapshot) {
    TORCH_CHECK(snapshot_A_.defined(), "LoraLinear: use_snapshot without snapshot()");
    // In the adapters' working dtype and place (a bf16 plugin casts them), so
    // the snapshot is the policy as it started at the policy's own precision.
    if (snapshot_A_.device() != x.device() || snapshot_A_.scalar_type() != lora_A.scalar_type()) {
      snapshot_A_ = snapshot_A_.to(x.device(), lora_A.scalar_type());
      snapshot_B_ = snapshot_B_.to(x.device(), lora_B.scalar_type());
    }
  }
  const at::Tensor& A = use_snapshot ? snapshot_A_ : lora_A;
  at::Tensor B = use_snapshot ? snapshot_B_ : lora_B;
  const c10::ScalarType result_dtype = result.scalar_type();
  at::Tensor lora_x = x.scalar_type() == A.scalar_type() ? x : x.to(A.scalar_type());
  // A row-parallel base that splits a replicated input itself: A_local takes
  // the same slice.
  if (tp_.split == TpSplit::Row && lora_x.size(-1) != A.size(1))
    lora_x = parallel::tensor::scatter_last_dim(lora_x, *tp_.group);
  const at::Tensor dropped = dropout_ > 0.0 ? at::dropout(lora_x, dropout_, is_training()) : lora_x;
  // (..., in) -> (..., r) -> (..., out); result + lora promotes (bf16 + fp32 ->
  // fp32).
  at::Tensor h = at::linear(dropped, A);
  if (tp_.split == TpSplit::Column) {
    h = tp_.sequence_sharded ? parallel::sequence::gather_sequence(h, *tp_.group)
                             : parallel::tensor::copy_to_region(h, *tp_.group);
    if (tp_.replica_slots > 0)
      B = parallel::tensor::sum_replica_grads(B, tp_.replica_slot, tp_.replica_slots, *tp_.group);
  } else if (tp_.split == TpSplit::Row) {
    h = tp_.sequence_sharded ? parallel::sequence::reduce_scatter_sequence(h, *tp_.group)
                             : parallel::tensor::reduce_from_region(h, *tp_.group);
  }
  const at::Tensor lora = at::linear(h, B) * scaling_;
  return (result + lora).to(result_dtype);
}

void LoraLinear::adopt_parallel_base(std::shared_ptr<models::Layer> parallel_base, TpAdapterSplit split,
                                     const at::Tensor& sliced_A, const at::Tensor& sliced_B,
                                     const at::Tensor& sliced_snapshot_A, const at::Tensor& sliced_snapshot_B) {
  if (split.split == TpSplit::None || !split.group || !parallel_base) {
    throw ConfigError("LoraLinear::adopt_parallel_base: needs a parallel base, a split and its group");
  }
  if (tp_.split != TpSplit::None) throw ConfigError("LoraLinear::adopt_parallel_base: already split");
  if (nf4_base_) throw ConfigError("QLoRA (lora.quantize = \"nf4\") does not run under tensor parallelism yet");
  at::NoGradGuard no_grad;
  lora_A.set_data(sliced_A.to(lora_A.options()));
  lora_B.set_data(sliced_B.to(lora_B.options()));
  if (snapshot_A_.defined()) {
    snapshot_A_ = sliced_snapshot_A.to(snapshot_A_.options());
    snapshot_B_ = sliced_snapshot_B.to(snapshot_B_.options());
  }
  base_ = std::move(parallel_base);
  tp_ = std::move(split);
}

void LoraLinear::snapshot() {
  snapshot_A_ = lora_A.detach().clone();
  snapshot_B_ = lora_B.detach().clone();
}

at::Tensor LoraLinear::delta_weight() const {
  if (tp_.split != TpSplit::None)
    throw ConfigError("LoraLinear: a tensor-parallel layer holds a slice; merge from a saved checkpoint instead");
  at::Tensor delta = at::matmul(lora_B, lora_A);  // (out, in)
  if (conv1d_) delta = delta.t();
  return delta * scaling_;
}

std::shared_ptr<models::Layer> LoraLinear::merged() const {
  at::NoGradGuard no_grad;
  // An NF4 base merges into its dequantised fp32 weight (PEFT dequantises to merge too).
  const at::Tensor base_weight =
      nf4_base_ ? static_cast<const Nf4Linear&>(*base_).dequantized_weight(at::kFloat) : base_weight_;
  const at::Tensor weight = (base_weight + delta_weight().to(base_weight.device())).to(base_weight.scalar_type());
  const int64_t in = conv1d_ ? weight.size(0) : weight.size(1), out = conv1d_ ? weight.size(1) : weight.size(0);
  std::shared_ptr<models::Layer> layer;
  if (conv1d_) {
    auto conv = std::make_shared<models::Conv1D>(in, out, base_weight_.options());
    conv->weight.copy_(weight);
    conv->bias.copy_(base_bias_);
    conv->weight.set_requires_grad(false);
    conv->bias.set_requires_grad(false);
    layer = conv;
  } else {
    auto linear = std::make_shared<models::Linear>(in, out, base_bias_.defined(), base_weight.options());
    linear->weight.copy_(weight);
    linear->weight.set_requires_grad(false);
    if (base_bias_.defined()) {
      linear->bias.copy_(base_bias_);
      linear->bias.set_requires_grad(false);
    }
    layer = linear;
  }
  return layer;
}

}  // namespace colossus::lora

#include "colossus/models/causal_lm.h"

#include "colossus/core/errors.h"
#include "colossus/models/linear_cross_entropy.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/tanh.h>
#include <fmt/format.h>

namespace colossus::models {

void check_input_ids(const at::Tensor& input_ids) {
  if (!input_ids.defined() || input_ids.dim() != 2 || input_ids.scalar_type() != at::kLong || input_ids.size(1) < 1) {
    throw ConfigError(fmt::format("input_ids must be a (B, T) int64 tensor with T >= 1; got {}",
                                  input_ids.defined() ? fmt::format("{} {}", c10::toString(input_ids.scalar_type()),
                                                                    c10::str(input_ids.sizes()))
                                                      : std::string("an undefined tensor")));
  }
}

at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels, std::optional<int64_t> num_items) {
  if (logits.dim() != 3 || labels.dim() != 2 || logits.size(0) != labels.size(0) || logits.size(1) != labels.size(1)) {
    throw ConfigError(fmt::format("causal_lm_loss needs logits (B, T, V) and labels (B, T); got {} and {}",
                                  c10::str(logits.sizes()), c10::str(labels.sizes())));
  }
  if (labels.scalar_type() != at::kLong) {
    throw ConfigError(fmt::format("causal_lm_loss needs int64 labels; got {}", c10::toString(labels.scalar_type())));
  }
  if (num_items && *num_items <= 0) throw ConfigError(fmt::format("causal_lm_loss: num_items is {} but must be > 0", *num_items));
  // Position t predicts token t+1; the last position has no target.
  at::Tensor pad = at::full({labels.size(0), 1}, -100, labels.options());
  at::Tensor targets = at::cat({labels.narrow(1, 1, labels.size(1) - 1), pad}, 1).reshape(-1);
  at::Tensor flat = logits.to(at::kFloat).reshape({-1, logits.size(2)});
  if (!num_items) return at::cross_entropy_loss(flat, targets, {}, at::Reduction::Mean, -100);
  return at::cross_entropy_loss(flat, targets, {}, at::Reduction::Sum, -100) / static_cast<double>(*num_items);
}

at::Tensor CausalLM::forward(const at::Tensor& input_ids, const TokenLayout& layout) {
  at::Tensor hidden = embed_layout(input_ids, layout);
  BlockContext context = layout_context(hidden, layout);
  hidden = forward_blocks(hidden, context, 0, blocks_.size());
  return head(final_norm(hidden));
}

at::Tensor CausalLM::embed_layout(const at::Tensor& input_ids, const TokenLayout& layout) {
  if (layout.empty()) return embed(input_ids);
  check_input_ids(input_ids);
  layout.check_against(input_ids);
  if (!layout.position_ids.defined()) return embed(input_ids);
  return embed_at(input_ids, layout.position_ids.to(input_ids.device()), layout.position_limit);
}

BlockContext CausalLM::layout_context(const at::Tensor& hidden, const TokenLayout& layout) const {
  if (layout.empty()) return block_context(hidden);
  const TokenLayout local = layout.to(hidden.device());
  BlockContext context = local.position_ids.defined()
                             ? block_context_at(hidden, local.position_ids, local.position_limit)
                             : block_context(hidden);
  context.document_mask = local.attention_mask();
  if (hidden.is_cuda() && local.document_ids.defined()) context.varlen = varlen_segments(local.document_ids);
  return context;
}

at::Tensor CausalLM::forward_loss(const at::Tensor& input_ids, const at::Tensor& labels, std::optional<int64_t> num_items,
                                  const TokenLayout& layout) {
  at::Tensor hidden = embed_layout(input_ids, layout);
  BlockContext context = layout_context(hidden, layout);
  return head_loss(final_norm(forward_blocks(hidden, context, 0, blocks_.size())), labels, num_items);
}

at::Tensor CausalLM::head_loss(const at::Tensor& hidden, const at::Tensor& labels, std::optional<int64_t> num_items) {
  const at::Tensor* weight = nullptr;
  if (Layer* projection = lm_head()) {
    auto* linear = dynamic_cast<Linear*>(projection);
    if (linear != nullptr && !linear->bias.defined()) weight = &linear->weight;
  } else {
    weight = &embedding().weight;
  }
  // The fused cross-entropy takes plain logits: a soft cap computes them.
  if (weight == nullptr || final_logit_softcap() != 0.0) return loss(head(hidden), labels, num_items);
  return causal_lm_linear_cross_entropy(hidden, *weight, labels, num_items);
}

at::Tensor CausalLM::soft_cap_logits(const at::Tensor& logits) const {
  const double cap = final_logit_softcap();
  return cap == 0.0 ? logits : at::tanh(logits / cap) * cap;
}

at::Tensor CausalLM::forward_blocks(at::Tensor hidden, const BlockContext& context, size_t begin, size_t end) {
  if (begin > end || end > blocks_.size()) {
    throw ConfigError(fmt::format("block range [{}, {}) is outside the model's {} blocks", begin, end, blocks_.size()));
  }
  for (size_t i = begin; i < end; ++i) hidden = blocks_[i]->forward(hidden, context);
  return hidden;
}

void CausalLM::replace_block(size_t index, std::shared_ptr<TransformerBlock> block) {
  if (index >= blocks_.size()) {
    throw ConfigError(fmt::format("replace_block: index {} but the model has {} blocks", index, blocks_.size()));
  }
  if (!block) throw ConfigError(fmt::format("replace_block: block {} is null", index));
  block_container_->replace_module(std::to_string(index), block);
  blocks_[index] = std::move(block);
}

bool CausalLM::tied_embeddings() const { return lm_head() == nullptr; }

void CausalLM::set_blocks(std::shared_ptr<torch::nn::Module> container, std::vector<std::shared_ptr<TransformerBlock>> blocks) {
  for (size_t i = 0; i < blocks.size(); ++i) container->register_module(std::to_string(i), blocks[i]);
  block_container_ = std::move(container);
  blocks_ = std::move(blocks);
}

namespace {

// FNV-1a: stable across compilers and runs, unlike std::hash.
uint64_t seed_for(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

at::Tensor CausalLM::initial_value(const std::string& name, c10::IntArrayRef sizes, uint64_t seed) const {
  at::NoGradGuard no_grad;
  // Drawn on CPU in fp32 so every device and dtype gets the same values.
  at::Tensor values = at::empty(sizes, at::kFloat);
  const InitRule rule = init_rule(name);
  switch (rule.kind) {
    case Init::Zeros: values.zero_(); break;
    case Init::Ones: values.fill_(1.0); break;
    case Init::Normal: {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(seed_for(seed, name));
      values.normal_(0.0, rule.std, generator);
      break;
    }
  }
  after_init_value(name, values);
  return values;
}

void CausalLM::init_weights(uint64_t seed) {
  at::NoGradGuard no_grad;
  for (const auto& item : named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    at::Tensor param = item.value();
    if (param.is_meta()) {
      throw ConfigError(fmt::format("init_weights: parameter {} is on the meta device; materialise it before initialising", name));
    }
    param.copy_(initial_value(name, param.sizes(), seed));
  }
}

}  // namespace colossus::models

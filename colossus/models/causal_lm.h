// The interface every decoder-only model implements: embedding -> block list ->
// final norm -> head, each step reachable on its own, so a pipeline stage runs
// a contiguous range of blocks and ZeRO-3 gathers/releases parameters around
// one block's forward by wrapping it (TransformerBlock::forward is virtual).
#pragma once
#include "colossus/models/attention.h"
#include "colossus/models/config.h"
#include "colossus/models/layers.h"
#include "colossus/models/token_layout.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace colossus::models {

// Replaces the attention core (causal_attention in attention.h) of every
// block: the inference engine routes it through its paged KV cache, sequence
// parallelism through ring/Ulysses attention. The model's own projections,
// RoPE and output projection stay in the model.
class AttentionHook {
 public:
  virtual ~AttentionHook() = default;
  // q: (B, heads, T, D), k/v: (B, kv_heads, T, D), RoPE already applied ->
  // (B, heads, T, D). layer: the block's index in CausalLM::blocks(); spec:
  // its scale, window and soft cap.
  virtual at::Tensor attend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionSpec& spec) = 0;
  // The same from one packed projection before RoPE: qkv (B, T, (heads + 2 *
  // kv_heads) * D), q heads then k then v; cos, signed_sin: the block
  // context's rope_cos and rope_sin_signed. A hook that rotates, caches and
  // attends in fewer kernel launches returns (B, heads, T, D); nullopt (the
  // default) makes the caller split qkv, apply RoPE and call attend().
  virtual std::optional<at::Tensor> attend_packed(int64_t /*layer*/, const at::Tensor& /*qkv*/, int64_t /*heads*/,
                                                  const at::Tensor& /*cos*/, const at::Tensor& /*signed_sin*/,
                                                  const AttentionSpec& /*spec*/) {
    return std::nullopt;
  }
};

// What a block needs besides its hidden state, computed once per forward by
// CausalLM::block_context and shared by all blocks (and pipeline stages).
struct BlockContext {
  at::Tensor rope_cos;  // (T, head_dim) in the hidden dtype; undefined for models without RoPE
  at::Tensor rope_sin;  // (T, head_dim)
  // Inference only: sin with its first half negated, so RoPE is
  // x * cos + roll(x, head_dim / 2) * signed_sin (fewer kernels). May be undefined.
  at::Tensor rope_sin_signed;
  // Gemma 3: the sliding layers' own RoPE (rope_local_base_freq), same
  // layout as the three above; undefined for models with one RoPE.
  at::Tensor local_rope_cos, local_rope_sin, local_rope_sin_signed;
  // (B, 1, T, T) bool: which keys each query may see in padded or packed
  // rows (TokenLayout::attention_mask()); undefined: causal over the row.
  at::Tensor document_mask;
  // The same rows as flash attention's variable-length segments (CUDA only:
  // the attention takes them instead of the mask where it can).
  VarlenSegments varlen;
  // Set by the inference engine (with the index of the block being run);
  // null in training, where attention is causal_attention over the T tokens.
  AttentionHook* attention = nullptr;
  int64_t layer = 0;
};

class TransformerBlock : public LayerHost {
 public:
  using LayerHost::LayerHost;
  // hidden: (B, T, C) -> (B, T, C)
  virtual at::Tensor forward(const at::Tensor& hidden, const BlockContext& context) = 0;
  // Selective activation checkpointing (models/activation_checkpoint.h): from
  // now on the block's MLP keeps only its input and reruns in backward. False
  // where the block has no dense MLP to do that with (mixture-of-experts
  // blocks), and nothing changes.
  virtual bool checkpoint_mlp() { return false; }
};

// HF's base model ("transformer" in GPT-2, "model" in LLaMA): the embedding(s),
// the block list and the final norm live under it, as in HF's parameter names.
class Backbone : public LayerHost {
 public:
  using LayerHost::LayerHost;
  using LayerHost::add_layer;
};

// Throws ConfigError unless input_ids is (B, T) int64 with T >= 1. Token
// values are not checked here (that would sync the GPU); the embedding does.
void check_input_ids(const at::Tensor& input_ids);

// HF's causal-LM loss: labels (B, T) are shifted inside (position t predicts
// token t+1), -100 is ignored, computed in fp32. logits: (B, T, V). Mean over
// the counted tokens, or, with num_items (gradient accumulation / pipeline
// micro-batches), their sum divided by num_items, as HF's num_items_in_batch.
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels, std::optional<int64_t> num_items = std::nullopt);

class CausalLM : public LayerHost {
 public:
  CausalLM(std::string name, ModelConfig config) : LayerHost(std::move(name)), config_(std::move(config)) {}

  const ModelConfig& config() const { return config_; }

  // input_ids: (B, T) int64 -> logits (B, T, V). The default runs
  // head(final_norm(blocks(embed(ids)))) in order; `layout` places the
  // tokens of padded or packed rows (token_layout.h).
  virtual at::Tensor forward(const at::Tensor& input_ids, const TokenLayout& layout = {});

  // input_ids: (B, T) int64 -> hidden (B, T, C), positions included where the model adds them.
  virtual at::Tensor embed(const at::Tensor& input_ids) = 0;
  // hidden: (B, T, C); the context depends only on T, dtype and device.
  virtual BlockContext block_context(const at::Tensor& hidden) const = 0;
  // The same at explicit positions, for decoding with a KV cache: positions
  // (T) int64 on the ids' device, each < position_limit (a host-side bound,
  // so no device sync is needed to size RoPE tables or check GPT-2's n_positions).
  virtual at::Tensor embed_at(const at::Tensor& input_ids, const at::Tensor& positions, int64_t position_limit) = 0;
  virtual BlockContext block_context_at(const at::Tensor& hidden, const at::Tensor& positions,
                                        int64_t position_limit) const = 0;
  // embed / block_context for the tokens of `layout`: at its positions
  // (embed_at / block_context_at, position_ids (B, T)) and with its
  // document mask; the plain ones where the layout has neither.
  at::Tensor embed_layout(const at::Tensor& input_ids, const TokenLayout& layout);
  BlockContext layout_context(const at::Tensor& hidden, const TokenLayout& layout) const;
  // hidden: (B, T, C) -> (B, T, C)
  virtual at::Tensor final_norm(const at::Tensor& hidden) = 0;
  // hidden: (B, T, C) -> logits (B, T, V); uses the embedding weight when
  // tied; soft-capped (soft_cap_logits) where the model caps its logits.
  virtual at::Tensor head(const at::Tensor& hidden) = 0;
  // Gemma 2's final_logit_softcapping c: logits -> c * tanh(logits / c); 0: none.
  virtual double final_logit_softcap() const { return 0.0; }
  // Applies final_logit_softcap() to logits computed outside head() (a
  // vocab-parallel tied head); the identity when there is none.
  at::Tensor soft_cap_logits(const at::Tensor& logits) const;

  // Runs blocks [begin, end): what one pipeline stage owns. hidden: (B, T, C).
  at::Tensor forward_blocks(at::Tensor hidden, const BlockContext& context, size_t begin, size_t end);

  at::Tensor loss(const at::Tensor& logits, const at::Tensor& labels, std::optional<int64_t> num_items = std::nullopt) const {
    return causal_lm_loss(logits, labels, num_items);
  }
  // input_ids, labels: (B, T) -> loss(forward(input_ids), labels, num_items)
  // with the head fused into the cross-entropy (linear_cross_entropy.h): the
  // (B, T, V) logits are never materialised. Falls back to the unfused form
  // when the head is not a bias-free projection of this model's own.
  at::Tensor forward_loss(const at::Tensor& input_ids, const at::Tensor& labels,
                          std::optional<int64_t> num_items = std::nullopt, const TokenLayout& layout = {});
  // forward_loss's last part: hidden (B, T, C), final_norm already applied
  // -> the loss with the head fused into it. For wrappers that run the
  // model's parts themselves (Gemini gathers chunks around each), so their
  // loss is the same arithmetic as forward_loss's.
  at::Tensor head_loss(const at::Tensor& hidden, const at::Tensor& labels,
                       std::optional<int64_t> num_items = std::nullopt);

  const std::vector<std::shared_ptr<TransformerBlock>>& blocks() const { return blocks_; }
  // Puts `block` (e.g. a wrapper that gathers ZeRO-3 shards) at index i, under
  // the same module name, so parameter names keep their HF form.
  void replace_block(size_t index, std::shared_ptr<TransformerBlock> block);

  virtual Embedding& embedding() const = 0;
  virtual Layer& norm() const = 0;
  bool tied_embeddings() const;
  // The output projection, (V, C) weight; nullptr when tied to the embedding.
  // Inference: merges projections that read the same input (LLaMA's q/k/v
  // and gate/up) into one matmul each, the parameters becoming views of the
  // merged tensors (same values, no extra memory). Eval-mode forwards use
  // them; call before any sharding, never after. Default: nothing to merge.
  virtual void fuse_projections() {}
  virtual Layer* lm_head() const = 0;
  // Module path prefix of the blocks in named_parameters(): "transformer.h" or "model.layers".
  virtual std::string blocks_path() const = 0;

  // HF's initialisation, seeded per parameter from (seed, parameter name), so
  // the values do not depend on construction order: a pipeline stage that
  // builds only its blocks, or a sharder that materialises one parameter at a
  // time, gets the same numbers.
  void init_weights(uint64_t seed);
  // The values init_weights(seed) gives parameter `name` of shape `sizes`,
  // computed alone (fp32, CPU): lazy init materialises a meta model's
  // parameters (or only a shard of them) from it, bit-identical to eager init.
  at::Tensor initial_value(const std::string& name, c10::IntArrayRef sizes, uint64_t seed) const;

 protected:
  enum class Init { Normal, Zeros, Ones };
  struct InitRule {
    Init kind = Init::Normal;
    double std = 0.0;
  };
  // The rule for one parameter, by HF name.
  virtual InitRule init_rule(const std::string& name) const = 0;
  // Model-specific touches on one parameter's values after its rule ran
  // (LLaMA's zero padding row of the embedding).
  virtual void after_init_value(const std::string& name, at::Tensor& values) const {
    (void)name;
    (void)values;
  }

  void set_blocks(std::shared_ptr<torch::nn::Module> container, std::vector<std::shared_ptr<TransformerBlock>> blocks);

 private:
  ModelConfig config_;
  std::shared_ptr<torch::nn::Module> block_container_;
  std::vector<std::shared_ptr<TransformerBlock>> blocks_;
};

}  // namespace colossus::models

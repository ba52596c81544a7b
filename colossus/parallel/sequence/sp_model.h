// What a model needs to train with its sequence sharded over an sp group
// (modes ring_attn and all_to_all): the attention hook that routes every
// block's attention core through ring or Ulysses attention, the global
// positions of the local tokens, and the causal-LM loss over a sequence shard.
#pragma once
#include "colossus/cluster/process_group.h"
#include "colossus/models/causal_lm.h"
#include "colossus/parallel/sequence/layout.h"
#include "colossus/parallel/tensor/cross_entropy.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace colossus::parallel::sequence {

enum class SequenceParallelMode { RingAttention, AllToAll };

// ring_attn shards zig-zag (causal balance), all_to_all contiguously.
SequenceLayout layout_of(SequenceParallelMode mode);

// Routes BlockContext::attention through ring/Ulysses attention, causal, over
// `group`, for a sequence of seq_len real tokens (the rest is padding);
// inner_ring_size: ring attention's two-level rings (0: one ring).
class SequenceParallelAttention : public models::AttentionHook {
 public:
  SequenceParallelAttention(cluster::ProcessGroup &group, SequenceParallelMode mode, int64_t seq_len,
                            int64_t inner_ring_size = 0)
      : group_(group), mode_(mode), seq_len_(seq_len), inner_ring_size_(inner_ring_size) {}
  // q: (B, heads, T_local, D), k/v: (B, kv_heads, T_local, D) -> (B, heads,
  // T_local, D).
  // ConfigError for a window shorter than the sequence or a soft cap.
  at::Tensor attend(int64_t layer, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                    const models::AttentionSpec &spec) override;
  // Padded or packed rows, all_to_all: (B, 1, T_pad, T_pad) bool over the
  // whole sequence padded to the sp shards (padded_document_mask).
  at::Tensor document_mask;
  // Padded or packed rows, ring_attn: (B, T_pad) int64 document ids over the
  // sequence padded to the zig-zag shards (-1 in the padded tail); each ring
  // block masks its own part (RingAttentionOptions::documents).
  at::Tensor document_ids;

 private:
  cluster::ProcessGroup &group_;
  SequenceParallelMode mode_;
  int64_t seq_len_;
  int64_t inner_ring_size_;
};

// A TokenLayout's (B, 1, T, T) attention mask grown to (B, 1, T_pad, T_pad)
// for `sp` contiguous shards: padding tokens see only themselves and no real
// token sees them.
at::Tensor padded_document_mask(const at::Tensor &mask, int64_t sp);

// Global positions of this rank's local tokens as a (T_local) int64 tensor on
// `device`; padding positions are clamped to seq_len - 1 (their outputs never
// reach a real token, and the embedding's position table need not grow).
at::Tensor local_position_tensor(int64_t seq_len, cluster::ProcessGroup &group, SequenceLayout layout,
                                 c10::Device device);

// The causal-LM loss (HF's: position t predicts token t+1, -100 ignored, mean
// over counted tokens or sum / num_items) when each sp rank holds a sequence
// shard of the logits. local_logits: (B, T_local, V_local) with `vocab` and
// tp_group (vocab-parallel) or (B, T_local, V) with tp_group null; labels:
// the full (B, T) on every sp rank -> scalar fp32, the full loss on every rank.
// Backward: this rank's share, scaled by sp, because gradient reduction
// averages over the dp x sp ranks while the sequence shards' shares must add.
at::Tensor sequence_parallel_causal_lm_loss(const at::Tensor &local_logits, const at::Tensor &labels,
                                            cluster::ProcessGroup &sp_group, SequenceLayout layout,
                                            const tensor::VocabShard *vocab, cluster::ProcessGroup *tp_group,
                                            std::optional<int64_t> num_items = std::nullopt);

// DPO's per-example log-probabilities from this rank's sequence shard of the
// full-vocabulary logits (local_logits (B, T_local, V), sharded by `layout`),
// for the full labels and example_ids (B, T) (HF shift: logits[:, t] predicts
// labels[:, t + 1]; example_ids -1 for padding): (examples,) fp32 sums of the
// target log-probs, summed over `sp_group` (every rank gets the totals; the
// backward scales by sp, as sequence_parallel_causal_lm_loss's, for gradients
// averaged over dp x sp).
at::Tensor sequence_parallel_example_logps(const at::Tensor &local_logits, const at::Tensor &labels,
                                           const at::Tensor &example_ids, int64_t examples,
                                           cluster::ProcessGroup &sp_group, SequenceLayout layout);

}  // namespace colossus::parallel::sequence

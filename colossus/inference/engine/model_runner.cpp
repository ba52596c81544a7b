#include "colossus/inference/engine/model_runner.h"

#include "colossus/parallel/tensor/comm.h"
#include "colossus/parallel/tensor/layers.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/tensor.h>

#include <algorithm>

namespace colossus::inference {

namespace {

// Routes each block's attention core through the paged cache of this step.
class PagedAttentionHook final : public models::AttentionHook {
 public:
  PagedAttentionHook(KVCache& cache, const AttentionMetadata& meta) : cache_(cache), meta_(meta) {}

  at::Tensor attend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) override {
    // (1, heads, N, D) <-> (N, heads, D)
    const auto rows = [](const at::Tensor& t) { return t.squeeze(0).transpose(0, 1); };
    write_kv_cache(rows(k), rows(v), cache_.keys(layer), cache_.values(layer), meta_.slot_mapping);
    at::Tensor out = paged_attention(rows(q).contiguous(), cache_.keys(layer), cache_.values(layer), meta_, scale);
    return out.transpose(0, 1).unsqueeze(0);
  }

 private:
  KVCache& cache_;
  const AttentionMetadata& meta_;
};

}  // namespace

ModelRunner::ModelRunner(models::CausalLM& model, KVCache& cache, const parallel::plan::ShardedModel* sharded)
    : model_(model), cache_(cache), sharded_(sharded) {}

at::Tensor ModelRunner::run(const std::vector<ScheduledSequence>& batch) {
  at::NoGradGuard no_grad;
  AttentionMetadata meta;
  std::vector<int64_t> ids, positions, slots, sample_rows;
  meta.host_query_start.push_back(0);
  int64_t position_limit = 1;
  for (const ScheduledSequence& item : batch) {
    const Sequence& seq = *item.seq;
    for (int64_t p = seq.num_computed; p < seq.num_computed + item.num_tokens; ++p) {
      ids.push_back(seq.tokens[static_cast<size_t>(p)]);
      positions.push_back(p);
      slots.push_back(cache_.slot(seq, p));
    }
    position_limit = std::max(position_limit, seq.num_computed + item.num_tokens);
    meta.host_query_start.push_back(static_cast<int32_t>(ids.size()));
    meta.host_context_lens.push_back(static_cast<int32_t>(cache_.cache_position(seq, seq.num_computed + item.num_tokens)));
    meta.host_block_tables.emplace_back(seq.blocks.begin(), seq.blocks.end());
    if (item.sample) {
      for (int64_t j = item.num_drafts; j >= 0; --j) sample_rows.push_back(static_cast<int64_t>(ids.size()) - 1 - j);
    }
  }
  const at::Device device = cache_.keys(0).device();
  upload_metadata(meta, slots, device);
  cache_.apply_copies();

  const auto n = static_cast<int64_t>(ids.size());
  at::Tensor input_ids = at::tensor(ids, at::kLong).view({1, n}).to(device);
  at::Tensor position_ids = at::tensor(positions, at::kLong).to(device);
  PagedAttentionHook hook(cache_, meta);
  at::Tensor hidden = model_.embed_at(input_ids, position_ids, position_limit);
  models::BlockContext context = model_.block_context_at(hidden, position_ids, position_limit);
  context.attention = &hook;
  const auto& blocks = model_.blocks();
  for (size_t i = 0; i < blocks.size(); ++i) {
    context.layer = static_cast<int64_t>(i);
    hidden = blocks[i]->forward(hidden, context);
  }
  last_hidden_ = hidden.squeeze(0);
  return logits_at(sample_rows);
}

at::Tensor ModelRunner::logits_at(const std::vector<int64_t>& rows) {
  at::NoGradGuard no_grad;
  at::Tensor index = at::tensor(rows, at::kLong).to(last_hidden_.device());
  at::Tensor selected = last_hidden_.index_select(0, index).unsqueeze(0);  // (1, R, C)
  at::Tensor hidden = model_.final_norm(selected);
  if (sharded_ == nullptr || !sharded_->vocab_parallel_logits) return model_.head(hidden).squeeze(0);  // (R, V)
  at::Tensor local = sharded_->tied_head
                         ? parallel::tensor::vocab_parallel_logits(hidden, model_.embedding().weight, *sharded_->tp_group)
                         : model_.head(hidden);
  return parallel::tensor::gather_last_dim(local, *sharded_->tp_group).narrow(-1, 0, sharded_->vocab.true_vocab).squeeze(0);
}

}  // namespace colossus::inference

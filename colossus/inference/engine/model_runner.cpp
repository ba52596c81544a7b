#include "colossus/inference/engine/model_runner.h"

#include "colossus/kernels/cuda_slots.h"
#include "colossus/parallel/tensor/comm.h"
#include "colossus/parallel/tensor/layers.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>

#include <algorithm>
#include <variant>

namespace colossus::inference {

namespace {

// Routes each block's attention core through the paged cache of this step.
class PagedAttentionHook final : public models::AttentionHook {
 public:
  PagedAttentionHook(KVCache& cache, const AttentionMetadata& meta) : cache_(cache), meta_(meta) {}

  at::Tensor attend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const models::AttentionSpec& spec) override {
    // (1, heads, N, D) <-> (N, heads, D)
    const auto rows = [](const at::Tensor& t) { return t.squeeze(0).transpose(0, 1); };
    write_kv_cache(rows(k), rows(v), cache_.keys(layer), cache_.values(layer), meta_.slot_mapping);
    at::Tensor out = paged_attention(rows(q).contiguous(), cache_.keys(layer), cache_.values(layer), meta_, spec);
    return out.transpose(0, 1).unsqueeze(0);
  }

  std::optional<at::Tensor> attend_packed(int64_t layer, const at::Tensor& qkv, int64_t heads, const at::Tensor& cos,
                                          const at::Tensor& signed_sin, const models::AttentionSpec& spec) override {
    // (1, N, W) -> (N, W); (N, heads, D) -> (1, heads, N, D)
    if (qkv.dim() != 3 || qkv.size(0) != 1) return std::nullopt;
    auto out = paged_attention_packed(qkv.squeeze(0), heads, cos, signed_sin, cache_.keys(layer), cache_.values(layer),
                                      meta_, spec);
    if (!out) return std::nullopt;
    return out->transpose(0, 1).unsqueeze(0);
  }

 private:
  KVCache& cache_;
  const AttentionMetadata& meta_;
};

}  // namespace

// A decode step's fixed buffers and its captured graph, for one batch size.
struct ModelRunner::DecodeGraph {
  int64_t batch = 0;
  std::unique_ptr<kernels::DeviceGraph> graph;
  // Device views into two buffers, each filled by one copy a step from its
  // pinned staging twin: ids|positions|slots and block tables|context lens.
  at::Tensor ids, positions, slots;    // (1, B), (B), (B) int64
  at::Tensor block_tables, context_lens;  // (B, W), (B) int32
  at::Tensor device_longs, device_ints, host_longs, host_ints;
  AttentionMetadata meta;
  at::Tensor hidden;                   // (B, C): the captured forward's output
  at::Tensor logits;                   // (B, V): its final norm and head, captured too
};

ModelRunner::ModelRunner(models::CausalLM& model, KVCache& cache, const parallel::plan::ShardedModel* sharded)
    : model_(model), cache_(cache), sharded_(sharded) {}

ModelRunner::~ModelRunner() = default;

std::string ModelRunner::enable_graphs(int64_t max_batch_size, int64_t max_context_len) {
  const at::Tensor& keys = cache_.keys(0);
  if (!keys.is_cuda()) return fmt::format("the model is on {}, not CUDA", keys.device().str());
  if (kernels::cuda_slots().make_device_graph == nullptr || kernels::cuda_slots().paged_attention == nullptr) {
    return "this build has no CUDA kernels";
  }
  if (sharded_ != nullptr) return "tensor-parallel engines run eagerly (collectives are not captured)";
  // The graph must launch the CUDA decode kernel; the reference path reads
  // host copies of the metadata that a replay would not refresh.
  const int64_t head_dim = keys.size(3);
  const auto handles_head_dim = kernels::cuda_slots().paged_attention_head_dim;
  if (handles_head_dim == nullptr || !handles_head_dim(static_cast<int32_t>(head_dim))) {
    return fmt::format("the CUDA paged-attention kernels do not handle head_dim {}", head_dim);
  }
  graphs_ = true;
  graph_max_batch_ = max_batch_size;
  graph_max_context_ = max_context_len;
  return "";
}

at::Tensor ModelRunner::forward(const at::Tensor& input_ids, const at::Tensor& positions, const AttentionMetadata& meta,
                                int64_t position_limit) {
  PagedAttentionHook hook(cache_, meta);
  at::Tensor hidden = model_.embed_at(input_ids, positions, position_limit);
  models::BlockContext context = model_.block_context_at(hidden, positions, position_limit);
  context.attention = &hook;
  const auto& blocks = model_.blocks();
  for (size_t i = 0; i < blocks.size(); ++i) {
    context.layer = static_cast<int64_t>(i);
    hidden = blocks[i]->forward(hidden, context);
  }
  return hidden.squeeze(0);
}

at::Tensor ModelRunner::run(const std::vector<ScheduledSequence>& batch) {
  at::NoGradGuard no_grad;
  if (graphs_ && graph_eligible(batch)) return run_graph(batch);
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

  // ids | positions | sampled rows in one host buffer, one copy (pinned and
  // asynchronous on CUDA: the host queues the whole step without waiting).
  const auto n = static_cast<int64_t>(ids.size()), rows = static_cast<int64_t>(sample_rows.size());
  at::Tensor host = at::empty({2 * n + rows}, at::TensorOptions().dtype(at::kLong).pinned_memory(device.is_cuda()));
  int64_t* out = host.data_ptr<int64_t>();
  std::copy(ids.begin(), ids.end(), out);
  std::copy(positions.begin(), positions.end(), out + n);
  std::copy(sample_rows.begin(), sample_rows.end(), out + 2 * n);
  const at::Tensor on_device = host.to(device, /*non_blocking=*/true);
  last_hidden_ = forward(on_device.narrow(0, 0, n).view({1, n}), on_device.narrow(0, n, n), meta, position_limit);
  return logits_at_index(on_device.narrow(0, 2 * n, rows));
}

bool ModelRunner::graph_eligible(const std::vector<ScheduledSequence>& batch) const {
  if (static_cast<int64_t>(batch.size()) > graph_max_batch_) return false;
  const int64_t table_width = (graph_max_context_ + cache_.block_size() - 1) / cache_.block_size();
  for (const ScheduledSequence& item : batch) {
    const Sequence& seq = *item.seq;
    if (item.num_tokens != 1 || item.num_drafts != 0 || !item.sample) return false;
    if (cache_.cache_position(seq, seq.num_computed + 1) > graph_max_context_) return false;
    if (static_cast<int64_t>(seq.blocks.size()) > table_width) return false;
  }
  return true;
}

ModelRunner::DecodeGraph& ModelRunner::graph_for(int64_t batch_size) {
  // Buckets: powers of two, and the largest batch itself.
  int64_t bucket = 1;
  while (bucket < batch_size) bucket *= 2;
  bucket = std::min(bucket, graph_max_batch_);
  auto& slot = graphs_by_size_[bucket];
  if (slot) return *slot;

  auto g = std::make_unique<DecodeGraph>();
  g->batch = bucket;
  const at::Device device = cache_.keys(0).device();
  const int64_t width = (graph_max_context_ + cache_.block_size() - 1) / cache_.block_size();
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device);
  const auto ints = at::TensorOptions().dtype(at::kInt).device(device);
  g->device_longs = at::zeros({3 * bucket}, longs);
  g->device_ints = at::ones({bucket * width + bucket}, ints);
  g->ids = g->device_longs.narrow(0, 0, bucket).view({1, bucket});
  g->positions = g->device_longs.narrow(0, bucket, bucket);
  g->slots = g->device_longs.narrow(0, 2 * bucket, bucket);
  g->slots.fill_(-1);  // padding rows write nothing
  g->block_tables = g->device_ints.narrow(0, 0, bucket * width).view({bucket, width});
  g->block_tables.zero_();
  g->context_lens = g->device_ints.narrow(0, bucket * width, bucket);
  g->host_longs = at::empty({3 * bucket}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  g->host_ints = at::empty({bucket * width + bucket}, at::TensorOptions().dtype(at::kInt).pinned_memory(true));
  AttentionMetadata& meta = g->meta;
  meta.slot_mapping = g->slots;
  meta.block_tables = g->block_tables;
  meta.query_start = at::arange(bucket + 1, ints);
  meta.context_lens = g->context_lens;
  // Host copies as the kernels' launch shapes see them: every row a decode
  // token over up to max_context_len tokens (the kernels read the real
  // lengths from the device).
  for (int64_t i = 0; i <= bucket; ++i) meta.host_query_start.push_back(static_cast<int32_t>(i));
  meta.host_context_lens.assign(static_cast<size_t>(bucket), static_cast<int32_t>(graph_max_context_));
  meta.host_block_tables.assign(static_cast<size_t>(bucket), std::vector<int32_t>(static_cast<size_t>(width), 0));
  meta.max_query_len = 1;
  meta.max_context_len = graph_max_context_;
  int64_t position_limit = graph_max_context_;
  if (const auto* gpt2 = std::get_if<models::GPT2Config>(&model_.config())) {
    position_limit = std::min(position_limit, gpt2->n_positions);
  }
  DecodeGraph* raw = g.get();
  const auto body = [this, raw, position_limit] {
    raw->hidden = forward(raw->ids, raw->positions, raw->meta, position_limit);
    // Every decode row draws a token, so the head runs on all of them inside
    // the graph: no eager launches between the replay and the draw.
    raw->logits = model_.head(model_.final_norm(raw->hidden.unsqueeze(0))).squeeze(0);
  };
  body();  // warm-up: lazy initialisation (cuBLAS handles, workspaces) must not happen inside the capture
  g->graph = kernels::cuda_slots().make_device_graph(device.index());
  g->graph->capture(body);
  slot = std::move(g);
  return *slot;
}

at::Tensor ModelRunner::run_graph(const std::vector<ScheduledSequence>& batch) {
  const auto n = static_cast<int64_t>(batch.size());
  DecodeGraph& g = graph_for(n);
  const int64_t b = g.batch, width = g.block_tables.size(1);
  int64_t* longs = g.host_longs.data_ptr<int64_t>();
  int32_t* ints = g.host_ints.data_ptr<int32_t>();
  std::fill(longs, longs + 3 * b, 0);
  std::fill(longs + 2 * b, longs + 3 * b, -1);
  std::fill(ints, ints + b * width, 0);
  std::fill(ints + b * width, ints + b * width + b, 1);
  for (int64_t i = 0; i < n; ++i) {
    const Sequence& seq = *batch[static_cast<size_t>(i)].seq;
    const int64_t p = seq.num_computed;
    longs[i] = seq.tokens[static_cast<size_t>(p)];
    longs[b + i] = p;
    longs[2 * b + i] = cache_.slot(seq, p);
    std::copy(seq.blocks.begin(), seq.blocks.end(), ints + i * width);
    ints[b * width + i] = static_cast<int32_t>(cache_.cache_position(seq, p + 1));
  }
  // The previous step's copies are done: its logits reached the host.
  g.device_longs.copy_(g.host_longs, /*non_blocking=*/true);
  g.device_ints.copy_(g.host_ints, /*non_blocking=*/true);
  cache_.apply_copies();
  g.graph->replay();
  ++graph_replays_;
  last_hidden_ = g.hidden.narrow(0, 0, n);
  // The graph's own buffer: read before the next step replays it.
  return g.logits.narrow(0, 0, n);
}

at::Tensor ModelRunner::logits_at(const std::vector<int64_t>& rows) {
  return logits_at_index(at::tensor(rows, at::kLong).to(last_hidden_.device()));
}

at::Tensor ModelRunner::logits_at_index(const at::Tensor& index) {
  at::NoGradGuard no_grad;
  at::Tensor selected = last_hidden_.index_select(0, index).unsqueeze(0);  // (1, R, C)
  at::Tensor hidden = model_.final_norm(selected);
  if (sharded_ == nullptr || !sharded_->vocab_parallel_logits) return model_.head(hidden).squeeze(0);  // (R, V)
  at::Tensor local = sharded_->tied_head
                         ? model_.soft_cap_logits(parallel::tensor::vocab_parallel_logits(
                               hidden, model_.embedding().weight, *sharded_->tp_group))
                         : model_.head(hidden);
  return parallel::tensor::gather_last_dim(local, *sharded_->tp_group).narrow(-1, 0, sharded_->vocab.true_vocab).squeeze(0);
}

}  // namespace colossus::inference

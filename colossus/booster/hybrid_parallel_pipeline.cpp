#include "colossus/booster/hybrid_parallel_pipeline.h"

#include "colossus/booster/hybrid_parallel_plugin.h"
#include "colossus/core/errors.h"
#include "colossus/parallel/tensor/comm.h"
#include "colossus/parallel/tensor/layers.h"
#include "colossus/parallel/sequence/layout.h"
#include "colossus/zero/low_level/low_level_zero_optimizer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <unordered_set>

namespace colossus::booster {

namespace pp = parallel::pipeline;

namespace {

constexpr int kTiedGradTag = 30000;             // above every schedule channel's tag
constexpr int64_t kGradBucketNumel = 16 << 20;  // elements per dp all-reduce

std::unordered_set<const c10::TensorImpl*> impls_of(const std::vector<at::Tensor>& tensors) {
  std::unordered_set<const c10::TensorImpl*> impls;
  for (const auto& t : tensors) impls.insert(t.unsafeGetTensorImpl());
  return impls;
}

}  // namespace

void validate_pipeline_options(const HybridParallelPluginOptions& o) {
  if (o.pp_size < 1) throw ConfigError(fmt::format("hybrid_parallel.pp_size = {} must be >= 1", o.pp_size));
  if (o.pp_size == 1) {
    if (o.num_model_chunks != 1) {
      throw ConfigError(
          fmt::format("hybrid_parallel.num_model_chunks = {} needs a pipeline; "
                      "use pp_size > 1 or num_model_chunks = 1",
                      o.num_model_chunks));
    }
    return;
  }
  if (o.pp_style == "zbv") {
    throw ConfigError(
        "hybrid_parallel.pp_style = 'zbv' (V-shaped zero bubble) "
        "has not landed yet; use 'zero_bubble' (ZB-H1 order, "
        "same B/W split) or 'interleaved'");
  }
  if (o.pp_style != "1f1b" && o.pp_style != "interleaved" && o.pp_style != "zero_bubble") {
    throw ConfigError(
        fmt::format("hybrid_parallel.pp_style = '{}' is unknown; "
                    "use '1f1b', 'interleaved' or 'zero_bubble'",
                    o.pp_style));
  }
  if (o.pp_style == "interleaved" && o.num_model_chunks < 2) {
    throw ConfigError(
        fmt::format("hybrid_parallel.pp_style = 'interleaved' with num_model_chunks = {}; "
                    "use num_model_chunks = 2 (or more), "
                    "or pp_style '1f1b'",
                    o.num_model_chunks));
  }
  if (o.pp_style != "interleaved" && o.num_model_chunks != 1) {
    throw ConfigError(
        fmt::format("hybrid_parallel.pp_style = '{}' runs one model chunk per "
                    "rank, got num_model_chunks = {}; use 1, or "
                    "pp_style 'interleaved'",
                    o.pp_style, o.num_model_chunks));
  }
  if ((o.num_microbatches > 0) == (o.microbatch_size > 0)) {
    throw ConfigError(
        fmt::format("hybrid_parallel: with pp_size = {} set exactly one of "
                    "num_microbatches (= {}) and microbatch_size (= {}), "
                    "e.g. num_microbatches = {}",
                    o.pp_size, o.num_microbatches, o.microbatch_size, 2 * o.pp_size));
  }
  if (o.num_microbatches < 0 || o.microbatch_size < 0) {
    throw ConfigError(
        fmt::format("hybrid_parallel: num_microbatches = {} / "
                    "microbatch_size = {} must not be negative",
                    o.num_microbatches, o.microbatch_size));
  }
  if (o.pp_style == "interleaved" && o.num_microbatches > 0 && o.num_microbatches % o.pp_size != 0) {
    throw ConfigError(
        fmt::format("hybrid_parallel: the interleaved schedule needs "
                    "num_microbatches to be a multiple of pp_size, got "
                    "num_microbatches = {} with pp_size = {}; use {}",
                    o.num_microbatches, o.pp_size, (o.num_microbatches / o.pp_size + 1) * o.pp_size));
  }
  if (o.zero_stage == 2) {
    // As Colossal-AI: the schedule accumulates every microbatch's gradient in
    // param.grad, which ZeRO-2 would free after each backward.
    throw ConfigError(
        fmt::format("hybrid_parallel.zero_stage = 2 with pp_size = {}: ZeRO-2 does not compose with the pipeline "
                    "(its microbatches accumulate whole gradients); use zero_stage = 1",
                    o.pp_size));
  }
  // Every sequence-parallel mode composes with the pipeline: ring_attn /
  // all_to_all over their own sp axis, split_gather / ring over the tp group
  // (their tp-replicated gradients are summed over tp after the schedule).
  if (!o.num_layers_per_stage.empty() &&
      o.num_layers_per_stage.size() != static_cast<size_t>(o.pp_size * o.num_model_chunks)) {
    throw ConfigError(
        fmt::format("hybrid_parallel.num_layers_per_stage has {} entries; "
                    "pp_size {} x num_model_chunks {} needs {} (or leave it "
                    "empty to balance by parameter count)",
                    o.num_layers_per_stage.size(), o.pp_size, o.num_model_chunks, o.pp_size * o.num_model_chunks));
  }
}

HybridPipelineOptions pipeline_options_of(const HybridParallelPluginOptions& o) {
  return HybridPipelineOptions{.schedule = o.pp_style == "interleaved"   ? pp::ScheduleKind::Interleaved
                                           : o.pp_style == "zero_bubble" ? pp::ScheduleKind::ZeroBubble
                                                                         : pp::ScheduleKind::OneFOneB,
                               .num_model_chunks = o.num_model_chunks,
                               .num_microbatches = o.num_microbatches,
                               .microbatch_size = o.microbatch_size,
                               .overlap_p2p = o.overlap_p2p,
                               .num_layers_per_stage = o.num_layers_per_stage};
}

void HybridParallelModel::attach_pipeline(std::unique_ptr<HybridPipeline> pipeline) {
  pipeline_ = std::move(pipeline);
  // Gradients are synchronised once after the schedule, not from backward
  // hooks.
  if (reducer_) reducer_->set_sync_enabled(false);
  if (partial_reducer_) partial_reducer_->set_sync_enabled(false);
}

at::Tensor HybridParallelModel::pipeline_logits(const at::Tensor& hidden) {
  models::CausalLM& m = *model_;
  // As forward(): a tied head reads the embedding's vocab shard with its
  // copy-to-region.
  at::Tensor logits = sharded_.tied_head ? m.soft_cap_logits(parallel::tensor::vocab_parallel_logits(
                                             hidden, m.embedding().weight, *sharded_.tp_group))
                                         : m.head(hidden);
  if (!sharded_.vocab_parallel_logits || parallel_output_) return logits;
  return parallel::tensor::gather_last_dim(logits, *sharded_.tp_group).narrow(-1, 0, sharded_.vocab.true_vocab);
}

PipelineOutput HybridParallelModel::execute_pipeline(const PipelineBatch& batch, const PipelineCriterion& criterion,
                                                     const std::function<at::Tensor(const at::Tensor&)>& scale_loss,
                                                     bool return_loss, bool return_outputs) {
  if (!pipeline_) {
    throw ConfigError(
        "execute_pipeline: this HybridParallelPlugin has pp_size "
        "= 1; use forward + loss + booster.backward, or "
        "pp_size > 1");
  }
  if (reducer_) reducer_->set_sync_enabled(false);  // a no_sync guard may have turned it back on
  if (partial_reducer_) partial_reducer_->set_sync_enabled(false);
  PipelineCriterion loss_fn = criterion;
  if (!loss_fn) {
    loss_fn = [this](const at::Tensor& logits, const PipelineBatch& microbatch, int64_t num_items) {
      return loss(logits, microbatch.labels, num_items);
    };
  }
  models::CausalLM& m = *model_;
  if (!batch.layout.empty() && (sharded_.sequence != parallel::tensor::SequenceSharding::None || sp_group_)) {
    throw ConfigError(
        "execute_pipeline: padded or packed rows (a token layout) with sequence parallelism are not supported; "
        "drop enable_sequence_parallelism or the layout");
  }
  HybridPipeline::StageHooks hooks;
  hooks.logits = [this](const at::Tensor& hidden) { return pipeline_logits(hidden); };
  // ring_attn / all_to_all: every stage runs this rank's sequence shard at its
  // global positions, attention over the sp group (as forward()).
  namespace ps = parallel::sequence;
  std::optional<ps::SequenceParallelAttention> attention;
  at::Tensor positions;
  const int64_t seq_len = batch.input_ids.defined() && batch.input_ids.dim() == 2 ? batch.input_ids.size(1) : 0;
  if (sharded_.sequence != parallel::tensor::SequenceSharding::None && seq_len > 0) {
    // split_gather / ring, as forward_sequence_sharded: the first stage
    // embeds this tp rank's (B, T_pad/tp, C) shard (padding at the end,
    // positions clamped), blocks keep the shard, the head gathers it back.
    auto& tp = *sharded_.tp_group;
    const int64_t padded = (seq_len + tp.size() - 1) / tp.size() * tp.size(), local_len = padded / tp.size();
    positions = at::arange(padded, batch.input_ids.options()).clamp_max(seq_len - 1);
    hooks.embed = [&, padded, local_len](const at::Tensor& ids, const models::TokenLayout&) {
      at::Tensor padded_ids = padded == seq_len ? ids : at::constant_pad_nd(ids, {0, padded - seq_len}, 0);
      return m.embed_at(padded_ids, positions.narrow(0, tp.rank() * local_len, local_len), seq_len);
    };
    hooks.context = [&](const at::Tensor& hidden, const models::TokenLayout&) {
      return m.block_context_at(hidden, positions, seq_len);
    };
    hooks.logits = [&, padded](const at::Tensor& hidden) {
      at::Tensor logits = sharded_.tied_head ? m.soft_cap_logits(parallel::tensor::vocab_parallel_logits(
                                                 hidden, m.embedding().weight, tp, sharded_.sequence))
                                             : m.head(hidden);
      if (padded != seq_len) logits = logits.narrow(1, 0, seq_len);
      if (!sharded_.vocab_parallel_logits || parallel_output_) return logits;
      return parallel::tensor::gather_last_dim(logits, tp).narrow(-1, 0, sharded_.vocab.true_vocab);
    };
  } else if (sp_group_ && seq_len > 0) {
    const auto layout = ps::layout_of(sp_mode_);
    attention.emplace(*sp_group_, sp_mode_, seq_len, inner_ring_size_);
    positions = ps::local_position_tensor(seq_len, *sp_group_, layout, batch.input_ids.device());
    hooks.embed = [&, layout](const at::Tensor& ids, const models::TokenLayout&) {
      return m.embed_at(ps::shard_sequence(ids, 1, sp_group_->size(), sp_group_->rank(), layout), positions, seq_len);
    };
    hooks.context = [&](const at::Tensor& hidden, const models::TokenLayout&) {
      models::BlockContext context = m.block_context_at(hidden, positions, seq_len);
      context.attention = &*attention;
      return context;
    };
  } else {
    // Padded / packed rows: each microbatch at its own positions and documents.
    hooks.embed = [&m](const at::Tensor& ids, const models::TokenLayout& layout) { return m.embed_layout(ids, layout); };
    hooks.context = [&m](const at::Tensor& hidden, const models::TokenLayout& layout) {
      return m.layout_context(hidden, layout);
    };
  }
  hooks.carry = pipeline_carry_;
  return pipeline_->execute(batch, hooks, loss_fn, scale_loss, return_loss, return_outputs);
}

HybridPipeline::HybridPipeline(models::CausalLM& model, cluster::ProcessGroupPtr pp_group,
                               cluster::ProcessGroupPtr grad_group, HybridPipelineOptions options)
    : model_(model), pp_group_(std::move(pp_group)), grad_group_(std::move(grad_group)), options_(std::move(options)) {
  const int P = pp_group_->size();
  const int r = pp_group_->rank();
  const int C = options_.num_model_chunks;
  const auto& blocks = model_.blocks();
  const auto norm = impls_of(model_.norm().parameters());
  const auto head = model_.lm_head() ? impls_of(model_.lm_head()->parameters()) : decltype(norm){};
  const bool tied = model_.tied_embeddings();
  const c10::TensorImpl* embedding_weight = model_.embedding().weight.unsafeGetTensorImpl();

  // Stage weights in parameters: blocks, the embedding group on the first
  // stage, norm + head (the tied embedding's matmul counts as the head) on the
  // last.
  std::vector<int64_t> block_weights;
  std::unordered_set<const c10::TensorImpl*> in_blocks;
  for (const auto& block : blocks) {
    int64_t numel = 0;
    for (const auto& p : block->parameters()) {
      numel += p.numel();
      in_blocks.insert(p.unsafeGetTensorImpl());
    }
    block_weights.push_back(numel);
  }
  int64_t first_extra = 0, last_extra = 0;
  for (const auto& p : model_.parameters()) {
    const auto* impl = p.unsafeGetTensorImpl();
    if (in_blocks.contains(impl)) continue;
    if (norm.contains(impl) || head.contains(impl)) {
      last_extra += p.numel();
    } else {
      first_extra += p.numel();
      if (tied && impl == embedding_weight) last_extra += p.numel();
    }
  }
  const int V = P * C;
  auto ranges = options_.num_layers_per_stage.empty()
                    ? pp::balance_blocks(block_weights, V, first_extra, last_extra)
                    : pp::ranges_from_counts(options_.num_layers_per_stage, static_cast<int64_t>(blocks.size()));
  if (static_cast<int>(ranges.size()) != V) {
    throw ConfigError(
        fmt::format("hybrid_parallel.num_layers_per_stage has {} entries; "
                    "pp_size {} x num_model_chunks {} needs {}",
                    ranges.size(), P, C, V));
  }
  stages_ = std::make_unique<pp::StageManager>(P, r, C, std::move(ranges));
  runtime_ = std::make_unique<pp::PipelineRuntime>(*stages_, pp_group_, options_.overlap_p2p);

  // Each parameter's owner; this rank keeps its own and frees the rest.
  chunk_params_.assign(static_cast<size_t>(C), {});
  const std::string prefix = model_.blocks_path() + ".";
  at::NoGradGuard no_grad;
  for (auto& item : model_.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    at::Tensor& p = item.value();
    const auto* impl = p.unsafeGetTensorImpl();
    int virtual_stage = 0;
    if (name.starts_with(prefix)) {
      const int64_t index = std::stoll(name.substr(prefix.size(), name.find('.', prefix.size()) - prefix.size()));
      for (int v = 0; v < V; ++v) {
        const auto& range = stages_->all_ranges()[static_cast<size_t>(v)];
        if (index >= range.begin && index < range.end) virtual_stage = v;
      }
    } else if (norm.contains(impl) || head.contains(impl)) {
      virtual_stage = V - 1;
    }
    const int owner = stages_->rank_of(virtual_stage);
    placements_[name] = ParamPlacement{owner, p.sizes().vec()};
    const bool tied_here = tied && impl == embedding_weight && r == P - 1;
    if (tied && impl == embedding_weight) tied_name_ = name;
    if (owner == r || tied_here) {
      held_[name] = p;
      if (owner == r) chunk_params_[static_cast<size_t>(virtual_stage / P)].push_back(p);
      if (tied_here) chunk_params_[static_cast<size_t>(C - 1)].push_back(p);
    } else {
      p.set_data(at::empty({0}, p.options()));
    }
  }
}

int64_t HybridPipeline::microbatches_for(int64_t rows) const {
  // Forward-only (evaluation) runs any number of microbatches, so an eval
  // batch need not divide like a training batch: the largest count that does.
  if (!at::GradMode::is_enabled() && rows > 0) {
    const int64_t wanted = options_.num_microbatches > 0 ? options_.num_microbatches
                                                          : std::max<int64_t>(1, rows / options_.microbatch_size);
    return std::gcd(rows, wanted);
  }
  if (options_.num_microbatches > 0) {
    if (rows % options_.num_microbatches != 0) {
      throw ConfigError(fmt::format(
          "execute_pipeline: the batch has {} rows, which num_microbatches = "
          "{} does not divide; use a batch of {} "
          "rows or num_microbatches dividing {}",
          rows, options_.num_microbatches, (rows / options_.num_microbatches + 1) * options_.num_microbatches, rows));
    }
    return options_.num_microbatches;
  }
  if (rows % options_.microbatch_size != 0) {
    throw ConfigError(
        fmt::format("execute_pipeline: the batch has {} rows, which microbatch_size = {} "
                    "does not divide; use a microbatch_size "
                    "dividing {} (e.g. 1)",
                    rows, options_.microbatch_size, rows));
  }
  return rows / options_.microbatch_size;
}

PipelineOutput HybridPipeline::execute(const PipelineBatch& batch, const StageHooks& hooks,
                                       const PipelineCriterion& criterion,
                                       const std::function<at::Tensor(const at::Tensor&)>& scale_loss, bool return_loss,
                                       bool return_outputs) {
  models::check_input_ids(batch.input_ids);
  const at::Tensor& ids = batch.input_ids;
  const at::Tensor labels = batch.labels.defined() ? batch.labels : ids;
  if (labels.sizes() != ids.sizes()) {
    throw ConfigError(fmt::format("execute_pipeline: labels {} must have the shape of input_ids {}",
                                  c10::str(labels.sizes()), c10::str(ids.sizes())));
  }
  const int64_t rows = ids.size(0), seq_len = ids.size(1);
  const int64_t M = microbatches_for(rows);
  const int64_t mb_rows = rows / M;
  if (!batch.layout.empty()) batch.layout.check_against(ids);
  for (const auto& t : batch.row_tensors) {
    if (!t.defined() || t.dim() == 0 || t.size(0) != rows) {
      throw ConfigError(fmt::format("execute_pipeline: every row tensor needs {} rows (those of input_ids)", rows));
    }
  }
  // Microbatch m: rows [m * mb_rows, (m + 1) * mb_rows) of everything.
  std::vector<PipelineBatch> microbatches(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) {
    PipelineBatch& mb = microbatches[static_cast<size_t>(m)];
    mb.input_ids = ids.narrow(0, m * mb_rows, mb_rows);
    mb.labels = labels.narrow(0, m * mb_rows, mb_rows);
    if (!batch.layout.empty()) mb.layout = batch.layout.rows(m * mb_rows, mb_rows);
    for (const auto& t : batch.row_tensors) mb.row_tensors.push_back(t.narrow(0, m * mb_rows, mb_rows));
  }
  // Every microbatch's loss is its token sum over the whole batch's count, so
  // the shares add up to the batch mean (HF's num_items_in_batch).
  const int64_t num_items = seq_len > 1 ? labels.narrow(1, 1, seq_len - 1).ne(-100).sum().item<int64_t>() : 0;
  const bool forward_only = !at::GradMode::is_enabled();
  const auto actions = forward_only ? pp::forward_only(stages_->num_model_chunks(), M)
                                    : pp::make_schedule(options_.schedule, stages_->pp_size(), stages_->pp_rank(), M,
                                                        stages_->num_model_chunks());

  std::vector<at::Tensor> outputs(static_cast<size_t>(M));
  pp::StageFunctions functions;
  functions.forward = [&](int chunk, int64_t m, const at::Tensor& input) {
    const auto& range = stages_->blocks(chunk);
    const PipelineBatch& mb = microbatches[static_cast<size_t>(m)];
    const PipelineCarry& carry = hooks.carry;
    at::Tensor hidden, carried;
    if (stages_->is_first(chunk)) {
      hidden = hooks.embed(mb.input_ids, mb.layout);
    } else if (carry.numel > 0) {
      // (hidden values..., carried values...) as the previous stage packed them.
      const at::Tensor flat = input.reshape(-1);
      const int64_t hidden_numel = flat.numel() - carry.numel;
      hidden = flat.narrow(0, 0, hidden_numel).view({mb_rows, -1, models::hidden_size(model_.config())});
      carried = flat.narrow(0, hidden_numel, carry.numel).to(at::kFloat);
    } else {
      hidden = input;
    }
    const models::BlockContext context = hooks.context(hidden, mb.layout);
    hidden = model_.forward_blocks(hidden, context, static_cast<size_t>(range.begin), static_cast<size_t>(range.end));
    if (carry.numel > 0) carried = carry.extend(carried, range.begin, range.end);
    if (!stages_->is_last(chunk)) {
      if (carry.numel == 0) return hidden;
      return at::cat({hidden.reshape(-1), carried.to(hidden.scalar_type())});
    }
    at::Tensor logits = hooks.logits(model_.final_norm(hidden));
    if (return_outputs) outputs[static_cast<size_t>(m)] = logits.detach();
    at::Tensor loss = criterion(logits, mb, num_items);
    return carry.numel > 0 ? carry.finish(loss, carried, M) : loss;
  };
  functions.parameters = [this](int chunk) { return chunk_params_.at(static_cast<size_t>(chunk)); };
  functions.scale_loss = scale_loss;

  auto result = runtime_->run(actions, functions, M, {mb_rows, seq_len}, ids.device(), forward_only);
  last_timeline_ = std::move(result.timeline);
  if (!forward_only) sync_gradients();

  PipelineOutput out;
  const int last_rank = stages_->pp_size() - 1;
  const bool last_here = stages_->pp_rank() == last_rank;
  if (return_loss) {
    at::Tensor total = last_here ? at::stack(result.losses).sum().to(at::kFloat).reshape({1})
                                 : at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(ids.device()));
    pp_group_->broadcast(total, last_rank).wait();
    out.loss = total.squeeze(0);
  }
  if (return_outputs && last_here) out.outputs = at::cat(outputs, 0);
  return out;
}

void HybridPipeline::sync_gradients() {
  at::NoGradGuard no_grad;
  if (tied_across_stages() && held_.contains(tied_name_)) {
    // The embedding (first stage) and the tied head (last stage) each hold
    // part of the weight's gradient: both end with the sum (a + b == b + a
    // exactly, so the two copies stay bit-identical).
    at::Tensor& weight = held_.at(tied_name_);
    if (!weight.grad().defined()) weight.mutable_grad() = at::zeros_like(weight);
    const int peer = stages_->pp_rank() == 0 ? stages_->pp_size() - 1 : 0;
    at::Tensor mine = weight.grad().clone();
    at::Tensor theirs = at::empty_like(mine);
    auto sent = pp_group_->send(mine, peer, kTiedGradTag);
    pp_group_->recv(theirs, peer, kTiedGradTag).wait();
    sent.wait();
    weight.mutable_grad().add_(theirs);
  }
  if (zero_) {
    // Its shard groups also sum split_gather's tp-replicated gradients over tp.
    zero_->set_grad_sync(false);
    zero_->reduce_accumulated_grads();
    return;
  }
  if (grad_group_ && grad_group_->size() > 1) {
    // Names in map order: the same on every dp rank of this stage.
    std::vector<at::Tensor> grads;
    for (auto& entry : held_) {
      if (entry.second.grad().defined()) grads.push_back(entry.second.grad());
    }
    average_gradients(grads, *grad_group_);
  }
  if (partial_group_ && partial_group_->size() > 1) {
    // Sum = average x tp: the same buckets, scaled back.
    std::vector<at::Tensor> partial;
    for (const auto& name : partial_names_) {
      auto it = held_.find(name);
      if (it == held_.end()) continue;
      if (!it->second.grad().defined()) it->second.mutable_grad() = at::zeros_like(it->second);
      partial.push_back(it->second.grad());
    }
    average_gradients(partial, *partial_group_);
    for (auto& g : partial) g.mul_(static_cast<double>(partial_group_->size()));
  }
}

void average_gradients(const std::vector<at::Tensor>& grads, cluster::ProcessGroup& group) {
  if (group.size() == 1) return;
  at::NoGradGuard no_grad;
  // Buckets of one dtype, flattened, one all-reduce each.
  size_t i = 0;
  while (i < grads.size()) {
    std::vector<at::Tensor> bucket{grads[i].reshape(-1)};
    int64_t numel = grads[i].numel();
    size_t j = i + 1;
    while (j < grads.size() && grads[j].scalar_type() == grads[i].scalar_type() &&
           numel + grads[j].numel() <= kGradBucketNumel) {
      bucket.push_back(grads[j].reshape(-1));
      numel += grads[j].numel();
      ++j;
    }
    at::Tensor flat = at::cat(bucket);
    group.all_reduce(flat, cluster::ReduceOp::Avg).wait();
    int64_t offset = 0;
    for (size_t k = i; k < j; ++k) {
      grads[k].copy_(flat.narrow(0, offset, grads[k].numel()).view(grads[k].sizes()));
      offset += grads[k].numel();
    }
    i = j;
  }
}

}  // namespace colossus::booster

// GeminiDDP: chunk construction, the gather/release schedule around segments
// and the per-chunk gradient reduce-scatter (see gemini_ddp.h); placement
// changes and the byte accounting are in gemini_memory.cpp.
#include "colossus/zero/gemini/gemini_ddp.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_map>

#include "colossus/cluster/fp8_collectives.h"
#include "colossus/core/errors.h"
#include "colossus/core/precision.h"
#include "colossus/models/activation_checkpoint.h"
#include "colossus/models/lazy_init.h"
#include "colossus/zero/gemini/chunk_storage.h"
#include "colossus/zero/gemini/host_worker.h"

namespace colossus::zero::gemini {

namespace {

class ReadyHook : public torch::autograd::PostAccumulateGradHook {
 public:
  ReadyHook(GeminiDDP* owner, size_t index) : owner_(owner), index_(index) {}
  void operator()(const torch::autograd::Variable&) override { owner_->on_grad_ready(index_); }

 private:
  GeminiDDP* owner_;
  size_t index_;
};

// Which chunks each segment's forward needs: 0 the embedding, 1..L the
// blocks, L+1 the final norm and head (and a tied embedding). A parameter
// belongs to the block that holds it (matched by identity, not by name).
std::vector<std::vector<size_t>> plan_segments(const models::CausalLM& model, const NamedParams& params,
                                               const Layout& layout) {
  const size_t blocks = model.blocks().size();
  std::unordered_map<const c10::TensorImpl*, size_t> segment_of;
  for (size_t i = 0; i < blocks; ++i) {
    for (const auto& p : model.blocks()[i]->parameters()) segment_of[p.unsafeGetTensorImpl()] = i + 1;
  }
  for (const auto& p : model.norm().parameters()) segment_of[p.unsafeGetTensorImpl()] = blocks + 1;
  if (auto* head = model.lm_head()) {
    for (const auto& p : head->parameters()) segment_of[p.unsafeGetTensorImpl()] = blocks + 1;
  }
  const at::Tensor tied_weight = model.tied_embeddings() ? model.embedding().weight : at::Tensor();
  std::vector<std::set<size_t>> segments(blocks + 2);
  for (size_t k = 0; k < params.size(); ++k) {
    const auto& slot = layout.slots[k];
    if (!slot.managed) continue;
    const at::Tensor& p = params[k].second;
    const auto it = segment_of.find(p.unsafeGetTensorImpl());
    segments[it == segment_of.end() ? 0 : it->second].insert(slot.bucket);
    if (tied_weight.defined() && p.is_same(tied_weight)) segments[blocks + 1].insert(slot.bucket);
  }
  std::vector<std::vector<size_t>> out;
  for (const auto& segment : segments) out.emplace_back(segment.begin(), segment.end());
  return out;
}

}  // namespace

GeminiDDP::GeminiDDP(std::shared_ptr<models::CausalLM> model, cluster::ProcessGroupPtr dp_group, c10::Device device,
                     GeminiOptions options)
    : model_(std::move(model)), dp_group_(std::move(dp_group)), device_(device), options_(std::move(options)) {
  if (!model_) throw ConfigError("gemini: the model is null");
  if (!dp_group_) throw ConfigError("gemini: the dp group is null");
  dtype_ = scalar_type_of(parse_precision(options_.precision, "gemini: precision"));
  master_dtype_ = options_.master_weights ? at::kFloat : dtype_;
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) params_.emplace_back(item.key(), item.value());
  std::vector<int64_t> numels;
  for (const auto& [name, p] : params_) {
    if (p.requires_grad()) numels.push_back(p.numel());
  }
  if (numels.empty()) throw ConfigError("gemini: the model has no trainable parameters");
  const int dp = dp_group_->size(), rank = dp_group_->rank();
  chunk_numel_ = search_chunk_size(numels, options_.chunk_search, dp).chunk_numel;
  layout_ = plan_chunks(params_, chunk_numel_, dp, rank);
  const size_t n = layout_.buckets.size();

  segment_chunks_ = plan_segments(*model_, params_, layout_);
  std::vector<bool> listed(n, false);
  for (const auto& segment : segment_chunks_) {
    for (size_t c : segment) {
      if (!listed.at(c)) forward_order_.push_back(c);
      listed[c] = true;
    }
  }
  for (size_t c = 0; c < n; ++c) {
    if (!listed[c]) forward_order_.push_back(c);
  }
  const std::vector<ChunkPlacement> placement = initial_placement(n, dp);

  at::NoGradGuard no_grad;
  materialise_chunks(placement, rank);
  move_unmanaged_to_device();
  ready_.assign(params_.size(), false);
  for (size_t k = 0; k < params_.size(); ++k) {
    if (layout_.slots[k].managed) {
      torch::autograd::impl::set_post_acc_grad_hooks(params_[k].second, std::make_unique<ReadyHook>(this, k));
    }
  }
  for (size_t i = 0; i < model_->blocks().size(); ++i) {
    model_->replace_block(i, std::make_shared<GeminiBlock>(model_->blocks()[i], this, i + 1));
  }
}

// Each chunk's full buffer on the device, the parameters made views into it,
// and this rank's shard (and master) where the placement puts them; the
// values come from each parameter's whole values, one at a time.
void GeminiDDP::materialise_chunks(const std::vector<ChunkPlacement>& placement, int rank) {
  const size_t n = placement.size();
  chunks_.resize(n);
  master_views_.resize(params_.size());
  for (size_t c = 0; c < n; ++c) {
    Chunk& chunk = chunks_[c];
    chunk.layout = layout_.buckets[c];
    chunk.placement = placement[c];
    const at::Tensor& first = params_[chunk.layout.params.front()].second;
    // This rank's part in the parameters' original dtype (masters start at the
    // exact values), cut from each parameter's whole values: with a lazy model
    // only one parameter is ever whole, never the chunk or the model.
    const int64_t shard = chunk.layout.shard_numel;
    const auto staging =
        at::TensorOptions().dtype(first.scalar_type()).device(first.is_meta() ? c10::Device(c10::kCPU) : first.device());
    at::Tensor flat = chunk.placement.keep_gathered ? at::zeros({chunk_numel_}, staging) : at::Tensor();
    at::Tensor own = flat.defined() ? flat.narrow(0, int64_t{rank} * shard, shard) : at::zeros({shard}, staging);
    for (size_t k : chunk.layout.params) {
      const auto& slot = layout_.slots[k];
      if (!flat.defined() && slot.own_numel == 0) continue;
      at::Tensor values = whole_values(k).reshape({-1});
      if (flat.defined()) {
        flat.narrow(0, slot.offset, slot.numel).copy_(values);
      } else {
        own.narrow(0, slot.own_offset, slot.own_numel).copy_(owned_part(values, slot));
      }
    }
    chunk.full = at::empty({chunk_numel_}, at::TensorOptions().device(device_).dtype(dtype_));
    // Views first: slicing checks the storage bounds, which a released chunk
    // has not.
    for (size_t k : chunk.layout.params) {
      const auto& slot = layout_.slots[k];
      at::Tensor& p = params_[k].second;
      at::Tensor view = chunk.full.narrow(0, slot.offset, slot.numel).view(p.sizes());
      if (p.is_meta()) {
        models::rebind_parameter(p, view);
      } else {
        p.set_data(view);
      }
    }
    if (chunk.placement.keep_gathered) {
      chunk.full.copy_(flat);
      chunk.shard = chunk.full.narrow(0, int64_t{rank} * shard, shard);
      chunk.state = Chunk::State::Gathered;
    } else {
      free_storage(chunk.full);
      chunk.shard = host_or_device(own, chunk.placement.param_on_host, dtype_);
    }
    const bool alias = master_dtype_ == dtype_ && chunk.placement.param_on_host == chunk.placement.optim_on_host;
    chunk.master = alias ? chunk.shard : host_or_device(own, chunk.placement.optim_on_host, master_dtype_);
    chunk.grad_shard = at::zeros_like(chunk.master);
    chunk.layout.dtype = dtype_;
    point_views(c);
  }
}

// Everything the chunks do not manage (frozen parameters, buffers) moves to
// the device in the model's precision.
void GeminiDDP::move_unmanaged_to_device() {
  for (size_t k = 0; k < params_.size(); ++k) {
    at::Tensor& p = params_[k].second;
    if (p.requires_grad()) continue;
    at::Tensor values = whole_values(k);
    values = values.to(device_, at::isFloatingType(values.scalar_type()) ? dtype_ : values.scalar_type());
    if (p.is_meta()) {
      models::rebind_parameter(p, values);
    } else {
      p.set_data(values);
    }
  }
  for (auto& item : model_->named_buffers(/*recurse=*/true)) {
    at::Tensor& b = item.value();
    if (b.is_meta()) {
      throw ConfigError(fmt::format("gemini: buffer '{}' is on the meta device; lazy init covers parameters only",
                                    item.key()));
    }
    b.set_data(b.to(device_, at::isFloatingType(b.scalar_type()) ? dtype_ : b.scalar_type()));
  }
}

// Where each chunk starts: the static policy's fractions, or for auto the
// warm-up budget (optimizer side on the host until the first step measured).
std::vector<ChunkPlacement> GeminiDDP::initial_placement(size_t n, int dp) {
  std::vector<ChunkPlacement> placement;
  if (options_.placement_policy == "static") {
    placement =
        static_placement(n, options_.shard_param_frac, options_.offload_optim_frac, options_.offload_param_frac);
  } else if (options_.placement_policy == "auto") {
    warming_up_ = true;
    const auto memory = options_.memory_probe ? options_.memory_probe() : metrics::device_memory();
    if (memory) {
      const int64_t elem = c10::elementSize(dtype_);
      placement =
          auto_placement(n, {.device_budget_bytes = static_cast<int64_t>(static_cast<double>(memory->total_bytes) *
                                                                         (1.0 - options_.warmup_non_model_data_ratio)),
                             .param_shard_bytes = chunk_numel_ / dp * elem,
                             .optim_shard_bytes = 0,
                             .working_bytes = 0,
                             .gpu_margin_mem_ratio = 0.0});
      for (auto& chunk : placement) chunk.optim_on_host = true;  // optimizer side on the host while warming up
    } else {
      placement.assign(n, ChunkPlacement{});  // no device figures: nothing to offload from
    }
  } else {
    throw ConfigError(
        fmt::format("gemini: placement_policy='{}' is unknown; use 'static' or 'auto'", options_.placement_policy));
  }
  return placement;
}

GeminiDDP::~GeminiDDP() {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (layout_.slots[k].managed) torch::autograd::impl::post_acc_grad_hooks(params_[k].second).reset();
  }
  // Put the plain blocks back: the wrappers point at this object.
  for (size_t i = 0; i < model_->blocks().size(); ++i) {
    if (auto* block = dynamic_cast<GeminiBlock*>(model_->blocks()[i].get())) {
      model_->replace_block(i, block->inner());
    }
  }
  try {
    for (size_t c = 0; c < chunks_.size(); ++c) {
      chunks_[c].gather_work.wait();
      chunks_[c].reduce_work.wait();
    }
  } catch (...) {  // a destructor must not throw; the job is ending anyway
  }
}

c10::Device GeminiDDP::place_of(bool on_host) const { return on_host ? c10::Device(c10::kCPU) : device_; }

at::Tensor GeminiDDP::whole_values(size_t k) const {
  const auto& [name, p] = params_[k];
  if (!p.is_meta()) return p.detach();
  if (!options_.param_source) {
    throw ConfigError(fmt::format(
        "gemini: parameter '{}' is on the meta device (lazy init) but no param_source says where its values come "
        "from; pass models::seeded_source(model, seed) or models::checkpoint_source(model, dir)",
        name));
  }
  at::Tensor values = options_.param_source(name, p);
  if (values.sizes() != p.sizes()) {
    throw ConfigError(fmt::format("gemini: param_source gave '{}' shape {}, the model has {}", name,
                                  c10::str(values.sizes()), c10::str(p.sizes())));
  }
  return values;
}

at::Tensor GeminiDDP::host_or_device(const at::Tensor& values, bool on_host, c10::ScalarType dtype) const {
  if (!on_host) return values.to(device_, dtype, /*non_blocking=*/false, /*copy=*/true);
  const bool pin = options_.pin_memory && device_.is_cuda();
  at::Tensor out = at::empty(values.sizes(), at::TensorOptions().device(c10::kCPU).dtype(dtype).pinned_memory(pin));
  out.copy_(values);
  return out;
}

void GeminiDDP::point_views(size_t c) {
  Chunk& chunk = chunks_[c];
  for (size_t k : chunk.layout.params) {
    const auto& slot = layout_.slots[k];
    master_views_[k] = chunk.master.narrow(0, slot.own_offset, slot.own_numel);
    // Host-step chunks have no gradient shard: the optimizer skips them in
    // its own step and takes their bf16 gradients from host_io.
    master_views_[k].mutable_grad() =
        chunk.grad_shard.defined() ? chunk.grad_shard.narrow(0, slot.own_offset, slot.own_numel) : at::Tensor();
  }
}

void GeminiDDP::gather(size_t c, bool in_fp8) {
  Chunk& chunk = chunks_[c];
  if (chunk.state != Chunk::State::Released) return;
  finish_host_update(c);  // its new parameters up first (the host step)
  alloc_storage(chunk.full);
  // A separate send buffer on the device (the shard may be on the host).
  chunk.gather_send = chunk.shard.device() == device_ ? chunk.shard
                                                      : chunk.shard.to(device_, dtype_, /*non_blocking=*/true,
                                                                       /*copy=*/true);
  if (in_fp8) {
    // Blocking. Every rank, this one included, computes with the dequantized
    // chunk, so the replicas agree; `full` is a buffer of its own here (only
    // kept-gathered chunks hold their shard in it, and they never come this
    // way), so the shard and the master keep their exact values.
    cluster::all_gather_fp8(*dp_group_, chunk.full, chunk.gather_send);
    chunk.gather_send.reset();
    chunk.state = Chunk::State::Gathered;
    ++gathers_;
    return;
  }
  chunk.gather_work = dp_group_->all_gather_into(chunk.full, chunk.gather_send);
  chunk.state = Chunk::State::Gathering;
  ++gathers_;
}

void GeminiDDP::wait_gathered(size_t c) {
  Chunk& chunk = chunks_[c];
  if (chunk.state != Chunk::State::Gathering) return;
  chunk.gather_work.wait();
  chunk.gather_send.reset();
  chunk.state = Chunk::State::Gathered;
}

void GeminiDDP::release(size_t c) {
  Chunk& chunk = chunks_[c];
  if (chunk.placement.keep_gathered || chunk.state == Chunk::State::Released) return;
  wait_gathered(c);
  free_storage(chunk.full);
  chunk.state = Chunk::State::Released;
}

void GeminiDDP::release_all() {
  for (size_t c = 0; c < chunks_.size(); ++c) release(c);
}

void GeminiDDP::schedule(size_t segment, bool forward) {
  if (warming_up_) sample_memory();  // the stretch since the last boundary
  const auto& need = segment_chunks_.at(segment);
  // Prefetch: the next chunks in execution order that this segment does not
  // use.
  std::vector<size_t> ahead;
  if (options_.max_prefetch > 0) {
    const auto next = [&](size_t s) -> std::optional<size_t> {
      if (forward) return s + 1 < segment_chunks_.size() ? std::optional<size_t>(s + 1) : std::nullopt;
      return s > 0 ? std::optional<size_t>(s - 1) : std::nullopt;
    };
    for (auto s = next(segment); s && static_cast<int>(ahead.size()) < options_.max_prefetch; s = next(*s)) {
      for (size_t c : segment_chunks_[*s]) {
        if (static_cast<int>(ahead.size()) >= options_.max_prefetch) break;
        if (std::find(need.begin(), need.end(), c) == need.end() &&
            std::find(ahead.begin(), ahead.end(), c) == ahead.end()) {
          ahead.push_back(c);
        }
      }
    }
  }
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const bool wanted =
        std::find(need.begin(), need.end(), c) != need.end() || std::find(ahead.begin(), ahead.end(), c) != ahead.end();
    if (!wanted) release(c);
  }
  for (size_t c : need) gather(c, options_.fp8_communication);
  for (size_t c : ahead) gather(c, options_.fp8_communication);
  for (size_t c : need) wait_gathered(c);
  int64_t gathered = 0;
  for (const auto& chunk : chunks_) gathered += chunk.state != Chunk::State::Released ? 1 : 0;
  max_gathered_ = std::max(max_gathered_, gathered);
  if (warming_up_) {
    sample_memory();  // with this segment's chunks gathered
    start_memory_period();
  }
}

void GeminiDDP::pre_forward(size_t segment) { schedule(segment, /*forward=*/true); }

void GeminiDDP::post_forward(size_t segment, const at::Tensor& output) {
  if (!at::GradMode::is_enabled() || !output.requires_grad()) return;
  output.register_hook([this, segment](const at::TensorBase&) { pre_backward(segment); });
}

void GeminiDDP::pre_backward(size_t segment) {
  if (!in_backward_) start_backward();
  schedule(segment, /*forward=*/false);
}

at::Tensor GeminiDDP::forward(const at::Tensor& input_ids, const models::TokenLayout& layout) {
  return run_segments(input_ids, layout, [this](const at::Tensor& hidden) { return model_->head(hidden); });
}

at::Tensor GeminiDDP::forward_loss(const at::Tensor& input_ids, const at::Tensor& labels,
                                   std::optional<int64_t> num_items, const models::TokenLayout& layout) {
  const at::Tensor device_labels = labels.to(device_);
  return run_segments(input_ids, layout, [&](const at::Tensor& hidden) {
    return model_->head_loss(hidden, device_labels, num_items);
  });
}

at::Tensor GeminiDDP::run_segments(const at::Tensor& input_ids, const models::TokenLayout& layout,
                                   const std::function<at::Tensor(const at::Tensor&)>& head) {
  models::check_input_ids(input_ids);
  const size_t last = segment_chunks_.size() - 1;
  pre_forward(0);
  at::Tensor hidden = model_->embed_layout(input_ids.to(device_), layout);
  post_forward(0, hidden);
  const models::BlockContext context = model_->layout_context(hidden, layout);
  hidden = model_->forward_blocks(hidden, context, 0, model_->blocks().size());
  pre_forward(last);
  at::Tensor output = head(model_->final_norm(hidden));
  post_forward(last, output);
  release_all();
  return output;
}

void GeminiDDP::start_backward() {
  if (grads_pending_step_ && !options_.enable_gradient_accumulation) {
    throw DistError(
        "gemini: a second backward before optimizer.step(); set "
        "enable_gradient_accumulation = true to "
        "accumulate gradients over micro-batches");
  }
  in_backward_ = true;
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& chunk : chunks_) {
    chunk.grads_pending = chunk.layout.params.size();
    chunk.reduce_launched = false;
  }
  models::queue_outer_backward_callback([this] { finish_backward(); });
}

void GeminiDDP::on_grad_ready(size_t k) {
  if (!in_backward_) start_backward();
  if (ready_[k]) {
    throw DistError(
        fmt::format("gemini: parameter '{}' received its gradient "
                    "twice in one backward; each parameter must be "
                    "used once per forward",
                    params_[k].first));
  }
  ready_[k] = true;
  const auto& slot = layout_.slots[k];
  Chunk& chunk = chunks_[slot.bucket];
  at::Tensor& p = params_[k].second;
  at::NoGradGuard no_grad;
  if (!chunk.grad_full.defined()) {
    chunk.grad_full = at::zeros({chunk_numel_}, at::TensorOptions().device(device_).dtype(dtype_));
  }
  chunk.grad_full.narrow(0, slot.offset, slot.numel).copy_(p.grad().reshape({-1}));
  p.mutable_grad().reset();  // no full gradient stays behind
  if (--chunk.grads_pending == 0) launch_reduce(slot.bucket);
}

void GeminiDDP::launch_reduce(size_t c) {
  Chunk& chunk = chunks_[c];
  if (!chunk.grad_full.defined()) {
    chunk.grad_full = at::zeros({chunk_numel_}, at::TensorOptions().device(device_).dtype(dtype_));
  }
  chunk.reduced = at::empty({chunk.layout.shard_numel}, chunk.grad_full.options());
  if (options_.fp8_communication) {
    cluster::reduce_scatter_fp8(*dp_group_, chunk.reduced, chunk.grad_full, cluster::ReduceOp::Avg);
  } else {
    chunk.reduce_work = dp_group_->reduce_scatter(chunk.reduced, chunk.grad_full, cluster::ReduceOp::Avg);
  }
  chunk.reduce_launched = true;
  // The chunk launched before this one had a chunk's worth of backward to
  // finish its reduce: settle it now, so its full-size gradient buffer goes
  // (backward never holds more than two) and, under the host step, its copy
  // to the host runs while backward goes on.
  if (unsettled_) settle(*unsettled_);
  unsettled_ = c;
}

void GeminiDDP::settle(size_t c) {
  Chunk& chunk = chunks_[c];
  at::NoGradGuard no_grad;
  chunk.reduce_work.wait();
  if (host_steps(chunk)) {
    send_to_host(c);  // gemini_host_step.cpp
  } else {
    at::Tensor part = chunk.reduced.to(chunk.grad_shard.device(), chunk.grad_shard.scalar_type());
    if (grads_pending_step_) {
      chunk.grad_shard.add_(part);
    } else {
      chunk.grad_shard.copy_(part);
    }
    if (host_step_) record_chunk_stats(c, chunk.grad_shard);
  }
  chunk.reduced.reset();
  chunk.grad_full.reset();
}

void GeminiDDP::finish_backward() {
  if (!in_backward_) return;
  in_backward_ = false;
  // Chunks whose gradients did not all arrive count the missing ones as zero
  // (same order on every rank).
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (!chunks_[c].reduce_launched) launch_reduce(c);
  }
  if (unsettled_) settle(*unsettled_);
  unsettled_.reset();
  if (host_step_) send_grad_stats();
  grads_pending_step_ = true;
  if (warming_up_) sample_memory();
  release_all();
}

void GeminiDDP::set_grad_sync(bool enabled) {
  if (!enabled && !options_.enable_gradient_accumulation) {
    throw ConfigError(
        "gemini: no_sync needs enable_gradient_accumulation = true (gradients "
        "are reduce-scattered every "
        "backward and summed in the shards; no full gradient is kept)");
  }
}

void GeminiDDP::after_step() {
  // Host-step chunks' shards were sent by upload_host_step (or, after a
  // skipped step, still hold the masters' values).
  copy_shards_from_masters(/*skip_host_step=*/true);
  grads_pending_step_ = false;
}

void GeminiDDP::shards_from_masters() {
  finish_host_updates();
  copy_shards_from_masters(/*skip_host_step=*/false);
}

void GeminiDDP::copy_shards_from_masters(bool skip_host_step) {
  at::NoGradGuard no_grad;
  const int rank = dp_group_->rank();
  for (auto& chunk : chunks_) {
    if (skip_host_step && host_steps(chunk)) continue;
    if (!chunk.master.is_same(chunk.shard)) chunk.shard.copy_(chunk.master);
    if (chunk.placement.keep_gathered) {
      const int64_t shard = chunk.layout.shard_numel;
      at::Tensor send = chunk.full.narrow(0, int64_t{rank} * shard, shard).clone();
      dp_group_->all_gather_into(chunk.full, send).wait();
    }
  }
}

GeminiBlock::GeminiBlock(std::shared_ptr<models::TransformerBlock> inner, GeminiDDP* ddp, size_t segment)
    : TransformerBlock("GeminiBlock"), inner_(std::move(inner)), ddp_(ddp), segment_(segment) {
  for (const auto& child : inner_->named_children()) register_module(child.key(), child.value());
}

at::Tensor GeminiBlock::forward(const at::Tensor& hidden, const models::BlockContext& context) {
  ddp_->pre_forward(segment_);
  at::Tensor out = inner_->forward(hidden, context);
  ddp_->post_forward(segment_, out);
  return out;
}

}  // namespace colossus::zero::gemini

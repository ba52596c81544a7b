// LowLevelZeroOptimizer: ZeRO stage 1 (optimizer state sharded) and stage 2
// (gradients too) around any optimizer. Model parameters become views into
// per-bucket flat buffers (bucket_store.h); each dp rank keeps an fp32 master
// of its chunk of every bucket (for fp32 parameters, the chunk itself) and the
// inner optimizer steps one view of that
// master per parameter (possibly empty), so elementwise optimizers are exact
// and Lamb gets its whole-parameter norms through a reducer. Gradients are
// reduce-scattered bucket by bucket from post-accumulate-grad hooks while
// backward runs; after the step the updated chunks are all-gathered back.
#pragma once
#include "colossus/amp/clip_grad.h"
#include "colossus/amp/loss_scaler.h"
#include "colossus/cluster/process_group.h"
#include "colossus/models/lazy_init.h"
#include "colossus/optim/optimizer.h"
#include "colossus/zero/low_level/bucket_store.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace colossus::zero {

struct ShardedStateLayout;  // optimizer_state.h

struct LowLevelZeroOptions {
  int stage = 1;                   // 1: optimizer state sharded; 2: gradients too
  std::string precision = "fp32";  // model parameter dtype: fp32, bf16, fp16 (loss-scaled)
  amp::LossScalerOptions loss_scaler = {};
  double max_norm = 0.0;  // > 0: clip to this global norm (over the shards)
  double norm_type = 2.0;
  int64_t bucket_numel = 12 << 20;  // elements per reduce-scatter / all-gather bucket
  // dtype gradients travel in (undefined: the parameters' dtype).
  std::optional<c10::ScalarType> communication_dtype = std::nullopt;
  // Gradients reduce-scattered and the updated parameters all-gathered in FP8
  // e4m3 with per-bucket scales (cluster/fp8_collectives.h; blocking, so
  // overlap_allgather has nothing to overlap). The model's working weights are
  // then e4m3 roundings of the masters, the same on every rank (each takes the
  // dequantized gather, its own chunk included); the masters stay exact, kept
  // apart from the parameters even where they could alias them. The plugin
  // refuses it with fp16's loss-scaled gradients.
  bool fp8_communication = false;
  bool overlap_communication = true;  // reduce-scatter while backward runs, not after it
  bool overlap_allgather = false;     // all-gather after the step; wait at the next forward
  bool cpu_offload = false;           // masters and optimizer state on CPU
  bool master_weights = true;         // false: step the bf16/fp16 chunk itself
  // Model parallelism around the dp shards (HybridParallelPlugin: tp, or
  // pp x tp): the ranks holding the model's other parts. Norms and the fp16
  // overflow flag are reduced over it after dp, each parameter's norm term
  // divided by norm_replicas[k] (params order; empty: 1 each), the number of
  // its ranks holding that parameter (tp-replicated: tp), so it counts once.
  cluster::ProcessGroupPtr model_parallel_group = nullptr;
  std::vector<int64_t> norm_replicas;
  // Lazy init: parameters on the meta device take their values from this
  // source bucket by bucket, placed on `lazy_device`, so no rank holds the
  // model in fp32 before its buckets and master shards exist.
  models::ParamSource param_source = {};
  c10::Device lazy_device = c10::kCPU;
};

// A part of the parameters sharded over its own ranks. MoE: the dense part
// over the whole dp, the experts over moe_dp (each ep rank holds other experts).
struct ShardGroup {
  cluster::ProcessGroupPtr dp_group;        // shards this part's gradients and state
  cluster::ProcessGroupPtr extra_dp_group;  // may be null: replicas, gradients averaged over it too
  // Applied to the averaged gradient: MoE experts' gradients already sum their
  // ep group's tokens (the all-to-all's backward), so they take 1/ep.
  double grad_scale = 1.0;
};

class LowLevelZeroOptimizer : public optim::Optimizer {
 public:
  // `inner` must hold exactly the parameters of `params` that require grad
  // (any groups) and not have stepped; its parameters are replaced by master
  // views. `params`: the model's named parameters, all on one device, values
  // identical on every rank (they are cast to `precision` here). `dp_group`
  // shards; `extra_dp_group` (may be null) replicates: gradients are averaged
  // over both, state is sharded over dp only.
  LowLevelZeroOptimizer(std::unique_ptr<optim::Optimizer> inner, NamedParams params, cluster::ProcessGroupPtr dp_group,
                        cluster::ProcessGroupPtr extra_dp_group, LowLevelZeroOptions options);
  // Parameter k is sharded over groups[group_of[k]]. Norms and the overflow
  // flag are reduced over groups[0].dp_group, so every managed gradient
  // element must be held by exactly one of its ranks (MoE: experts over
  // moe_dp x ep = the dense dp). Lamb needs a single group.
  LowLevelZeroOptimizer(std::unique_ptr<optim::Optimizer> inner, NamedParams params, std::vector<ShardGroup> groups,
                        std::vector<size_t> group_of, LowLevelZeroOptions options);
  ~LowLevelZeroOptimizer() override;
  LowLevelZeroOptimizer(const LowLevelZeroOptimizer&) = delete;
  LowLevelZeroOptimizer& operator=(const LowLevelZeroOptimizer&) = delete;

  void step() override;
  std::string name() const override { return "LowLevelZero[" + inner_->name() + "]"; }
  // Collective over dp: the unsharded state in the format the Booster writes
  // for DDP ("state.<i>.<slot>" with whole-parameter shapes; for bf16/fp16 also
  // "master.<i>" and the MixedPrecisionOptimizer JSON), so it loads with any
  // dp size, into DDP, and a DDP state loads here.
  optim::OptimizerState state_dict() const override;
  // Collective over dp: the same format, but only the parameters this rank
  // writes in a per-rank sharded save (zero::writer_rank): the dp ranks'
  // results together are state_dict(), and no rank holds all of it.
  std::optional<optim::OptimizerState> rank_state_dict() const override;
  // Each rank takes its parts of an unsharded state (not collective).
  void load_state_dict(const optim::OptimizerState& state) override;

  // Backward with gradient sync off only accumulates param.grad locally.
  void set_grad_sync(bool enabled) override { sync_enabled_ = enabled; }
  // Blocks until the parameters hold the last step's values (overlap_allgather).
  void wait_for_params() override;
  // Collective over dp: the parameters take the masters' values gathered in
  // their own dtype, not fp8 (before a model save under fp8_communication, so
  // the checkpoint holds the weights, not their e4m3 roundings; the next step
  // gathers in fp8 again).
  void gather_exact_params();
  bool fp8_gathers_params() const { return options_.fp8_communication; }
  // Masters follow the parameters where they no longer round to them (after
  // loading weights into the model); fp32 masters are copied outright.
  // Returns the buckets re-read.
  int64_t follow_parameters() override;
  double loss_scale() const override { return scaler_ ? scaler_->scale() : 1.0; }
  at::Tensor scale_loss(const at::Tensor& loss) const override;
  bool last_step_skipped() const { return last_step_skipped_; }
  double last_grad_norm() const override { return last_grad_norm_; }
  // Whether steps take ZeRO-Offload's bf16 host path (host_mixed_step_ below).
  bool steps_on_host_in_bf16() const { return host_mixed_step_; }
  optim::Optimizer& inner() { return *inner_; }
  // The model's parameters (index order of the layout) and their buckets.
  const NamedParams& named_params() const { return params_; }
  const Layout& layout() const { return layout_; }

  // Bytes this rank holds, by kind (for the memory benchmark).
  struct MemoryBytes {
    int64_t params = 0, grads = 0, masters = 0, optimizer_state = 0;
  };
  MemoryBytes memory_bytes() const;
  // Buckets reduce-scattered before backward finished in the last synced backward.
  int launched_during_backward() const { return launched_during_backward_; }
  size_t bucket_count() const { return buckets_.size(); }

  // Reduce-scatters the gradients accumulated in param.grad while sync was
  // off, now, outside any backward (a pipeline does this once after its
  // schedule, whose microbatch backwards interleave). Collective over dp.
  void reduce_accumulated_grads();

  // Called by the hooks and the engine callback.
  void on_grad_ready(size_t param_index);
  void finish_backward();

 private:
  struct Bucket {
    BucketLayout layout;
    size_t group = 0;  // index into shard_groups_
    at::Tensor flat_params;  // (numel) model dtype; the parameters are views of it
    at::Tensor master;       // (shard_numel) master dtype, on the master device
    at::Tensor master_grad;  // (shard_numel), the .grad of the master views (undefined in the host mixed step)
    // Host mixed step: (shard_numel) bf16 in pinned host memory; the reduced
    // gradient lands here, and the CPU Adam writes the new bf16 chunk over it.
    at::Tensor host_io;
    at::Tensor staging;      // (numel) communication dtype, during a synced backward
    at::Tensor reduced;      // (shard_numel) communication dtype, reduce-scatter output
    size_t pending = 0;
    bool launched = false;
    cluster::Work reduce_work, gather_work;
  };

  static bool aliases_params(const Bucket& bucket);
  ShardedStateLayout state_layout() const;
  optim::OptimizerState state_for(const std::function<bool(size_t)>& keep) const;
  void start_backward();
  void launch_in_order(bool all);
  void launch(Bucket& bucket);
  void gather_params();
  std::vector<size_t> flat_to_param() const;
  // Whether any rank of dp (and model_parallel_group) saw a non-finite gradient.
  bool overflow_anywhere(bool local) const;
  // The global norm of the master gradients, clipped to max_norm in place.
  double clip_master_grads(const std::vector<at::Tensor>& bucket_grads) const;
  // Combines local norm terms over dp, then model_parallel_group.
  amp::NormReducer norm_reducer() const;
  // ZeRO-Offload's step for bf16 parameters (see host_mixed_step_).
  void step_host_mixed();
  // The global norm of the reduced bf16 gradients, in fp32 on their device.
  double reduced_grad_norm() const;
  // Copies `source` (this rank's chunk, on the host or the device) into the
  // bucket's parameters and all-gathers the other ranks' chunks.
  // in_fp8: the all-gather in FP8 (fp8_communication), own chunk included.
  void publish_chunk(Bucket& bucket, const at::Tensor& source, bool in_fp8);
  // Parameter k's whole values: the tensor itself, or param_source's for a meta one.
  at::Tensor whole_values(size_t k) const;

  std::unique_ptr<optim::Optimizer> inner_;
  NamedParams params_;
  std::vector<ShardGroup> shard_groups_;
  cluster::ProcessGroupPtr dp_group_;  // shard_groups_[0]'s: norms and overflow flags
  LowLevelZeroOptions options_;
  Layout layout_;
  std::vector<Bucket> buckets_;
  std::vector<at::Tensor> master_views_;  // by parameter index (undefined if not managed)
  std::vector<size_t> inner_order_;       // inner flat index -> parameter index
  std::vector<int64_t> inner_index_;      // parameter index -> inner flat index (-1: not in it)
  // ZeRO-Offload's layout for bf16 parameters with HybridAdam and CPU masters:
  // no fp32 master gradient on the host (14 bytes a parameter there, not 16).
  // The reduced bf16 gradient is copied to pinned host memory while backward
  // runs; the overflow check and the norm run on the device; one fused CPU
  // pass (kernels::adam_step_mixed_cpu) updates masters and moments and
  // writes the bf16 parameters over the gradient, and each bucket's copy back
  // overlaps the next bucket's update.
  bool host_mixed_step_ = false;
  at::Tensor host_io_all_;  // the buckets' host_io, one pinned allocation
  c10::ScalarType comm_dtype_;
  c10::ScalarType master_dtype_;
  std::optional<amp::DynamicLossScaler> scaler_;
  std::vector<bool> ready_;
  // Buckets of shard group g are [group_begin_[g], group_begin_[g + 1]); each
  // group launches its own in order (one communicator each).
  std::vector<size_t> group_begin_, next_to_launch_;
  bool in_backward_ = false;
  bool sync_enabled_ = true;
  bool gather_pending_ = false;
  bool last_step_skipped_ = false;
  int64_t skipped_steps_ = 0;
  int launched_during_backward_ = 0;
  double last_grad_norm_;
};

}  // namespace colossus::zero

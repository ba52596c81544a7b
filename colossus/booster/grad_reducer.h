// GradReducer: data-parallel gradient averaging that overlaps with backward.
// Parameters are packed into buckets (reverse registration order, which is
// roughly the order backward produces gradients); a post-accumulate-grad hook
// on each parameter marks it ready, and a bucket whose parameters are all
// ready is all-reduced asynchronously while backward continues. Buckets launch
// strictly in index order, so every rank issues the same collectives in the
// same order. An autograd-engine callback waits for all of them when backward
// ends.
#pragma once
#include "colossus/cluster/process_group.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace colossus::booster {

struct GradReducerOptions {
  double bucket_cap_mb = 25.0;
  // param.grad becomes a view into its bucket: no copy in or out, less memory.
  bool gradient_as_bucket_view = false;
  // Parameters that get no gradient in a step are treated as zero instead of
  // being an error; costs one extra small all-reduce per step.
  bool find_unused_parameters = false;
  // 0: gradients are averaged over the group. > 0: they are summed and the sum
  // multiplied by this. Sequence-parallel (split_gather) gradients that are
  // partial sums over tp use the dp x tp group with 1 / dp: summed over tp,
  // averaged over dp.
  double sum_scale = 0.0;
  // Each bucket crosses the wire in FP8 (cluster::all_reduce_fp8, per-bucket
  // scales; blocking, so it no longer overlaps backward): about half the bytes
  // of a bf16 all-reduce, at e4m3's precision.
  bool fp8_communication = false;
};

class GradReducer {
 public:
  using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

  GradReducer(NamedParams params, cluster::ProcessGroupPtr group, GradReducerOptions options);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // While disabled (no_sync), gradients only accumulate locally; the next
  // backward with sync enabled averages the accumulated sums.
  void set_sync_enabled(bool enabled) { sync_enabled_ = enabled; }
  bool sync_enabled() const { return sync_enabled_; }

  size_t bucket_count() const { return buckets_.size(); }
  // Parameter names per bucket, in launch order (for tests and logs).
  std::vector<std::vector<std::string>> bucket_layout() const;
  // How many buckets were launched before backward finished in the last step:
  // > 0 shows communication overlapped with the rest of backward.
  int launched_during_backward() const { return launched_during_backward_; }

  // Called by the hooks and the engine callback.
  void on_grad_ready(size_t param_index);
  void finish_backward();

 private:
  struct Bucket {
    std::vector<size_t> params;
    std::vector<int64_t> offsets;  // element offset of each param in `buffer`
    at::Tensor buffer;             // flat, dtype/device of its params
    size_t pending = 0;
    bool launched = false;
    cluster::Work work;
  };

  void start_backward();
  void launch_in_order();
  at::Tensor slot(size_t param_index) const;

  NamedParams params_;
  cluster::ProcessGroupPtr group_;
  GradReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // param index -> bucket index
  std::vector<bool> ready_;
  size_t next_to_launch_ = 0;
  bool in_backward_ = false;
  bool sync_enabled_ = true;
  int launched_during_backward_ = 0;
};

}  // namespace colossus::booster

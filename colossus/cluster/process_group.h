// ProcessGroup: our thin interface over a c10d::Backend (MPI on CPU, NCCL on
// GPU). Ranks in arguments are ranks within this group; every call returns a
// Work handle, so callers choose between blocking (.wait()) and overlap.
#pragma once
#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace colossus::cluster {

enum class ReduceOp { Sum, Avg, Max, Min, Product };

// A pending collective. wait() blocks until it finished (for NCCL: until the
// current stream is ordered after it) and rethrows a communication error.
class Work {
 public:
  Work() = default;
  explicit Work(c10::intrusive_ptr<c10d::Work> impl) : impl_(std::move(impl)) {}
  void wait();
  bool is_completed();

 private:
  c10::intrusive_ptr<c10d::Work> impl_;
};

class ProcessGroup;
using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  // Splits a group: called by every rank of `parent` with its color; ranks
  // with equal colors form one new group, ordered by (key, parent rank).
  using SplitFn = std::function<ProcessGroupPtr(const ProcessGroup& parent, int color, int key,
                                                const std::string& name)>;

  ProcessGroup(c10::intrusive_ptr<c10d::Backend> backend, std::vector<int> global_ranks,
               std::string name, SplitFn split_fn);

  int rank() const { return backend_->getRank(); }
  int size() const { return backend_->getSize(); }
  const std::string& name() const { return name_; }
  const std::string& backend_name() const { return backend_name_; }
  // World rank of each member, indexed by group rank.
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  int global_rank(int group_rank) const;
  c10::intrusive_ptr<c10d::Backend> backend() const { return backend_; }

  ProcessGroupPtr split(int color, int key, const std::string& name) const;

  // Where this group's collective tensors must live: the job's device for
  // NCCL (it moves only GPU memory), else the CPU.
  c10::Device device() const;
  // One number reduced over the group (blocking): flags, counts, a failed
  // rank. Exact for integers below 2^53.
  double all_reduce_scalar(double value, ReduceOp op);

  // tensor: any shape, reduced in place.
  Work all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  // input: (size() * N) elements, output: N elements; output = reduce over
  // ranks of input's chunk [rank()*N, (rank()+1)*N).
  Work reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                      ReduceOp op = ReduceOp::Sum);
  // input: N elements, output_flat: size() * N elements, rank r's at offset r*N.
  Work all_gather_into(const at::Tensor& output_flat, const at::Tensor& input);
  // outputs: size() tensors shaped like input.
  Work all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input);
  Work broadcast(const at::Tensor& tensor, int src);
  // Split along dim 0: input rows [sum(input_splits[:r]), +input_splits[r]) go
  // to rank r; output receives output_splits[r] rows from rank r. Empty split
  // lists mean even splits.
  Work all_to_all(const at::Tensor& output, const at::Tensor& input,
                  std::vector<int64_t> output_splits = {}, std::vector<int64_t> input_splits = {});
  Work send(const at::Tensor& tensor, int dst, int tag = 0);
  Work recv(const at::Tensor& tensor, int src, int tag = 0);
  Work barrier();

 private:
  void check_peer(int peer, const char* what) const;

  c10::intrusive_ptr<c10d::Backend> backend_;
  std::vector<int> global_ranks_;
  std::string name_;
  std::string backend_name_;
  SplitFn split_fn_;
};

// Shuts every live backend down (NCCL communicators are destroyed cleanly).
// launch_from_env registers this to run at exit, before the CUDA runtime
// tears itself down; call it yourself to end a job's communication early.
void shutdown_process_groups();

}  // namespace colossus::cluster

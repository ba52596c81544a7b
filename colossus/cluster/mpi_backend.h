// MpiBackend: a c10d::Backend over an MPI communicator, for CPU ranks. Each
// backend runs its collectives in order on one worker thread, so callers
// overlap communication with compute by holding the Work and waiting later.
#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <mpi.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace colossus::cluster {

class ProcessGroup;

// Initialises MPI once per process (MPI_THREAD_MULTIPLE, since every
// communicator has its own worker thread) and finalises it at exit.
void ensure_mpi_initialized();
bool launched_by_mpi();

class MpiBackend : public c10d::Backend {
 public:
  // Takes ownership of `comm` (freed on destruction unless MPI_COMM_WORLD).
  explicit MpiBackend(MPI_Comm comm);
  ~MpiBackend() override;

  const std::string getBackendName() const override { return "mpi"; }
  MPI_Comm comm() const { return comm_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

 private:
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType op, std::function<void()> fn);
  void run_worker();

  MPI_Comm comm_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread worker_;
};

// The world group over MPI_COMM_WORLD; subgroups split with MPI_Comm_split.
std::shared_ptr<ProcessGroup> make_mpi_world_group();

}  // namespace colossus::cluster

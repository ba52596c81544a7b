// Point-to-point transfers between pipeline stages over the mesh's pp group.
// A transfer travels on a channel (one per receiving virtual stage and
// direction), and messages on one channel arrive in the order they were
// sent, so both sides only need to agree on each channel's sequence. The
// first tensor on a channel is preceded by its shape and dtype; later ones
// reuse the cached shape (reset_shapes() when the microbatch shape changes).
// Sends are asynchronous (MPI_Isend / NCCL send) and kept alive until flush().
#pragma once
#include "colossus/cluster/process_group.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace colossus::parallel::pipeline {

class PipelineP2P {
 public:
  explicit PipelineP2P(cluster::ProcessGroupPtr pp_group);

  // Starts sending `tensor` (contiguous, any shape) to pp rank `dst` on
  // `channel` (>= 0).
  void send(const at::Tensor& tensor, int dst, int channel);

  struct Pending {
    at::Tensor tensor;
    cluster::Work work;
  };
  // Posts the receive of the next tensor on `channel` from pp rank `src`.
  // Blocks only the first time on a channel (for its shape).
  Pending post_recv(int src, int channel, c10::Device device);
  bool shape_known(int src, int channel) const { return recv_shapes_.contains({src, channel}); }

  // Waits for every send started so far.
  void flush();
  // Forgets cached shapes (every rank must call it at the same point).
  void reset_shapes();
  const cluster::ProcessGroup& group() const { return *group_; }

 private:
  struct Meta {
    std::vector<int64_t> sizes;
    c10::ScalarType dtype = c10::ScalarType::Float;
  };
  cluster::ProcessGroupPtr group_;
  std::map<std::pair<int, int>, Meta> send_shapes_;  // (dst, channel)
  std::map<std::pair<int, int>, Meta> recv_shapes_;  // (src, channel)
  std::vector<cluster::Work> sends_;
};

}  // namespace colossus::parallel::pipeline

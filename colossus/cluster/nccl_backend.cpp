// The GPU backend: torch's c10d ProcessGroupNCCL with TCPStore rendezvous at
// MASTER_ADDR:MASTER_PORT. Compiled only into the CUDA library, which
// registers it as "nccl" when the process starts.
#include "colossus/cluster/launch.h"
#include "colossus/cluster/process_group.h"
#include "colossus/core/errors.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fmt/format.h>

#include <numeric>

namespace colossus::cluster {

namespace {

struct NcclContext {
  c10::intrusive_ptr<c10d::Store> store;
  std::chrono::milliseconds timeout;
  c10::Device device;
};

ProcessGroupPtr make_nccl_group(const std::shared_ptr<NcclContext>& ctx, c10::intrusive_ptr<c10d::Store> store,
                                int rank, std::vector<int> members, const std::string& name);

ProcessGroupPtr nccl_split(const std::shared_ptr<NcclContext>& ctx, const ProcessGroup& parent, int color, int key,
                           const std::string& name) {
  // Everyone learns everyone's (color, key) through the parent group, then
  // the members of each color build a communicator under their own prefix.
  auto options = at::TensorOptions().dtype(at::kLong).device(ctx->device);
  auto mine = at::tensor({static_cast<int64_t>(color), static_cast<int64_t>(key)}, at::kLong).to(ctx->device);
  auto all = at::empty({parent.size() * 2}, options);
  const_cast<ProcessGroup&>(parent).all_gather_into(all, mine).wait();
  auto table = all.cpu().view({parent.size(), 2});
  std::vector<std::tuple<int64_t, int, int>> same;  // (key, parent rank, world rank)
  for (int r = 0; r < parent.size(); ++r) {
    if (table[r][0].item<int64_t>() == color) same.emplace_back(table[r][1].item<int64_t>(), r, parent.global_rank(r));
  }
  std::sort(same.begin(), same.end());
  std::vector<int> members;
  int my_rank = -1;
  for (const auto& [k, parent_rank, world_rank] : same) {
    if (parent_rank == parent.rank()) my_rank = static_cast<int>(members.size());
    members.push_back(world_rank);
  }
  auto prefix = fmt::format("{}/{}/{}", parent.name(), name, color);
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, ctx->store);
  return make_nccl_group(ctx, store, my_rank, std::move(members), name);
}

ProcessGroupPtr make_nccl_group(const std::shared_ptr<NcclContext>& ctx, c10::intrusive_ptr<c10d::Store> store,
                                int rank, std::vector<int> members, const std::string& name) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = ctx->timeout;
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, static_cast<int>(members.size()), options);
  // Bind the communicator to our device now rather than guessing later.
  backend->eagerConnectSingleDevice(ctx->device);
  return std::make_shared<ProcessGroup>(
      backend, std::move(members), name,
      [ctx](const ProcessGroup& parent, int color, int key, const std::string& child) {
        return nccl_split(ctx, parent, color, key, child);
      });
}

ProcessGroupPtr create_nccl(const LaunchInfo& info, const ClusterOptions& options) {
  if (info.world_size > 1 && info.master_port == 0) {
    throw LaunchError("the NCCL backend needs MASTER_ADDR and MASTER_PORT for rendezvous; start the job with "
                      "`colossus run` or torchrun, or set both variables");
  }
  c10::intrusive_ptr<c10d::Store> store;
  if (info.world_size == 1) {
    // A lone process meets nobody: an in-process store, so that several
    // one-GPU runs on a machine do not all try to listen on MASTER_PORT.
    store = c10::make_intrusive<c10d::HashStore>();
  } else {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(info.master_port);
    store_options.isServer = info.rank == 0;
    store_options.numWorkers = static_cast<size_t>(info.world_size);
    store_options.timeout = options.timeout;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, store_options);
    } catch (const std::exception& e) {
      throw LaunchError(fmt::format("rendezvous at {}:{} failed (rank {} of {}): {}", info.master_addr,
                                    info.master_port, info.rank, info.world_size, e.what()));
    }
  }
  auto ctx = std::make_shared<NcclContext>(NcclContext{
      store, options.timeout, c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(info.local_rank))});
  std::vector<int> members(info.world_size);
  std::iota(members.begin(), members.end(), 0);
  auto world_store = c10::make_intrusive<c10d::PrefixStore>("world", store);
  return make_nccl_group(ctx, world_store, info.rank, std::move(members), "world");
}

bool cuda_visible() { return c10::impl::VirtualGuardImpl(c10::kCUDA).deviceCount() > 0; }

const bool registered = [] {
  register_backend("nccl", {create_nccl, cuda_visible});
  return true;
}();

}  // namespace

}  // namespace colossus::cluster

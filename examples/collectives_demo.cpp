// A 4-rank tour of the cluster layer: lay the ranks out as a dp x tp mesh,
// reduce inside tp groups, gather across dp, and time all_reduce for a few
// buffer sizes. Run: colossus run --nproc_per_node 4 build/bin/collectives_demo
#include "colossus/cluster/coordinator.h"
#include "colossus/cluster/launch.h"
#include "colossus/cluster/logger.h"
#include "colossus/cluster/mesh.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdio>

using namespace colossus::cluster;

int run() {
  const auto& cluster = launch_from_env();
  auto world = cluster.world;
  DistCoordinator coordinator(world);
  Logger log("demo");
  int n = world->size();
  int tp = n % 2 == 0 ? 2 : 1;
  ProcessGroupMesh mesh(world, {{"dp", n / tp}, {"tp", tp}});
  log.info(fmt::format("{} ranks on backend {}, mesh dp={} x tp={}", n, cluster.backend, n / tp, tp));

  // Each rank contributes its rank; a tp group's sum is known in closed form.
  auto opts = at::TensorOptions().device(cluster.device);
  auto x = at::full({4}, static_cast<float>(world->rank()), opts);
  mesh.group("tp")->all_reduce(x).wait();
  auto gathered = at::empty({mesh.size("dp") * 4}, opts);
  mesh.group("dp")->all_gather_into(gathered, x).wait();
  auto per_dp = gathered.cpu().view({mesh.size("dp"), 4}).select(1, 0).contiguous();
  std::vector<float> values(per_dp.data_ptr<float>(), per_dp.data_ptr<float>() + per_dp.numel());
  log.info(fmt::format("rank {} at (dp={}, tp={}): tp-sum {} and dp-gathered [{}]", world->rank(), mesh.coordinate("dp"),
                       mesh.coordinate("tp"), x[0].item<float>(), fmt::join(values, ", ")),
           kAllRanks);
  coordinator.block_all();

  coordinator.print_on_master(fmt::format("{:>12} {:>12} {:>14}", "bytes", "time (ms)", "algbw (GB/s)"));
  for (int64_t numel : {int64_t{1} << 10, int64_t{1} << 16, int64_t{1} << 20, int64_t{1} << 22}) {
    auto buffer = at::ones({numel}, opts);
    world->all_reduce(buffer).wait();  // warm-up
    const int iters = 5;
    coordinator.block_all();
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) world->all_reduce(buffer).wait();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / iters;
    double bytes = static_cast<double>(numel) * 4;
    coordinator.print_on_master(fmt::format("{:>12} {:>12.3f} {:>14.2f}", static_cast<int64_t>(bytes), ms, bytes / ms / 1e6));
  }
  coordinator.print_on_master("collectives demo done");
  finalize();
  return 0;
}

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collectives_demo: error: %s\n", e.what());
    return 1;
  }
}

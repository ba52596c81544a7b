// `colossus _selftest`: what `colossus check` runs on each rank: the main
// collectives on the job's default backend, checked against closed forms.
#include "colossus/cli/commands.h"
#include "colossus/cluster/launch.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>

namespace colossus::cli {

Command add_selftest_command(CLI::App& app) {
  auto* sub = app.add_subcommand("_selftest", "Internal: collective self-test run on every rank by `colossus check`");
  sub->group("");  // hidden from --help
  auto backend = std::make_shared<std::string>("auto");
  sub->add_option("--backend", *backend, "auto, nccl or mpi");
  return {sub, [backend]() -> int {
            const auto& cluster = cluster::launch_from_env({.backend = *backend});
            auto& world = *cluster.world;
            int n = world.size(), r = world.rank();
            auto opts = at::TensorOptions().device(cluster.device);
            std::vector<std::string> failures;
            auto t = at::full({1024}, static_cast<float>(r + 1), opts);
            world.all_reduce(t).wait();
            if (!at::allclose(t.cpu(), at::full({1024}, n * (n + 1) / 2.0f))) failures.push_back("all_reduce");
            auto gathered = at::empty({n * 4}, opts);
            world.all_gather_into(gathered, at::full({4}, static_cast<float>(r), opts)).wait();
            auto expected = at::arange(n, at::kFloat).repeat_interleave(4);
            if (!at::equal(gathered.cpu(), expected)) failures.push_back("all_gather");
            auto b = r == 0 ? at::arange(8, opts.dtype(at::kFloat)) : at::zeros({8}, opts);
            world.broadcast(b, 0).wait();
            if (!at::equal(b.cpu(), at::arange(8, at::kFloat))) failures.push_back("broadcast");
            auto bf = at::full({256}, 1.0, opts.dtype(at::kBFloat16));
            world.all_reduce(bf).wait();
            if (!at::equal(bf.cpu().to(at::kFloat), at::full({256}, static_cast<float>(n)))) failures.push_back("all_reduce bf16");
            world.barrier().wait();
            cluster::finalize();
            if (!failures.empty()) {
              std::cerr << fmt::format("rank {}: selftest failed: {}", r, fmt::join(failures, ", ")) << std::endl;
              return 1;
            }
            if (r == 0) std::cout << fmt::format("selftest passed on {} ranks ({})", n, cluster.backend) << std::endl;
            return 0;
          }};
}

}  // namespace colossus::cli

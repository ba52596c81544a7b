// The measured pipeline bubble of a real model next to the analytic one: a
// GPT-2 (8 blocks of width 256) trained through booster.execute_pipeline with
// HybridParallelPlugin at pp = pp ranks, each schedule (1f1b, interleaved with
// 2 chunks, zero_bubble) for a few steps; the last step's timeline of every
// rank is written as a Chrome trace (<out>/pipeline_<schedule>.json) and its
// bubble (1 - busy / (makespan x ranks)) printed beside (a) the analytic
// formula (equal F : B : W) and (b) simulate() with this run's mean action
// costs. Run one rank per core (torch threads = 1) so ranks do not contend:
//   scripts/mpirun_test.sh 2 bench_pipeline_bubble --out DIR [--microbatches 8]
// Rank 0 prints a table and one JSON line per schedule.
#include "colossus/booster/booster.h"
#include "colossus/booster/hybrid_parallel_plugin.h"
#include "colossus/cluster/launch.h"
#include "colossus/models/pretrained.h"
#include "colossus/optim/adam.h"
#include "colossus/parallel/pipeline/runtime.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

using namespace colossus;
namespace pp = colossus::parallel::pipeline;

namespace {

models::ModelConfig bench_model() {
  models::GPT2Config c;
  c.vocab_size = 2048;
  c.n_positions = 256;
  c.n_embd = 256;
  c.n_layer = 8;
  c.n_head = 4;
  c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0.0;
  return c;
}

// Mean duration (us) per action kind over all ranks' timelines.
std::map<pp::ActionKind, double> mean_costs(const std::vector<std::vector<pp::TimedAction>>& timelines) {
  std::map<pp::ActionKind, std::pair<double, int>> sums;
  for (const auto& t : timelines) {
    for (const auto& e : t) {
      sums[e.action.kind].first += e.end_us - e.start_us;
      sums[e.action.kind].second += 1;
    }
  }
  std::map<pp::ActionKind, double> out;
  for (const auto& [kind, s] : sums) out[kind] = s.first / s.second;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir = ".";
  int64_t microbatches = 8, steps = 3, seq = 256, microbatch_size = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--out")) out_dir = argv[i + 1];
    if (!std::strcmp(argv[i], "--microbatches")) microbatches = std::stoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--steps")) steps = std::stoll(argv[i + 1]);
  }
  at::set_num_threads(1);
  auto world = cluster::launch_from_env({.backend = "mpi"}).world;
  const int P = world->size();
  std::filesystem::create_directories(out_dir);
  const auto config = bench_model();
  if (world->rank() == 0) {
    std::printf("pipeline bubble: gpt2 8 x 256, vocab 2048, seq %ld, %ld microbatches of %ld, pp %d, torch threads 1\n",
                seq, microbatches, microbatch_size, P);
    std::printf("| pp_style | chunks | measured bubble | analytic | simulated (measured costs) | step ms |\n|---|---|---|---|---|---|\n");
  }
  struct Case {
    const char* style;
    int chunks;
    pp::ScheduleKind kind;
  };
  for (const Case c : {Case{"1f1b", 1, pp::ScheduleKind::OneFOneB}, Case{"interleaved", 2, pp::ScheduleKind::Interleaved},
                       Case{"zero_bubble", 1, pp::ScheduleKind::ZeroBubble}}) {
    auto plugin = std::make_shared<booster::HybridParallelPlugin>(
        booster::HybridParallelPluginOptions{
            .pp_size = P, .pp_style = c.style, .num_model_chunks = c.chunks, .num_microbatches = microbatches},
        world);
    booster::Booster booster(plugin);
    auto model = models::create_model(config, {.seed = 7});
    auto optimizer = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 1e-3});
    auto boosted = booster.boost(model, std::move(optimizer));
    auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
    for (int64_t step = 0; step < steps; ++step) {
      auto ids = at::randint(models::vocab_size(config), {microbatches * microbatch_size, seq}, gen, at::kLong);
      world->barrier().wait();
      booster.execute_pipeline([&] { return booster::PipelineBatch{.input_ids = ids}; }, *boosted.model, {},
                               *boosted.optimizer);
      boosted.optimizer->step();
      boosted.optimizer->zero_grad();
    }
    auto& hybrid = dynamic_cast<booster::HybridParallelModel&>(*boosted.model);
    const auto timelines = pp::gather_timelines(*plugin->pp_group(), hybrid.pipeline()->last_timeline());
    const double measured = pp::bubble_fraction(timelines);
    const double analytic = pp::analytic_bubble_fraction(c.kind, P, microbatches, c.chunks);
    auto costs = mean_costs(timelines);
    std::vector<std::vector<pp::Action>> lists;
    for (int r = 0; r < P; ++r) lists.push_back(pp::make_schedule(c.kind, P, r, microbatches, c.chunks));
    const double f = costs[pp::ActionKind::Forward];
    const double b = c.kind == pp::ScheduleKind::ZeroBubble ? costs[pp::ActionKind::BackwardInput]
                                                            : costs[pp::ActionKind::Backward];
    const double w = c.kind == pp::ScheduleKind::ZeroBubble ? costs[pp::ActionKind::BackwardWeight] : 0.0;
    const double simulated = pp::bubble_fraction(pp::simulate(lists, c.chunks, f, b, w));
    double begin = 1e300, end = -1e300;
    for (const auto& t : timelines) {
      for (const auto& e : t) begin = std::min(begin, e.start_us), end = std::max(end, e.end_us);
    }
    const double step_ms = (end - begin) / 1000;
    if (world->rank() == 0) {
      const std::string path = (std::filesystem::path(out_dir) / fmt::format("pipeline_{}.json", c.style)).string();
      std::ofstream(path) << pp::chrome_trace_json(timelines);
      std::printf("| %s | %d | %.3f | %.3f | %.3f | %.0f |\n", c.style, c.chunks, measured, analytic, simulated,
                  step_ms);
      std::printf("JSON %s\n", nlohmann::json{{"pp_style", c.style},
                                              {"chunks", c.chunks},
                                              {"pp", P},
                                              {"microbatches", microbatches},
                                              {"measured", measured},
                                              {"analytic", analytic},
                                              {"simulated_measured_costs", simulated},
                                              {"mean_f_ms", f / 1000},
                                              {"mean_b_ms", b / 1000},
                                              {"mean_w_ms", w / 1000},
                                              {"step_ms", step_ms},
                                              {"trace", path}}
                                       .dump()
                                       .c_str());
      std::fflush(stdout);
    }
  }
  cluster::finalize();
  return 0;
}

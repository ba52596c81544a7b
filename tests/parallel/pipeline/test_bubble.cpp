// The measured pipeline bubble agrees with the analytic one. Each stage's
// forward, input-backward and weight-backward sleep a fixed time instead of
// computing, so 4 ranks on 2 cores do not contend for the CPU and the idle
// time left is the schedule's own. Everything else is the real thing: the
// runtime executes each schedule's action list, activations and gradients
// travel over MPI p2p, the B/W split goes through autograd (B: grad w.r.t.
// the stage input; W: backward w.r.t. the chunk's parameters), and the bubble
// is computed from the gathered timelines, which are also written as Chrome
// traces (pipeline_bubble_<schedule>.json in the working directory).
#include "colossus/core/errors.h"
#include "colossus/parallel/pipeline/runtime.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>

using namespace colossus;
namespace ct = colossus::testing;
namespace pp = colossus::parallel::pipeline;

namespace {

void sleep_ms(double ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(ms * 1000)));
}

// y = x + p (shapes (1, 4)), forward sleeping f_ms; backward sleeps b_ms for
// the input gradient and w_ms for the weight gradient, only for the gradients
// this autograd pass asks for (needs_input_grad), so a B pass costs b, a W
// pass w and a full backward b + w. On the first stage the input needs no
// gradient, yet its backward still runs through the stage (as a real model's
// first blocks do), so b is charged to the pass that computes the weights'.
struct SleepStage : torch::autograd::Function<SleepStage> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& p,
                            double f_ms, double b_ms, double w_ms) {
    ctx->saved_data["b"] = b_ms;
    ctx->saved_data["w"] = w_ms;
    ctx->saved_data["x_needs_grad"] = x.requires_grad();
    sleep_ms(f_ms);
    return x + p;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const double b = ctx->saved_data["b"].toDouble(), w = ctx->saved_data["w"].toDouble();
    const bool input = ctx->needs_input_grad(0), weight = ctx->needs_input_grad(1);
    const bool first_stage = !ctx->saved_data["x_needs_grad"].toBool();
    sleep_ms((input ? b : 0.0) + (weight ? w + (first_stage ? b : 0.0) : 0.0));
    return {input ? grads[0] : at::Tensor(), weight ? grads[0] : at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

struct Measured {
  double bubble = 0.0;
  std::vector<std::vector<pp::TimedAction>> timelines;
};

// One step of `kind` on the world as the pp group (one virtual stage per
// chunk), each chunk costing f, b, w milliseconds; the second of two runs
// (the first exchanges p2p shapes and warms up MPI).
Measured run_sleep_pipeline(pp::ScheduleKind kind, int chunks, int64_t microbatches, double f, double b, double w) {
  auto world = ct::world();
  const int P = world->size();
  pp::StageManager stages(P, world->rank(), chunks, pp::balance_blocks(std::vector<int64_t>(P * chunks, 1), P * chunks));
  std::vector<at::Tensor> params;
  for (int c = 0; c < chunks; ++c) params.push_back(at::zeros({1, 4}).requires_grad_(true));
  pp::StageFunctions functions{
      .forward =
          [&](int chunk, int64_t, const at::Tensor& input) {
            const at::Tensor x = input.defined() ? input : at::ones({1, 4});
            at::Tensor y = SleepStage::apply(x, params[static_cast<size_t>(chunk)], f, b, w);
            return stages.is_last(chunk) ? y.sum() : y;
          },
      .parameters = [&](int chunk) { return std::vector<at::Tensor>{params[static_cast<size_t>(chunk)]}; },
      .scale_loss = {}};
  pp::PipelineRuntime runtime(stages, world, /*overlap_p2p=*/true);
  const auto actions = pp::make_schedule(kind, P, world->rank(), microbatches, chunks);
  pp::RunResult result;
  for (int round = 0; round < 2; ++round) {
    world->barrier().wait();
    result = runtime.run(actions, functions, microbatches, {1, 4}, c10::Device(c10::kCPU));
  }
  Measured out;
  out.timelines = pp::gather_timelines(*world, result.timeline);
  out.bubble = pp::bubble_fraction(out.timelines);
  return out;
}

}  // namespace

// pp 4, 8 microbatches, per-stage forward : input-backward : weight-backward
// = 1 : 1 : 1 (the analytic formulas' assumption; an interleaved chunk costs
// half a stage). Each measured bubble lies in [analytic - 0.01, analytic +
// 0.05]: p2p, wake-up latency and timer slack only add idle time (1-2 ms per
// dependency hop on this loaded 2-core machine, out of ~1.2 s per step; seen:
// +0.02 to +0.03), and the schedules keep their order.
TEST(PipelineBubble, MeasuredAgreesWithAnalytic) {
  if (ct::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  constexpr double kStageMs = 40.0;
  constexpr int64_t kMicrobatches = 8;
  struct Case {
    const char* name;
    pp::ScheduleKind kind;
    int chunks;
  };
  const std::vector<Case> cases = {{"1f1b", pp::ScheduleKind::OneFOneB, 1},
                                   {"interleaved", pp::ScheduleKind::Interleaved, 2},
                                   {"zero_bubble", pp::ScheduleKind::ZeroBubble, 1}};
  std::vector<double> measured;
  for (const auto& c : cases) {
    const double chunk_ms = kStageMs / c.chunks;
    const auto m = run_sleep_pipeline(c.kind, c.chunks, kMicrobatches, chunk_ms, chunk_ms, chunk_ms);
    const double analytic = pp::analytic_bubble_fraction(c.kind, 4, kMicrobatches, c.chunks);
    EXPECT_GE(m.bubble, analytic - 0.01) << c.name;
    EXPECT_LE(m.bubble, analytic + 0.05) << c.name;
    measured.push_back(m.bubble);
    if (ct::world()->rank() == 0) {
      const std::string path = fmt::format("pipeline_bubble_{}.json", c.name);
      std::ofstream(path) << pp::chrome_trace_json(m.timelines);
      double begin = 1e300, end = -1e300;
      for (const auto& t : m.timelines) {
        for (const auto& e : t) begin = std::min(begin, e.start_us), end = std::max(end, e.end_us);
      }
      std::printf("bubble %-12s pp4 m8 c%d: measured %.4f analytic %.4f (step %.1f ms, trace %s)\n", c.name,
                  c.chunks, m.bubble, analytic, (end - begin) / 1000, path.c_str());
    }
  }
  EXPECT_LT(measured[1], measured[0]);  // interleaved < 1f1b
  EXPECT_LT(measured[2], measured[1]);  // zero_bubble < interleaved
}

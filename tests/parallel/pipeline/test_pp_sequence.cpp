// Pipeline parallelism composed with sequence parallelism and the
// forward-only (evaluation) pipeline, on 4 MPI ranks against one process:
// pp 2 x sp 2 with ring attention (zig-zag shards) and with Ulysses
// all-to-all, each stage attending over its sp group, give the single-process
// loss curve (fp32, 1e-5 relative, 20 AdamW steps) for GPT-2 and LLaMA, and
// so do tp 2 x pp 2 with split_gather / ring (the sequence over the tp group)
// and ZeRO-1 over pp 2 x sp 2. Under a NoGradGuard execute_pipeline runs forwards only:
// its loss equals the single-process model's on held-out rows (also rows that
// do not divide into the training microbatches), every pp rank gets it, and
// training continues on the curve afterwards (gradients, optimizer untouched).
#include "colossus/booster/booster.h"
#include "colossus/booster/hybrid_parallel_plugin.h"
#include "colossus/core/errors.h"
#include "tests/booster/booster_testing.h"
#include "tests/parallel/pipeline/pp_testing.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

using namespace colossus;
using namespace colossus::booster::testing;
namespace ct = colossus::testing;

TEST(PipelineSequenceParallel, Pp2Sp2RingAttention) {
  if (!four_ranks()) GTEST_SKIP() << "needs 4 ranks";
  expect_layout_matches({.pp_size = 2,
                         .pp_style = "1f1b",
                         .num_microbatches = 2,
                         .sp_size = 2,
                         .enable_sequence_parallelism = true,
                         .sequence_parallelism_mode = "ring_attn"},
                        "pp2 x sp2 ring_attn 1f1b m2");
}

// Ulysses under the interleaved schedule, clipped: the global norm is taken
// over pp (sp ranks hold the same, averaged gradients).
TEST(PipelineSequenceParallel, Pp2Sp2AllToAllInterleavedClipped) {
  if (!four_ranks()) GTEST_SKIP() << "needs 4 ranks";
  expect_layout_matches({.pp_size = 2,
                         .pp_style = "interleaved",
                         .num_model_chunks = 2,
                         .num_microbatches = 2,
                         .sp_size = 2,
                         .enable_sequence_parallelism = true,
                         .sequence_parallelism_mode = "all_to_all"},
                        "pp2 x sp2 all_to_all interleaved c2 m2 clipped 0.3", /*max_norm=*/0.3);
}

// tp x pp x sp on 4 ranks: Megatron-style sequence parallelism over the tp
// group (split_gather, and ring with its chunked collectives) inside tp 2 x
// pp 2; the tp-replicated parameters' gradients are summed over tp after the
// schedule.
TEST(PipelineSequenceParallel, Tp2Pp2SplitGatherAndRing) {
  if (!four_ranks()) GTEST_SKIP() << "needs 4 ranks";
  expect_layout_matches({.tp_size = 2,
                         .pp_size = 2,
                         .pp_style = "1f1b",
                         .num_microbatches = 2,
                         .enable_sequence_parallelism = true,
                         .sequence_parallelism_mode = "split_gather"},
                        "tp2 x pp2 split_gather 1f1b m2");
  expect_layout_matches({.tp_size = 2,
                         .pp_size = 2,
                         .pp_style = "zero_bubble",
                         .num_microbatches = 2,
                         .sp_size = 2,
                         .enable_sequence_parallelism = true,
                         .sequence_parallelism_mode = "ring"},
                        "tp2 x pp2 x sp2 (tp group) ring zero_bubble m2");
}

// ZeRO-1 with sequence shards: the state sharded over dp, the sp ranks
// holding the same shard and averaging their gradients (extra dp group).
TEST(PipelineSequenceParallel, Zero1Pp2Sp2) {
  if (!four_ranks()) GTEST_SKIP() << "needs 4 ranks";
  expect_layout_matches({.pp_size = 2,
                         .num_microbatches = 2,
                         .sp_size = 2,
                         .enable_sequence_parallelism = true,
                         .sequence_parallelism_mode = "ring_attn",
                         .zero_stage = 1},
                        "zero1 pp2 x sp2 ring_attn 1f1b m2");
}

// Evaluation through the pipeline after 5 steps: the loss of held-out rows
// (step 100's batch, its first 6 rows: 3 per dp rank, which 2 microbatches
// do not divide, and its first 13 tokens: sequence shards padded, p2p shapes
// renegotiated) against one process's model after the same 5 steps; then the
// remaining 15 steps stay on the uninterrupted curve.
TEST(PipelineParallel, EvalLossIsTheSingleProcessLoss) {
  if (!four_ranks()) GTEST_SKIP() << "needs 4 ranks";
  const std::vector<std::pair<std::string, booster::HybridParallelPluginOptions>> layouts = {
      {"pp2 x dp2 1f1b", {.pp_size = 2, .num_microbatches = 2}},
      {"pp4 interleaved c2 m4", {.pp_size = 4, .pp_style = "interleaved", .num_model_chunks = 2, .num_microbatches = 4}},
      {"pp2 x sp2 ring_attn zero_bubble",
       {.pp_size = 2,
        .pp_style = "zero_bubble",
        .num_microbatches = 2,
        .sp_size = 2,
        .enable_sequence_parallelism = true,
        .sequence_parallelism_mode = "ring_attn"}},
      {"tp2 x pp2 split_gather",
       {.tp_size = 2,
        .pp_size = 2,
        .num_microbatches = 2,
        .enable_sequence_parallelism = true,
        .sequence_parallelism_mode = "split_gather"}},
      {"zero1 dp2 x pp2", {.pp_size = 2, .num_microbatches = 2, .zero_stage = 1}}};
  for (const auto& base : {tiny_gpt2(), tiny_llama()}) {
    const auto config = deep(base);
    const std::string kind = models::model_type(config);
    auto expected_model = trained_single_process(config, 5);
    const auto held_out = global_batch(config, 100);
    const auto six_rows = held_out.narrow(0, 0, 6);
    // 13 tokens: padded inside to 2 x sp (ring_attn) or tp (split_gather).
    const auto short_rows = held_out.narrow(1, 0, 13);
    const double expected = loss_on(*expected_model, held_out);
    const double expected_six = loss_on(*expected_model, six_rows);
    const double expected_short = loss_on(*expected_model, short_rows);
    const auto& ref = reference(config);
    for (const auto& [what, options] : layouts) {
      if (kind == "llama" && what.starts_with("zero1")) continue;  // one model is enough for the ZeRO path
      PpRun run(config, options);
      run.train(0, 5);
      const double got = run.eval_loss(held_out);
      const double got_six = run.eval_loss(six_rows);
      const double got_short = run.eval_loss(short_rows);
      const double rel = std::abs(got - expected) / expected, rel_six = std::abs(got_six - expected_six) / expected_six;
      const double rel_short = std::abs(got_short - expected_short) / expected_short;
      EXPECT_LE(rel, 1e-5) << kind << " " << what;
      EXPECT_LE(rel_six, 1e-5) << kind << " " << what << " (6 rows)";
      EXPECT_LE(rel_short, 1e-5) << kind << " " << what << " (13 tokens)";
      const auto rest = run.train(5, kSteps);
      expect_curve(rest, std::vector<double>(ref.begin() + 5, ref.end()),
                   fmt::format("{} {} steps 6-20 after an eval", kind, what));
      if (ct::world()->rank() == 0)
        std::printf("%s %s eval after 5 steps: %.6f vs 1 process %.6f (rel %.2e; 6 rows %.2e; 13 tokens %.2e)\n",
                    kind.c_str(), what.c_str(), got, expected, rel, rel_six, rel_short);
    }
  }
}

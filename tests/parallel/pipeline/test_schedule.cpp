// Pipeline schedules and the stage manager without communication: every
// schedule runs each microbatch's forward and backward (B and W) exactly once
// per chunk in a dependency-respecting, deadlock-free order (run on an ideal
// machine by simulate()), and its simulated bubble equals the analytic one;
// blocks are balanced by parameter count; bad settings are ConfigErrors; the
// plan report (`colossus plan`) gives each schedule's analytic bubble and
// activations in flight and recommends the lowest bubble.
#include "colossus/core/errors.h"
#include "colossus/parallel/pipeline/schedule.h"
#include "colossus/parallel/pipeline/schedule_report.h"
#include "colossus/parallel/pipeline/stage_manager.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <tuple>

using namespace colossus;
using namespace colossus::parallel::pipeline;

namespace {

std::vector<std::vector<Action>> all_ranks(ScheduleKind kind, int pp, int64_t m, int chunks) {
  std::vector<std::vector<Action>> lists;
  for (int r = 0; r < pp; ++r) lists.push_back(make_schedule(kind, pp, r, m, chunks));
  return lists;
}

// Each (microbatch, chunk) has one F and either one full B or one B + one W.
void expect_complete(const std::vector<std::vector<Action>>& lists, int64_t m, int chunks, bool split) {
  for (size_t r = 0; r < lists.size(); ++r) {
    std::map<std::tuple<int, int64_t, int>, int> count;
    for (const auto& a : lists[r]) ++count[{static_cast<int>(a.kind), a.microbatch, a.chunk}];
    for (int64_t mb = 0; mb < m; ++mb) {
      for (int c = 0; c < chunks; ++c) {
        EXPECT_EQ((count[{static_cast<int>(ActionKind::Forward), mb, c}]), 1) << "rank " << r;
        if (split) {
          EXPECT_EQ((count[{static_cast<int>(ActionKind::BackwardInput), mb, c}]), 1) << "rank " << r;
          EXPECT_EQ((count[{static_cast<int>(ActionKind::BackwardWeight), mb, c}]), 1) << "rank " << r;
        } else {
          EXPECT_EQ((count[{static_cast<int>(ActionKind::Backward), mb, c}]), 1) << "rank " << r;
        }
      }
    }
    EXPECT_EQ(lists[r].size(), static_cast<size_t>(m * chunks * (split ? 3 : 2)));
  }
}

}  // namespace

TEST(PipelineSchedule, OneFOneBOrderAndBubble) {
  EXPECT_EQ(one_f_one_b(2, 0, 3), (std::vector<Action>{{ActionKind::Forward, 0, 0},
                                                       {ActionKind::Forward, 1, 0},
                                                       {ActionKind::Backward, 0, 0},
                                                       {ActionKind::Forward, 2, 0},
                                                       {ActionKind::Backward, 1, 0},
                                                       {ActionKind::Backward, 2, 0}}));
  for (int pp : {2, 3, 4, 8}) {
    for (int64_t m : {1, 2, 4, 5, 8, 16}) {
      const auto lists = all_ranks(ScheduleKind::OneFOneB, pp, m, 1);
      expect_complete(lists, m, 1, false);
      for (int r = 0; r < pp; ++r) EXPECT_LE(peak_in_flight(lists[r]), pp - r);
      const double simulated = bubble_fraction(simulate(lists, 1, 1.0, 1.0, 1.0));
      EXPECT_NEAR(simulated, analytic_bubble_fraction(ScheduleKind::OneFOneB, pp, m, 1), 1e-12)
          << "pp " << pp << " m " << m;
    }
  }
}

TEST(PipelineSchedule, InterleavedOrderAndBubble) {
  for (int pp : {2, 4}) {
    for (int chunks : {2, 3}) {
      for (int64_t m : {pp, 2 * pp, 4 * pp}) {
        const auto lists = all_ranks(ScheduleKind::Interleaved, pp, m, chunks);
        expect_complete(lists, m, chunks, false);
        const double simulated = bubble_fraction(simulate(lists, chunks, 1.0, 2.0, 0.0));
        EXPECT_NEAR(simulated, analytic_bubble_fraction(ScheduleKind::Interleaved, pp, m, chunks), 1e-12)
            << fmt::format("pp {} chunks {} m {}", pp, chunks, m);
      }
    }
  }
}

TEST(PipelineSchedule, ZeroBubbleH1OrderBubbleAndMemory) {
  for (int pp : {2, 3, 4, 8}) {
    for (int64_t m : {1, 2, 4, 8, 9, 16}) {
      const auto lists = all_ranks(ScheduleKind::ZeroBubble, pp, m, 1);
      expect_complete(lists, m, 1, true);
      for (int r = 0; r < pp; ++r) EXPECT_LE(peak_in_flight(lists[r]), pp);
      if (m < pp) {
        EXPECT_NO_THROW(simulate(lists, 1));
        continue;
      }
      const double simulated = bubble_fraction(simulate(lists, 1, 1.0, 1.0, 1.0));
      EXPECT_NEAR(simulated, analytic_bubble_fraction(ScheduleKind::ZeroBubble, pp, m, 1), 1e-12)
          << "pp " << pp << " m " << m;
      // A third of 1F1B's idle time: under half its fraction whenever M >= pp.
      EXPECT_LT(simulated, analytic_bubble_fraction(ScheduleKind::OneFOneB, pp, m, 1) / 2);
    }
  }
}

TEST(PipelineSchedule, SimulateCatchesDeadlocksAndMissingForwards) {
  // Both ranks wait for the other's backward first: a deadlock.
  std::vector<std::vector<Action>> stuck = {{{ActionKind::Forward, 0, 0}, {ActionKind::Backward, 0, 0}},
                                            {{ActionKind::Backward, 0, 0}, {ActionKind::Forward, 0, 0}}};
  EXPECT_THROW(simulate(stuck, 1), ConfigError);
  // Backward before forward on rank 1.
  EXPECT_THROW(simulate({{{ActionKind::Forward, 0, 0}}, {{ActionKind::Backward, 0, 0}}}, 1), ConfigError);
}

TEST(PipelineSchedule, InvalidSettingsAreConfigErrors) {
  EXPECT_THROW(make_schedule(ScheduleKind::Interleaved, 4, 0, 6, 2),
               ConfigError);  // 6 % 4
  EXPECT_THROW(make_schedule(ScheduleKind::Interleaved, 2, 0, 4, 1),
               ConfigError);  // one chunk
  EXPECT_THROW(make_schedule(ScheduleKind::OneFOneB, 2, 0, 4, 2), ConfigError);
  EXPECT_THROW(make_schedule(ScheduleKind::ZeroBubble, 2, 0, 0, 1), ConfigError);
  try {
    make_schedule(ScheduleKind::Interleaved, 4, 0, 6, 2);
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("use 8"), std::string::npos) << e.what();
  }
}

TEST(StageManager, BalancesByParameterCount) {
  // Equal blocks, no extras: even split.
  auto ranges = balance_blocks(std::vector<int64_t>(8, 10), 4);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(ranges[s].size(), 2);
  // A heavy embedding on the first stage pushes blocks to the later ones.
  ranges = balance_blocks(std::vector<int64_t>(8, 10), 2, /*first_extra=*/40);
  EXPECT_EQ(ranges[0].size(), 2);
  EXPECT_EQ(ranges[1].size(), 6);
  // Contiguous and covering.
  ranges = balance_blocks({5, 1, 1, 1, 9, 1, 1}, 3);
  EXPECT_EQ(ranges.front().begin, 0);
  EXPECT_EQ(ranges.back().end, 7);
  for (size_t s = 1; s < ranges.size(); ++s) EXPECT_EQ(ranges[s].begin, ranges[s - 1].end);
  EXPECT_THROW(balance_blocks(std::vector<int64_t>(3, 1), 4), ConfigError);
  EXPECT_THROW(ranges_from_counts({3, 3}, 7), ConfigError);
  EXPECT_THROW(ranges_from_counts({7, 0}, 7), ConfigError);
  EXPECT_EQ(ranges_from_counts({3, 4}, 7)[1].begin, 3);
}

TEST(StageManager, InterleavedPlacement) {
  // 8 blocks, pp 2, 2 chunks: virtual stages 0..3 of 2 blocks; rank 1 holds 1
  // and 3.
  StageManager stages(2, 1, 2, balance_blocks(std::vector<int64_t>(8, 1), 4));
  EXPECT_EQ(stages.virtual_stage(0), 1);
  EXPECT_EQ(stages.virtual_stage(1), 3);
  EXPECT_EQ(stages.blocks(1).begin, 6);
  EXPECT_TRUE(stages.is_last(1));
  EXPECT_FALSE(stages.is_first(0));
  EXPECT_TRUE(stages.owns_block(2));
  EXPECT_FALSE(stages.owns_block(4));
  EXPECT_TRUE(stages.holds_last_stage());
}

TEST(PipelinePlanReport, BubblesMemoryAndRecommendation) {
  // pp 4, 8 microbatches, 2 chunks, GPT-2 124M shapes at seq 1024, bf16.
  ScheduleReportOptions options{
      .pp_size = 4, .num_microbatches = 8, .num_model_chunks = 2, .num_layers = 12, .hidden_size = 768, .seq_len = 1024};
  const auto report = plan_pipeline(options);
  ASSERT_EQ(report.schedules.size(), 3u);
  const ScheduleReport& onefoneb = report.schedules[0];
  const ScheduleReport& interleaved = report.schedules[1];
  const ScheduleReport& zb = report.schedules[2];
  EXPECT_NEAR(onefoneb.bubble, 3.0 / 11, 1e-12);
  EXPECT_NEAR(interleaved.bubble, 3.0 / 19, 1e-12);
  EXPECT_NEAR(zb.bubble, 3.0 / 27, 1e-12);
  // 1F1B and ZB-H1: pp microbatches on the first rank; interleaved: Megatron's
  // warm-up (pp - 1) * 2 + (C - 1) * pp plus one chunk-microbatches, half a stage each.
  EXPECT_EQ(onefoneb.peak_in_flight, 4.0);
  EXPECT_EQ(zb.peak_in_flight, 4.0);
  EXPECT_EQ(interleaved.peak_in_flight, (3 * 2 + 4 + 1) / 2.0);
  const int64_t layer = layer_activation_bytes(1024, 1, 768, 2);
  EXPECT_EQ(layer, 1024 * 768 * 34);
  EXPECT_EQ(onefoneb.activation_bytes, 4 * 3 * layer);  // 4 microbatches x 3 layers per stage
  EXPECT_EQ(report.recommended, "zero_bubble");
  const std::string text = format_plan(options, report);
  EXPECT_NE(text.find("recommend: pp_style = \"zero_bubble\""), std::string::npos) << text;
  EXPECT_NE(text.find("0.273"), std::string::npos) << text;

  // 6 microbatches do not divide over pp 4 for interleaved: not runnable,
  // said why; fewer microbatches than stages gets a note.
  options.num_microbatches = 6;
  auto six = plan_pipeline(options);
  EXPECT_FALSE(six.schedules[1].runnable);
  EXPECT_NE(format_plan(options, six).find("interleaved not runnable"), std::string::npos);
  options.num_microbatches = 2;
  auto two = plan_pipeline(options);
  EXPECT_NE(format_plan(options, two).find("num_microbatches = 2 < pp_size = 4"), std::string::npos);
  // Bad options name the value.
  EXPECT_THROW(plan_pipeline({.pp_size = 1}), ConfigError);
  EXPECT_THROW(plan_pipeline({.pp_size = 4, .num_microbatches = 0}), ConfigError);
  // A count past any useful pipeline is refused at once, not listed action by action.
  EXPECT_THROW(plan_pipeline({.pp_size = 4, .num_microbatches = INT64_MAX}), ConfigError);
  EXPECT_THROW(plan_pipeline({.pp_size = 4, .num_microbatches = 8, .num_layers = 12}), ConfigError);
  EXPECT_THROW(plan_pipeline({.pp_size = 4, .num_microbatches = 8, .activation_bytes = 3}), ConfigError);
}

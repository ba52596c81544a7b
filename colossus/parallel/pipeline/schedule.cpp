#include "colossus/parallel/pipeline/schedule.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

namespace colossus::parallel::pipeline {

std::string to_string(const Action& action) {
  const char* letter = "F";
  switch (action.kind) {
    case ActionKind::Forward:
      letter = "F";
      break;
    case ActionKind::Backward:
      letter = "B";
      break;
    case ActionKind::BackwardInput:
      letter = "B";
      break;
    case ActionKind::BackwardWeight:
      letter = "W";
      break;
  }
  return action.chunk == 0 ? fmt::format("{}{}", letter, action.microbatch)
                           : fmt::format("{}{}.c{}", letter, action.microbatch, action.chunk);
}

void validate_schedule(ScheduleKind kind, int pp_size, int num_model_chunks, int64_t num_microbatches) {
  if (num_microbatches < 1) {
    throw ConfigError(
        fmt::format("pipeline: num_microbatches = {}; use at least pp_size = {}", num_microbatches, pp_size));
  }
  // A schedule lists every microbatch's actions: a million per step is
  // already far past any useful pipeline (the bubble shrinks as 1/microbatches).
  constexpr int64_t kMaxMicrobatches = 1'000'000;
  if (num_microbatches > kMaxMicrobatches) {
    throw ConfigError(fmt::format("pipeline: num_microbatches = {} is more than {}; use a few times pp_size = {}",
                                  num_microbatches, kMaxMicrobatches, pp_size));
  }
  if (kind == ScheduleKind::Interleaved) {
    if (num_model_chunks < 2) {
      throw ConfigError(
          fmt::format("pipeline: pp_style 'interleaved' with num_model_chunks "
                      "= {}; use num_model_chunks >= 2 (or pp_style "
                      "'1f1b')",
                      num_model_chunks));
    }
    if (num_microbatches % pp_size != 0) {
      const int64_t up = (num_microbatches + pp_size - 1) / pp_size * pp_size;
      throw ConfigError(
          fmt::format("pipeline: the interleaved schedule needs "
                      "num_microbatches to be a multiple of pp_size, got "
                      "num_microbatches = {} with pp_size = {}; use {}",
                      num_microbatches, pp_size, up));
    }
  } else if (num_model_chunks != 1) {
    throw ConfigError(
        fmt::format("pipeline: pp_style '{}' runs one model chunk per rank, "
                    "got num_model_chunks = {}; use num_model_chunks = 1 "
                    "or pp_style 'interleaved'",
                    kind == ScheduleKind::OneFOneB ? "1f1b" : "zero_bubble", num_model_chunks));
  }
}

std::vector<Action> one_f_one_b(int pp_size, int pp_rank, int64_t num_microbatches) {
  const int64_t warmup = std::min<int64_t>(pp_size - 1 - pp_rank, num_microbatches);
  std::vector<Action> actions;
  for (int64_t m = 0; m < warmup; ++m) actions.push_back({ActionKind::Forward, m, 0});
  for (int64_t i = 0; i < num_microbatches - warmup; ++i) {
    actions.push_back({ActionKind::Forward, warmup + i, 0});
    actions.push_back({ActionKind::Backward, i, 0});
  }
  for (int64_t m = num_microbatches - warmup; m < num_microbatches; ++m)
    actions.push_back({ActionKind::Backward, m, 0});
  return actions;
}

std::vector<Action> interleaved(int pp_size, int pp_rank, int64_t num_microbatches, int num_model_chunks) {
  const int64_t group = static_cast<int64_t>(pp_size) * num_model_chunks;
  const int64_t total = num_microbatches * num_model_chunks;
  auto action = [&](int64_t k, bool forward) {
    const int64_t in_group = k % group;
    int chunk = static_cast<int>(in_group / pp_size);
    if (!forward) chunk = num_model_chunks - 1 - chunk;
    const int64_t microbatch = (k / group) * pp_size + in_group % pp_size;
    return Action{forward ? ActionKind::Forward : ActionKind::Backward, microbatch, chunk};
  };
  int64_t warmup = total;
  if (num_microbatches != pp_size) {
    warmup =
        std::min<int64_t>(static_cast<int64_t>(pp_size - pp_rank - 1) * 2 + (num_model_chunks - 1) * pp_size, total);
  }
  std::vector<Action> actions;
  for (int64_t k = 0; k < warmup; ++k) actions.push_back(action(k, true));
  for (int64_t i = 0; i < total - warmup; ++i) {
    actions.push_back(action(warmup + i, true));
    actions.push_back(action(i, false));
  }
  for (int64_t k = total - warmup; k < total; ++k) actions.push_back(action(k, false));
  return actions;
}

std::vector<Action> zero_bubble_h1(int pp_size, int pp_rank, int64_t num_microbatches) {
  // Warm-up: pp - rank forwards (one more than 1F1B: the B passes are shorter).
  // Then per microbatch i: B(i), W(i - rank) once i >= rank, the next F. Later
  // stages defer more W passes, which fill the bubbles while they wait for
  // gradients; at most pp microbatches are in flight (1F1B's peak).
  const int64_t warmup = std::min<int64_t>(pp_size - pp_rank, num_microbatches);
  std::vector<Action> actions;
  int64_t next_f = 0, next_w = 0;
  while (next_f < warmup) actions.push_back({ActionKind::Forward, next_f++, 0});
  for (int64_t i = 0; i < num_microbatches; ++i) {
    actions.push_back({ActionKind::BackwardInput, i, 0});
    if (i >= pp_rank) actions.push_back({ActionKind::BackwardWeight, next_w++, 0});
    if (next_f < num_microbatches) actions.push_back({ActionKind::Forward, next_f++, 0});
  }
  while (next_w < num_microbatches) actions.push_back({ActionKind::BackwardWeight, next_w++, 0});
  return actions;
}

std::vector<Action> make_schedule(ScheduleKind kind, int pp_size, int pp_rank, int64_t num_microbatches,
                                  int num_model_chunks) {
  validate_schedule(kind, pp_size, num_model_chunks, num_microbatches);
  switch (kind) {
    case ScheduleKind::OneFOneB:
      return one_f_one_b(pp_size, pp_rank, num_microbatches);
    case ScheduleKind::Interleaved:
      return interleaved(pp_size, pp_rank, num_microbatches, num_model_chunks);
    case ScheduleKind::ZeroBubble:
      return zero_bubble_h1(pp_size, pp_rank, num_microbatches);
  }
  return {};
}

std::vector<Action> forward_only(int num_model_chunks, int64_t num_microbatches) {
  std::vector<Action> actions;
  for (int c = 0; c < num_model_chunks; ++c) {
    for (int64_t m = 0; m < num_microbatches; ++m) actions.push_back({ActionKind::Forward, m, c});
  }
  return actions;
}

std::vector<std::vector<TimedAction>> simulate(const std::vector<std::vector<Action>>& per_rank, int num_model_chunks,
                                               double f, double b, double w) {
  const int P = static_cast<int>(per_rank.size());
  const int V = P * num_model_chunks;
  // End time of each (kind, microbatch, virtual stage) that finished.
  std::map<std::tuple<int, int64_t, int>, double> done;
  auto key = [](ActionKind kind, int64_t m, int v) {
    const int k = kind == ActionKind::Forward ? 0 : kind == ActionKind::BackwardWeight ? 2 : 1;
    return std::make_tuple(k, m, v);
  };
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  std::vector<double> free_at(static_cast<size_t>(P), 0.0);
  std::vector<std::vector<TimedAction>> timelines(static_cast<size_t>(P));
  size_t remaining = 0;
  for (const auto& list : per_rank) remaining += list.size();
  while (remaining > 0) {
    bool progressed = false;
    for (int r = 0; r < P; ++r) {
      auto& i = next[static_cast<size_t>(r)];
      if (i >= per_rank[static_cast<size_t>(r)].size()) continue;
      const Action& a = per_rank[static_cast<size_t>(r)][i];
      const int v = a.chunk * P + r;
      double ready = free_at[static_cast<size_t>(r)];
      std::optional<std::tuple<int, int64_t, int>> dep;
      if (a.kind == ActionKind::Forward && v > 0) dep = key(ActionKind::Forward, a.microbatch, v - 1);
      if ((a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput) && v < V - 1)
        dep = key(ActionKind::Backward, a.microbatch, v + 1);
      if (a.kind != ActionKind::Forward && !done.contains(key(ActionKind::Forward, a.microbatch, v))) {
        throw ConfigError(fmt::format("pipeline schedule: {} on pp rank {} comes before its forward", to_string(a), r));
      }
      if (a.kind == ActionKind::BackwardWeight && !done.contains(key(ActionKind::Backward, a.microbatch, v))) {
        throw ConfigError(fmt::format("pipeline schedule: {} on pp rank {} comes before its B", to_string(a), r));
      }
      if (dep) {
        auto it = done.find(*dep);
        if (it == done.end()) continue;  // waits for another rank
        ready = std::max(ready, it->second);
      }
      const double cost = a.kind == ActionKind::Forward         ? f
                          : a.kind == ActionKind::Backward      ? b + w
                          : a.kind == ActionKind::BackwardInput ? b
                                                                : w;
      done[key(a.kind, a.microbatch, v)] = ready + cost;
      timelines[static_cast<size_t>(r)].push_back({a, ready, ready + cost});
      free_at[static_cast<size_t>(r)] = ready + cost;
      ++i;
      --remaining;
      progressed = true;
    }
    if (!progressed) {
      std::string stuck;
      for (int r = 0; r < P; ++r) {
        const auto i = next[static_cast<size_t>(r)];
        if (i < per_rank[static_cast<size_t>(r)].size())
          stuck += fmt::format(" rank {}: {};", r, to_string(per_rank[static_cast<size_t>(r)][i]));
      }
      throw ConfigError("pipeline schedule deadlocks; waiting:" + stuck);
    }
  }
  return timelines;
}

double bubble_fraction(const std::vector<std::vector<TimedAction>>& timelines) {
  double begin = std::numeric_limits<double>::max(), end = std::numeric_limits<double>::lowest(), busy = 0.0;
  for (const auto& t : timelines) {
    for (const auto& e : t) {
      begin = std::min(begin, e.start_us);
      end = std::max(end, e.end_us);
      busy += e.end_us - e.start_us;
    }
  }
  if (timelines.empty() || end <= begin) return 0.0;
  return 1.0 - busy / ((end - begin) * static_cast<double>(timelines.size()));
}

double analytic_bubble_fraction(ScheduleKind kind, int pp_size, int64_t num_microbatches, int num_model_chunks) {
  const double p = pp_size - 1;
  const auto m = static_cast<double>(num_microbatches);
  switch (kind) {
    case ScheduleKind::OneFOneB:
      return p / (m + p);
    case ScheduleKind::Interleaved:
      return p / (num_model_chunks * m + p);
    case ScheduleKind::ZeroBubble:
      return p / (3.0 * m + p);
  }
  return 0.0;
}

}  // namespace colossus::parallel::pipeline

#include "colossus/parallel/pipeline/schedule_report.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace colossus::parallel::pipeline {

void ScheduleReportOptions::validate() const {
  if (pp_size < 2) throw ConfigError(fmt::format("plan: pp_size = {}; a pipeline needs at least 2, e.g. 4", pp_size));
  if (num_microbatches < 1) {
    throw ConfigError(fmt::format("plan: num_microbatches = {}; use at least pp_size = {} (4 x pp_size = {} keeps "
                                  "1f1b's bubble under 20%)",
                                  num_microbatches, pp_size, 4 * pp_size));
  }
  // The report simulates every action of every microbatch.
  if (num_microbatches > 1'000'000) {
    throw ConfigError(fmt::format("plan: num_microbatches = {} is more than 1000000; the bubble is already under "
                                  "{:.1e} of the step at that count",
                                  num_microbatches, static_cast<double>(pp_size - 1) / 1e6));
  }
  if (num_model_chunks < 2) {
    throw ConfigError(fmt::format(
        "plan: num_model_chunks = {}; the interleaved row needs at least 2 chunks per rank, e.g. 2", num_model_chunks));
  }
  const bool any_shape = num_layers > 0 || hidden_size > 0 || seq_len > 0;
  if (any_shape && (num_layers <= 0 || hidden_size <= 0 || seq_len <= 0)) {
    throw ConfigError(fmt::format("plan: give num_layers, hidden_size and seq_len together (got {}, {}, {}), e.g. "
                                  "12, 768, 1024, or a model",
                                  num_layers, hidden_size, seq_len));
  }
  if (num_layers > 0 && num_layers < pp_size) {
    throw ConfigError(fmt::format("plan: {} layers cannot fill pp_size = {} stages; use pp_size <= {}", num_layers,
                                  pp_size, num_layers));
  }
  if (microbatch_size < 1) {
    throw ConfigError(fmt::format("plan: microbatch_size = {}; use 1 or more", microbatch_size));
  }
  if (activation_bytes != 2 && activation_bytes != 4) {
    throw ConfigError(
        fmt::format("plan: activation_bytes = {}; use 2 (bf16/fp16) or 4 (fp32)", activation_bytes));
  }
}

int64_t layer_activation_bytes(int64_t seq_len, int64_t microbatch_size, int64_t hidden_size,
                               int64_t activation_bytes) {
  return seq_len * microbatch_size * hidden_size * 34 * activation_bytes / 2;
}

int64_t peak_in_flight(const std::vector<Action>& actions) {
  int64_t live = 0, peak = 0;
  for (const auto& a : actions) {
    if (a.kind == ActionKind::Forward) peak = std::max(peak, ++live);
    if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardWeight) --live;
  }
  return peak;
}

namespace {

ScheduleReport report_one(const ScheduleReportOptions& o, ScheduleKind kind, const char* name, int chunks) {
  ScheduleReport row{.name = name, .num_model_chunks = chunks};
  try {
    validate_schedule(kind, o.pp_size, chunks, o.num_microbatches);
  } catch (const ConfigError& e) {
    row.runnable = false;
    row.why_not = e.what();
    return row;
  }
  std::vector<std::vector<Action>> lists;
  int64_t peak_chunks = 0;
  for (int r = 0; r < o.pp_size; ++r) {
    lists.push_back(make_schedule(kind, o.pp_size, r, o.num_microbatches, chunks));
    peak_chunks = std::max(peak_chunks, peak_in_flight(lists.back()));
  }
  row.bubble = bubble_fraction(simulate(lists, chunks, 1.0, 1.0, 1.0));
  row.peak_in_flight = static_cast<double>(peak_chunks) / chunks;
  if (o.num_layers > 0) {
    // The deepest stage (chunk) bounds what a rank holds per microbatch.
    const int64_t virtual_stages = static_cast<int64_t>(o.pp_size) * chunks;
    const int64_t layers_per_chunk = (o.num_layers + virtual_stages - 1) / virtual_stages;
    row.activation_bytes =
        peak_chunks * layers_per_chunk *
        layer_activation_bytes(o.seq_len, o.microbatch_size, o.hidden_size, o.activation_bytes);
  }
  return row;
}

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

PipelinePlanReport plan_pipeline(const ScheduleReportOptions& o) {
  o.validate();
  PipelinePlanReport report;
  report.schedules = {report_one(o, ScheduleKind::OneFOneB, "1f1b", 1),
                      report_one(o, ScheduleKind::Interleaved, "interleaved", o.num_model_chunks),
                      report_one(o, ScheduleKind::ZeroBubble, "zero_bubble", 1)};
  if (o.num_layers > 0 && o.num_layers < static_cast<int64_t>(o.pp_size) * o.num_model_chunks) {
    auto& row = report.schedules[1];
    row.runnable = false;
    row.why_not = fmt::format("{} layers cannot fill pp_size x num_model_chunks = {} virtual stages", o.num_layers,
                              o.pp_size * o.num_model_chunks);
  }
  // Lowest bubble; on a tie (within 1e-9), fewer activations held.
  const ScheduleReport* best = nullptr;
  for (const auto& row : report.schedules) {
    if (!row.runnable) continue;
    if (best == nullptr || row.bubble < best->bubble - 1e-9 ||
        (std::abs(row.bubble - best->bubble) <= 1e-9 && row.peak_in_flight < best->peak_in_flight)) {
      best = &row;
    }
  }
  report.recommended = best->name;  // 1f1b runs for any M >= 1
  if (o.num_microbatches < o.pp_size) {
    report.notes.push_back(fmt::format(
        "num_microbatches = {} < pp_size = {}: some stage is always idle; use at least 4 x pp_size = {} microbatches",
        o.num_microbatches, o.pp_size, 4 * o.pp_size));
  }
  if (report.recommended == "zero_bubble") {
    report.notes.push_back(
        "zero_bubble splits each backward into B (input gradient) and W (weight gradient): W walks the autograd "
        "graph a second time, and gradient_checkpointing_ratio is refused with it; when activations do not fit, "
        "interleaved or 1f1b with gradient_checkpointing_ratio > 0");
  }
  for (const auto& row : report.schedules) {
    if (!row.runnable) report.notes.push_back(fmt::format("{} not runnable here: {}", row.name, row.why_not));
  }
  return report;
}

std::string format_plan(const ScheduleReportOptions& o, const PipelinePlanReport& report) {
  std::string out = fmt::format("pipeline plan: pp_size {}, num_microbatches {}", o.pp_size, o.num_microbatches);
  if (o.num_layers > 0) {
    out += fmt::format(
        "; {} layers, hidden {}, seq_len {}, microbatch_size {}, {}-byte activations ({} per layer per microbatch)",
        o.num_layers, o.hidden_size, o.seq_len, o.microbatch_size, o.activation_bytes,
        mib(layer_activation_bytes(o.seq_len, o.microbatch_size, o.hidden_size, o.activation_bytes)));
  }
  out += "\n\n";
  out += fmt::format("{:<12} {:>6} {:>8} {:>22} {:>18}\n", "pp_style", "chunks", "bubble", "peak in flight (mb)",
                     o.num_layers > 0 ? "activations/rank" : "");
  for (const auto& row : report.schedules) {
    if (!row.runnable) {
      out += fmt::format("{:<12} {:>6} {:>8} {:>22} {:>18}\n", row.name, row.num_model_chunks, "-", "-", "");
      continue;
    }
    out += fmt::format("{:<12} {:>6} {:>8.3f} {:>22.2f} {:>18}\n", row.name, row.num_model_chunks, row.bubble,
                       row.peak_in_flight, o.num_layers > 0 ? mib(row.activation_bytes) : "");
  }
  const auto& best = *std::find_if(report.schedules.begin(), report.schedules.end(),
                                   [&](const ScheduleReport& r) { return r.name == report.recommended; });
  out += fmt::format("\nrecommend: pp_style = \"{}\"{} (bubble {:.3f}, {:.2f} microbatches of activations in flight)\n",
                     best.name, best.name == "interleaved" ? fmt::format(", num_model_chunks = {}", best.num_model_chunks) : "",
                     best.bubble, best.peak_in_flight);
  for (const auto& note : report.notes) out += "note: " + note + "\n";
  out +=
      "\nbubble: idle / total time per rank with forward : input-backward : weight-backward = 1 : 1 : 1 (1f1b "
      "(p-1)/(m+p-1), interleaved (p-1)/(c*m+p-1), zero_bubble (p-1)/(3m+p-1) for m >= p); peak in flight: the most "
      "microbatches' activations any rank holds, in whole stages";
  if (o.num_layers > 0) out += "; activations: s*b*h*34 bytes per layer at 2 bytes (Korthikanti et al. 2022), an estimate";
  out += "\n";
  return out;
}

}  // namespace colossus::parallel::pipeline

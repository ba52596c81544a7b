#include "colossus/parallel/pipeline/runtime.h"

#include "colossus/cluster/launch.h"
#include "colossus/core/errors.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <optional>

namespace colossus::parallel::pipeline {

namespace {

double now_us() {
  using namespace std::chrono;
  return static_cast<double>(duration_cast<microseconds>(system_clock::now().time_since_epoch()).count());
}

// What a (microbatch, chunk) keeps between its forward and its backward.
struct InFlight {
  at::Tensor input;        // leaf requiring grad; undefined on the first virtual stage
  at::Tensor output;       // hidden state, or the (scaled, at backward) loss on the
                           // last virtual stage
  at::Tensor output_grad;  // zero-bubble: kept from B for W; undefined on the
                           // last virtual stage
};

bool needs_recv(const StageManager& stages, const Action& a) {
  if (a.kind == ActionKind::Forward) return !stages.is_first(a.chunk);
  if (a.kind == ActionKind::BackwardWeight) return false;
  return !stages.is_last(a.chunk);
}

}  // namespace

PipelineRuntime::PipelineRuntime(const StageManager& stages, cluster::ProcessGroupPtr pp_group, bool overlap_p2p)
    : stages_(stages), p2p_(std::move(pp_group)), overlap_p2p_(overlap_p2p) {}

RunResult PipelineRuntime::run(const std::vector<Action>& actions, const StageFunctions& functions,
                               int64_t num_microbatches, const std::vector<int64_t>& shape_key, c10::Device device, bool forward_only) {
  if (shape_key != last_shape_key_) {
    p2p_.reset_shapes();
    last_shape_key_ = shape_key;
  }
  const int V = stages_.num_virtual_stages();
  // Channel of activations into virtual stage v: v; of gradients into v: V + v.
  auto activation_channel = [](int v) { return v; };
  auto gradient_channel = [V](int v) { return V + v; };
  // The channel and peer an action receives on.
  auto source = [&](const Action& a) {
    const int v = stages_.virtual_stage(a.chunk);
    if (a.kind == ActionKind::Forward) return std::make_pair(stages_.rank_of(v - 1), activation_channel(v));
    return std::make_pair(stages_.rank_of(v + 1), gradient_channel(v));
  };

  std::map<std::pair<int64_t, int>, InFlight> in_flight;  // (microbatch, chunk)
  std::map<size_t, PipelineP2P::Pending> posted;          // action index -> its receive
  RunResult result;
  result.losses.resize(static_cast<size_t>(num_microbatches));

  auto post = [&](size_t index) {
    if (posted.contains(index)) return;
    const auto [peer, channel] = source(actions[index]);
    posted.emplace(index, p2p_.post_recv(peer, channel, device));
  };
  auto receive = [&](size_t index) {
    post(index);
    auto pending = std::move(posted.at(index));
    posted.erase(index);
    pending.work.wait();
    return pending.tensor;
  };

  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (a.microbatch < 0 || a.microbatch >= num_microbatches || a.chunk < 0 || a.chunk >= stages_.num_model_chunks()) {
      throw ConfigError(fmt::format("pipeline: action {} is outside {} microbatches x {} chunks", to_string(a),
                                    num_microbatches, stages_.num_model_chunks()));
    }
    at::Tensor received;
    if (needs_recv(stages_, a)) received = receive(i);
    if (overlap_p2p_) {
      // Post the next receive now, so it lands while this action computes. Only
      // once its shape is cached: the first message's shape is a blocking
      // receive.
      for (size_t j = i + 1; j < actions.size(); ++j) {
        if (!needs_recv(stages_, actions[j])) continue;
        const auto [peer, channel] = source(actions[j]);
        if (p2p_.shape_known(peer, channel)) post(j);
        break;
      }
    }
    const int v = stages_.virtual_stage(a.chunk);
    const bool first = stages_.is_first(a.chunk);
    const bool last = stages_.is_last(a.chunk);
    const auto key = std::make_pair(a.microbatch, a.chunk);
    TimedAction timed{a, now_us(), 0.0};

    if (forward_only && a.kind != ActionKind::Forward) {
      throw ConfigError(fmt::format("pipeline: a forward-only run got {}", to_string(a)));
    }
    if (a.kind == ActionKind::Forward) {
      if (in_flight.contains(key)) throw ConfigError(fmt::format("pipeline: {} runs twice", to_string(a)));
      InFlight state;
      if (!first) state.input = forward_only ? received : received.requires_grad_(true);
      state.output = functions.forward(a.chunk, a.microbatch, state.input);
      if (last) {
        result.losses[static_cast<size_t>(a.microbatch)] = state.output.detach();
        if (functions.scale_loss && !forward_only) state.output = functions.scale_loss(state.output);
      } else {
        p2p_.send(state.output.detach(), stages_.rank_of(v + 1), activation_channel(v + 1));
      }
      if (!forward_only) in_flight.emplace(key, std::move(state));
    } else {
      auto it = in_flight.find(key);
      if (it == in_flight.end()) {
        throw ConfigError(
            fmt::format("pipeline: {} has no forward before it on pp rank {}", to_string(a), stages_.pp_rank()));
      }
      InFlight& state = it->second;
      if (a.kind == ActionKind::Backward) {
        if (last) {
          torch::autograd::backward({state.output});
        } else {
          torch::autograd::backward({state.output}, {received});
        }
        if (!first) p2p_.send(state.input.grad(), stages_.rank_of(v - 1), gradient_channel(v - 1));
        in_flight.erase(it);
      } else if (a.kind == ActionKind::BackwardInput) {
        if (!last) state.output_grad = received;
        if (!first) {
          auto grads =
              torch::autograd::grad({state.output}, {state.input},
                                    last ? torch::autograd::variable_list{} : torch::autograd::variable_list{received},
                                    /*retain_graph=*/true);
          p2p_.send(grads[0], stages_.rank_of(v - 1), gradient_channel(v - 1));
        }
      } else {  // BackwardWeight
        std::vector<at::Tensor> params;
        for (const auto& p : functions.parameters(a.chunk)) {
          if (p.requires_grad()) params.push_back(p);
        }
        if (!params.empty()) {
          torch::autograd::backward(
              {state.output},
              last ? torch::autograd::variable_list{} : torch::autograd::variable_list{state.output_grad},
              /*retain_graph=*/false, /*create_graph=*/false, params);
        }
        in_flight.erase(it);
      }
    }
    timed.end_us = now_us();
    result.timeline.push_back(timed);
  }
  p2p_.flush();
  if (!in_flight.empty()) {
    const auto& [mb, chunk] = in_flight.begin()->first;
    throw ConfigError(
        fmt::format("pipeline: the schedule left microbatch {} "
                    "of chunk {} without its backward",
                    mb, chunk));
  }
  return result;
}

std::string chrome_trace_json(const std::vector<std::vector<TimedAction>>& timelines) {
  double origin = std::numeric_limits<double>::max();
  for (const auto& t : timelines) {
    for (const auto& e : t) origin = std::min(origin, e.start_us);
  }
  nlohmann::json events = nlohmann::json::array();
  for (size_t rank = 0; rank < timelines.size(); ++rank) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", rank},
                      {"args", {{"name", fmt::format("pp rank {}", rank)}}}});
    for (const auto& e : timelines[rank]) {
      const char* category = e.action.kind == ActionKind::Forward          ? "forward"
                             : e.action.kind == ActionKind::BackwardWeight ? "weight_backward"
                                                                           : "backward";
      events.push_back({{"name", to_string(e.action)},
                        {"cat", category},
                        {"ph", "X"},
                        {"pid", 0},
                        {"tid", rank},
                        {"ts", e.start_us - origin},
                        {"dur", e.end_us - e.start_us},
                        {"args", {{"microbatch", e.action.microbatch}, {"chunk", e.action.chunk}}}});
    }
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

std::vector<std::vector<TimedAction>> gather_timelines(cluster::ProcessGroup& pp_group,
                                                       const std::vector<TimedAction>& local) {
  // Rows of (kind, microbatch, chunk, start, end) in doubles (exact for these
  // integers and microsecond times), padded to the longest timeline.
  const auto device = pp_group.device();
  at::Tensor count = at::full({1}, static_cast<double>(local.size()), at::TensorOptions(at::kDouble).device(device));
  std::vector<at::Tensor> counts;
  for (int r = 0; r < pp_group.size(); ++r) counts.push_back(at::empty_like(count));
  pp_group.all_gather(counts, count).wait();
  int64_t longest = 1;
  for (auto& c : counts) longest = std::max(longest, static_cast<int64_t>(c.cpu().item<double>()));
  at::Tensor mine = at::zeros({longest, 5}, at::kDouble);
  double* row = mine.data_ptr<double>();
  for (const auto& e : local) {
    *row++ = static_cast<double>(e.action.kind);
    *row++ = static_cast<double>(e.action.microbatch);
    *row++ = e.action.chunk;
    *row++ = e.start_us;
    *row++ = e.end_us;
  }
  mine = mine.to(device);
  std::vector<at::Tensor> all;
  for (int r = 0; r < pp_group.size(); ++r) all.push_back(at::empty_like(mine));
  pp_group.all_gather(all, mine).wait();
  std::vector<std::vector<TimedAction>> timelines(static_cast<size_t>(pp_group.size()));
  for (int r = 0; r < pp_group.size(); ++r) {
    const at::Tensor rows = all[static_cast<size_t>(r)].cpu();
    const auto n = static_cast<int64_t>(counts[static_cast<size_t>(r)].cpu().item<double>());
    const double* p = rows.data_ptr<double>();
    for (int64_t i = 0; i < n; ++i, p += 5) {
      timelines[static_cast<size_t>(r)].push_back(
          {{static_cast<ActionKind>(static_cast<int>(p[0])), static_cast<int64_t>(p[1]), static_cast<int>(p[2])},
           p[3],
           p[4]});
    }
  }
  return timelines;
}

}  // namespace colossus::parallel::pipeline

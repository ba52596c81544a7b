// /metrics: the engine loop's gauges and counters and the HTTP response
// counts, in Prometheus' text exposition format (version 0.0.4).
#pragma once
#include "colossus/inference/serving/engine_loop.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace colossus::inference::serving {

using HttpCounts = std::map<std::pair<std::string, int>, int64_t>;  // (endpoint, status) -> responses

// tensor_parallel_size: the ranks the engine is split over (1: one process).
std::string render_metrics(const LoopStats& stats, const HttpCounts& http, const std::string& model_name,
                           int64_t tensor_parallel_size = 1);

}  // namespace colossus::inference::serving

// Prometheus text for /metrics; see server_metrics.h.
#include "colossus/inference/serving/server_metrics.h"

#include <fmt/format.h>

namespace colossus::inference::serving {

namespace {

// Label values escape backslash, quote and newline.
std::string label(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void metric(std::string& out, const char* name, const char* type, const char* help, const std::string& model,
            double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{{model=\"{}\"}} {}\n", name, help, name, type, name, label(model),
                     value);
}

// vLLM's names and label (model_name), so dashboards built for vLLM read ours.
void vllm_metric(std::string& out, const char* name, const char* type, const char* help, const std::string& model,
                 double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{{model_name=\"{}\"}} {}\n", name, help, name, type, name,
                     label(model), value);
}

void vllm_histogram(std::string& out, const char* name, const char* help, const std::string& model,
                    const LatencyHistogram& h) {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  int64_t cumulative = 0;
  for (size_t i = 0; i <= h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    const std::string le = i < h.bounds.size() ? fmt::format("{}", h.bounds[i]) : "+Inf";
    out += fmt::format("{}_bucket{{model_name=\"{}\",le=\"{}\"}} {}\n", name, label(model), le, cumulative);
  }
  out += fmt::format("{}_sum{{model_name=\"{}\"}} {}\n", name, label(model), h.sum);
  out += fmt::format("{}_count{{model_name=\"{}\"}} {}\n", name, label(model), h.count);
}

}  // namespace

std::string render_metrics(const LoopStats& stats, const HttpCounts& http, const std::string& model_name,
                           int64_t tensor_parallel_size) {
  const EngineStats& e = stats.engine;
  std::string out;
  auto d = [](int64_t v) { return static_cast<double>(v); };
  metric(out, "colossus:requests_waiting", "gauge", "Requests queued for admission.", model_name, d(e.waiting));
  metric(out, "colossus:requests_running", "gauge", "Requests being decoded.", model_name, d(e.running));
  metric(out, "colossus:kv_blocks_used", "gauge", "KV cache blocks held by requests.", model_name, d(e.blocks_used));
  metric(out, "colossus:kv_blocks_total", "gauge", "KV cache blocks in the pool.", model_name, d(e.blocks_total));
  metric(out, "colossus:kv_block_size_tokens", "gauge", "Tokens per KV cache block.", model_name, d(e.block_size));
  metric(out, "colossus:kv_cache_usage_ratio", "gauge", "Share of the KV pool in use.", model_name,
         e.blocks_total > 0 ? d(e.blocks_used) / d(e.blocks_total) : 0.0);
  metric(out, "colossus:engine_steps_total", "counter", "Engine steps (batches) run.", model_name, d(e.steps));
  metric(out, "colossus:prompt_tokens_total", "counter", "Prompt tokens computed in prefill (prefix-cache hits excluded).",
         model_name, d(e.prompt_tokens));
  metric(out, "colossus:generation_tokens_total", "counter", "Tokens generated.", model_name, d(e.generated_tokens));
  metric(out, "colossus:prompt_tokens_per_second", "gauge", "Prefill throughput over the last 5 s.", model_name,
         stats.prompt_tokens_per_second);
  metric(out, "colossus:generation_tokens_per_second", "gauge", "Generation throughput over the last 5 s.", model_name,
         stats.generation_tokens_per_second);
  metric(out, "colossus:preemptions_total", "counter", "Requests preempted (recomputed later) for lack of KV blocks.",
         model_name, d(e.preemptions));
  metric(out, "colossus:prefix_cache_queries_total", "counter", "Prompt blocks looked up in the prefix cache.",
         model_name, d(e.prefix_cache_queries));
  metric(out, "colossus:prefix_cache_hits_total", "counter", "Prompt blocks found in the prefix cache.", model_name,
         d(e.prefix_cache_hits));
  metric(out, "colossus:requests_rejected_total", "counter", "Submissions the engine refused.", model_name,
         d(stats.rejected));
  metric(out, "colossus:tensor_parallel_size", "gauge", "Ranks (processes, GPUs) the model is split over.",
         model_name, d(tensor_parallel_size));

  vllm_metric(out, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", model_name,
              d(e.running));
  vllm_metric(out, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", model_name,
              d(e.waiting));
  const double cache_usage = e.blocks_total > 0 ? d(e.blocks_used) / d(e.blocks_total) : 0.0;
  // Both names: dashboards made for vLLM before and after its V1 rename.
  vllm_metric(out, "vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", model_name,
              cache_usage);
  vllm_metric(out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", model_name,
              cache_usage);
  vllm_metric(out, "vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
              model_name, d(e.preemptions));
  vllm_metric(out, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", model_name,
              d(stats.prompt_tokens));
  vllm_metric(out, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", model_name,
              d(e.generated_tokens));
  vllm_histogram(out, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", model_name,
                 stats.time_to_first_token);
  vllm_histogram(out, "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                 model_name, stats.time_per_output_token);
  vllm_histogram(out, "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
                 model_name, stats.e2e_request_latency);

  out += "# HELP colossus:requests_finished_total Prompts finished, by OpenAI finish_reason.\n";
  out += "# TYPE colossus:requests_finished_total counter\n";
  for (const auto& [reason, count] : {std::pair<const char*, int64_t>{"stop", stats.finished_stop},
                                      {"length", stats.finished_length},
                                      {"abort", stats.finished_abort}}) {
    out += fmt::format("colossus:requests_finished_total{{model=\"{}\",finish_reason=\"{}\"}} {}\n", label(model_name),
                       reason, count);
  }
  out += "# HELP vllm:request_success_total Count of successfully processed requests.\n";
  out += "# TYPE vllm:request_success_total counter\n";
  for (const auto& [reason, count] : {std::pair<const char*, int64_t>{"stop", stats.finished_stop},
                                      {"length", stats.finished_length},
                                      {"abort", stats.finished_abort}}) {
    out += fmt::format("vllm:request_success_total{{finished_reason=\"{}\",model_name=\"{}\"}} {}\n", reason,
                       label(model_name), count);
  }
  out += "# HELP colossus:http_requests_total HTTP responses, by endpoint and status code.\n";
  out += "# TYPE colossus:http_requests_total counter\n";
  for (const auto& [key, count] : http) {
    out += fmt::format("colossus:http_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", label(key.first),
                       key.second, count);
  }
  return out;
}

}  // namespace colossus::inference::serving

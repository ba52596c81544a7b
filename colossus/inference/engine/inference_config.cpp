#include "colossus/inference/engine/inference_config.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace colossus::inference {

namespace {

c10::ScalarType parse_dtype(const std::string& field, const std::string& name) {
  if (name == "fp32" || name == "float32") return c10::kFloat;
  if (name == "fp16" || name == "float16") return c10::kHalf;
  if (name == "bf16" || name == "bfloat16") return c10::kBFloat16;
  throw ConfigError(fmt::format("inference {} \"{}\" is not supported; use fp32, fp16 or bf16", field, name));
}

void require_positive(const char* field, int64_t value) {
  if (value < 1) throw ConfigError(fmt::format("inference {} is {}; it must be at least 1", field, value));
}

double gib(int64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30); }

}  // namespace

void InferenceConfig::validate() const {
  require_positive("max_batch_size", max_batch_size);
  require_positive("max_input_len", max_input_len);
  require_positive("max_output_len", max_output_len);
  require_positive("block_size", block_size);
  require_positive("beam_width", beam_width);
  require_positive("tp_size", tp_size);
  if (max_num_batched_tokens < 0) {
    throw ConfigError(fmt::format("inference max_num_batched_tokens is {}; use 0 (automatic) or a positive budget",
                                  max_num_batched_tokens));
  }
  if (num_blocks < 0) {
    throw ConfigError(fmt::format("inference num_blocks is {}; use 0 (size from memory) or a positive count", num_blocks));
  }
  if (!(prefill_ratio > 0.0 && prefill_ratio <= 1.0)) {
    throw ConfigError(fmt::format("inference prefill_ratio is {}; it must be in (0, 1]", prefill_ratio));
  }
  if (!(kv_cache_memory_fraction > 0.0 && kv_cache_memory_fraction < 1.0)) {
    throw ConfigError(fmt::format("inference kv_cache_memory_fraction is {}; it must be in (0, 1)", kv_cache_memory_fraction));
  }
  if (gpu_memory_utilization && !(*gpu_memory_utilization > 0.0 && *gpu_memory_utilization <= 1.0)) {
    throw ConfigError(fmt::format("inference gpu_memory_utilization is {}; it must be in (0, 1], the share of the GPU's "
                                  "total memory for weights, activations and the KV cache (e.g. 0.9)",
                                  *gpu_memory_utilization));
  }
  if (no_repeat_ngram_size < 0) {
    throw ConfigError(fmt::format("inference no_repeat_ngram_size is {}; use 0 (off) or a positive n", no_repeat_ngram_size));
  }
  if (use_spec_dec) require_positive("max_n_spec_tokens", max_n_spec_tokens);
  if (use_cuda_graph) require_positive("max_context_len_to_capture", max_context_len_to_capture);
  if (enable_streamingllm) {
    require_positive("start_token_size", start_token_size);
    require_positive("generated_token_size", generated_token_size);
    if (start_token_size % block_size != 0 || generated_token_size % block_size != 0) {
      throw ConfigError(fmt::format(
          "StreamingLLM drops whole KV blocks: start_token_size ({}) and generated_token_size ({}) must be "
          "multiples of block_size ({})",
          start_token_size, generated_token_size, block_size));
    }
  }
  (void)model_dtype();
  (void)cache_dtype();
  default_sampling().validate();
}

c10::ScalarType InferenceConfig::model_dtype() const { return parse_dtype("dtype", dtype); }

c10::ScalarType InferenceConfig::cache_dtype() const {
  return kv_cache_dtype == "auto" ? model_dtype() : parse_dtype("kv_cache_dtype", kv_cache_dtype);
}

int64_t InferenceConfig::token_budget() const {
  return max_num_batched_tokens > 0 ? max_num_batched_tokens : std::max(max_input_len, max_batch_size);
}

SamplingParams InferenceConfig::default_sampling() const {
  return SamplingParams{.do_sample = do_sample,
                        .temperature = temperature,
                        .top_k = top_k,
                        .top_p = top_p,
                        .repetition_penalty = repetition_penalty,
                        .seed = seed};
}

int64_t kv_pool_bytes(const InferenceConfig& config, const metrics::DeviceMemory& memory, int64_t activation_bytes,
                      int64_t block_bytes) {
  // What the caching allocator holds but no tensor uses is ours to reuse.
  const int64_t reusable = memory.free_bytes + memory.reserved_bytes - memory.allocated_bytes;
  if (!config.gpu_memory_utilization) {
    const auto budget = static_cast<int64_t>(config.kv_cache_memory_fraction * static_cast<double>(reusable)) - activation_bytes;
    if (budget < block_bytes) {
      throw ConfigError(fmt::format("no device memory is left for the KV cache ({} MiB free after the model); "
                                    "lower max_num_batched_tokens or set num_blocks",
                                    reusable >> 20));
    }
    return budget;
  }
  const double utilization = *config.gpu_memory_utilization;
  const double total = static_cast<double>(memory.total_bytes);
  const int64_t budget = static_cast<int64_t>(utilization * total) - memory.allocated_bytes - activation_bytes;
  if (budget < block_bytes) {
    const double least = static_cast<double>(memory.allocated_bytes + activation_bytes + block_bytes) / total;
    throw ConfigError(fmt::format(
        "gpu_memory_utilization {} of the GPU's {:.2f} GiB leaves no room for the KV cache after {:.2f} GiB of weights "
        "(and other tensors) and {:.2f} GiB of activation headroom for max_num_batched_tokens {}; {}",
        utilization, gib(memory.total_bytes), gib(memory.allocated_bytes), gib(activation_bytes), config.token_budget(),
        least <= 1.0 ? fmt::format("raise gpu_memory_utilization to at least {:.2f}, or lower max_num_batched_tokens",
                                   std::ceil(least * 100) / 100)
                     : std::string("lower max_num_batched_tokens, or use a GPU with more memory")));
  }
  if (budget > reusable - activation_bytes) {
    // vLLM refuses this too: the share asked for is not free (other processes hold it).
    const double most = std::floor(static_cast<double>(reusable + memory.allocated_bytes) / total * 100) / 100;
    throw ConfigError(fmt::format(
        "gpu_memory_utilization {} asks for {:.2f} GiB of the GPU's {:.2f} GiB, but only {:.2f} GiB is free besides "
        "the {:.2f} GiB this process already holds ({:.2f} GiB is used by CUDA contexts and other processes); lower "
        "gpu_memory_utilization to at most {:.2f}, or free the GPU",
        utilization, gib(static_cast<int64_t>(utilization * total)), gib(memory.total_bytes), gib(reusable),
        gib(memory.allocated_bytes), gib(std::max<int64_t>(0, memory.total_bytes - memory.free_bytes - memory.reserved_bytes)), most));
  }
  return budget;
}

}  // namespace colossus::inference

#include "colossus/inference/engine/inference_config.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>

#include <algorithm>

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

}  // namespace colossus::inference

// The engine's options, named as Colossal-AI's InferenceConfig where a field
// applies, plus the KV pool and scheduling knobs it leaves implicit.
#pragma once
#include "colossus/inference/sampler.h"
#include "colossus/metrics/memory.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>

namespace colossus::inference {

struct InferenceConfig {
  // Batching and lengths.
  int64_t max_batch_size = 8;     // sequences decoded together in one step
  int64_t max_input_len = 256;    // prompt tokens a request may bring
  int64_t max_output_len = 256;   // default and upper bound of a request's max_new_tokens
  // Tokens one step may process (prefill chunks + decode tokens); 0 = max(max_input_len, max_batch_size).
  int64_t max_num_batched_tokens = 0;
  // Of that budget, the share prefill chunks may take while sequences are
  // decoding (so running requests keep streaming while long prompts arrive).
  double prefill_ratio = 1.0;

  // Precision: "fp32", "fp16", "bf16" for the model; the KV cache follows
  // kv_cache_dtype ("auto" = the model's).
  std::string dtype = "fp32";
  std::string kv_cache_dtype = "auto";

  // KV cache: tokens per block; the pool has num_blocks blocks, or, when 0,
  // on CUDA as many as fit in the memory budget (kv_pool_bytes below), on
  // the CPU enough for max_batch_size full-length sequences.
  int64_t block_size = 16;
  int64_t num_blocks = 0;
  // The CUDA budget, one of two kinds. Set, gpu_memory_utilization is
  // vLLM's: the share (0, 1] of the device's total memory this process may
  // use for weights, activations and the KV cache (`colossus serve` sets
  // it, 0.9 by default). Unset, the pool takes kv_cache_memory_fraction of
  // the memory free after the model. Either way one step's activations are
  // kept back.
  std::optional<double> gpu_memory_utilization{};
  double kv_cache_memory_fraction = 0.9;
  bool enable_prefix_caching = true;

  // Default sampling of requests that do not set their own.
  bool do_sample = false;
  int64_t top_k = 0;
  double top_p = 1.0;
  double temperature = 1.0;
  double repetition_penalty = 1.0;
  int64_t no_repeat_ngram_size = 0;
  bool ignore_eos = false;
  // Forces this token as the last one a request may draw (HF ForcedEOSTokenLogitsProcessor).
  std::optional<int64_t> forced_eos_token_id{};
  // Ends generation; unset = the tokenizer's eos.
  std::optional<int64_t> eos_token_id{};
  uint64_t seed = 0;

  // Beam search (width 1 = off).
  int64_t beam_width = 1;
  double length_penalty = 1.0;
  bool early_stopping = false;

  // Speculative decoding with a drafter model.
  bool use_spec_dec = false;
  int64_t max_n_spec_tokens = 5;

  // CUDA graphs for decode steps up to this context length.
  bool use_cuda_graph = false;
  int64_t max_context_len_to_capture = 512;

  // StreamingLLM: keep the first start_token_size tokens (attention sinks)
  // and the last generated_token_size; both multiples of block_size.
  bool enable_streamingllm = false;
  int64_t start_token_size = 4;
  int64_t generated_token_size = 512;

  int64_t tp_size = 1;

  // Throws ConfigError naming the field, its value and what would be valid.
  void validate() const;
  c10::ScalarType model_dtype() const;
  c10::ScalarType cache_dtype() const;
  int64_t token_budget() const;
  // The sampling a request gets when it does not bring its own.
  SamplingParams default_sampling() const;
};

// Bytes the KV pool may take on a device with `memory` (read after the model
// is loaded), keeping `activation_bytes` back for one step's activations and
// logits: with gpu_memory_utilization, utilization x total minus what live
// tensors hold (the weights) minus the activations; else
// kv_cache_memory_fraction of the reusable memory (free + cached by the
// allocator) minus the activations. Throws ConfigError, naming the figures
// and what to change, when that is less than one block of `block_bytes`, or
// when the utilization asks for more than the device has free (other
// processes hold the rest).
int64_t kv_pool_bytes(const InferenceConfig& config, const metrics::DeviceMemory& memory, int64_t activation_bytes,
                      int64_t block_bytes);

}  // namespace colossus::inference

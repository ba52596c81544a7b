// A tensor-parallel sharding plan is data: module path patterns ("*" matches
// one path segment) mapped to styles. The plans for GPT-2 and LLaMA live here;
// a user passes their own the way Colossal-AI takes a custom_policy. The
// sharder (sharder.h) applies a plan to a full model.
#pragma once
#include "colossus/models/causal_lm.h"

#include <string>
#include <utility>
#include <vector>

namespace colossus::parallel::plan {

enum class StyleKind { Colwise, Rowwise, VocabParallelEmbedding, VocabParallelHead };

struct Style {
  StyleKind kind = StyleKind::Colwise;
  // Colwise: the output is `fused_parts` equal parts ([q | k | v] in GPT-2's
  // c_attn = 3), each split over tp on its own, so every rank gets its share of each.
  int64_t fused_parts = 1;
  // Colwise of a key/value projection: split by kv heads; with fewer kv heads
  // than tp ranks each head is replicated on tp / kv_heads ranks (GQA).
  bool kv_heads = false;
  bool gather_output = false;     // Colwise: all-gather the output
  bool input_is_parallel = true;  // Rowwise: false splits a replicated input first
};

struct ColwiseOptions {
  int64_t fused_parts = 1;
  bool kv_heads = false;
  bool gather_output = false;
};
Style Colwise(ColwiseOptions options = {});
Style Rowwise(bool input_is_parallel = true);
Style VocabParallelEmbedding();
// On a model with tied embeddings there is no lm_head module: the head then
// uses the vocab-parallel embedding's shard.
Style VocabParallelHead();

struct ShardingPlan {
  // (pattern, style), applied in order; a pattern that matches no module is a
  // ConfigError (a typo in a custom plan must not silently leave layers whole),
  // except the head pattern on a tied model.
  std::vector<std::pair<std::string, Style>> rules;
  // Modules left whole on every tp rank that each rank applies to its own
  // heads only (Qwen3's self_attn.q_norm / k_norm): each rank's gradient of
  // their parameters is a part of the whole, so it is summed over tp. A
  // pattern that matches nothing is a ConfigError, as for rules.
  std::vector<std::string> head_local;
};

ShardingPlan gpt2_plan();
ShardingPlan llama_plan();
// LLaMA's attention, embedding and head; the MoE router and experts stay
// replicated over tp (expert parallelism splits the experts).
ShardingPlan mixtral_plan();
// The plan for the model's type (GPT-2, the LLaMA-architecture families, Mixtral).
ShardingPlan default_plan(const models::CausalLM& model);

// True when `path` ("transformer.h.3.attn.c_attn") matches `pattern`
// ("transformer.h.*.attn.c_attn"): same number of segments, "*" matches any one.
bool path_matches(const std::string& pattern, const std::string& path);

}  // namespace colossus::parallel::plan

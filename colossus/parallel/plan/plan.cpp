#include "colossus/parallel/plan/plan.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>

#include <string_view>
#include <variant>

namespace colossus::parallel::plan {

Style Colwise(ColwiseOptions options) {
  return Style{.kind = StyleKind::Colwise,
               .fused_parts = options.fused_parts,
               .kv_heads = options.kv_heads,
               .gather_output = options.gather_output};
}

Style Rowwise(bool input_is_parallel) {
  return Style{.kind = StyleKind::Rowwise, .input_is_parallel = input_is_parallel};
}

Style VocabParallelEmbedding() { return Style{.kind = StyleKind::VocabParallelEmbedding}; }

Style VocabParallelHead() { return Style{.kind = StyleKind::VocabParallelHead}; }

ShardingPlan gpt2_plan() {
  // wpe and the LayerNorms stay replicated; the row-parallel biases too.
  return ShardingPlan{.rules = {
                          {"transformer.wte", VocabParallelEmbedding()},
                          {"transformer.h.*.attn.c_attn", Colwise({.fused_parts = 3})},
                          {"transformer.h.*.attn.c_proj", Rowwise()},
                          {"transformer.h.*.mlp.c_fc", Colwise()},
                          {"transformer.h.*.mlp.c_proj", Rowwise()},
                          {"lm_head", VocabParallelHead()},
                      }};
}

ShardingPlan llama_plan() {
  return ShardingPlan{.rules = {
                          {"model.embed_tokens", VocabParallelEmbedding()},
                          {"model.layers.*.self_attn.q_proj", Colwise()},
                          {"model.layers.*.self_attn.k_proj", Colwise({.kv_heads = true})},
                          {"model.layers.*.self_attn.v_proj", Colwise({.kv_heads = true})},
                          {"model.layers.*.self_attn.o_proj", Rowwise()},
                          {"model.layers.*.mlp.gate_proj", Colwise()},
                          {"model.layers.*.mlp.up_proj", Colwise()},
                          {"model.layers.*.mlp.down_proj", Rowwise()},
                          {"lm_head", VocabParallelHead()},
                      }};
}

ShardingPlan mixtral_plan() {
  // LLaMA's attention, embedding and head; the router (gate) and the experts
  // stay replicated over tp (expert parallelism shards the experts).
  return ShardingPlan{.rules = {
                          {"model.embed_tokens", VocabParallelEmbedding()},
                          {"model.layers.*.self_attn.q_proj", Colwise()},
                          {"model.layers.*.self_attn.k_proj", Colwise({.kv_heads = true})},
                          {"model.layers.*.self_attn.v_proj", Colwise({.kv_heads = true})},
                          {"model.layers.*.self_attn.o_proj", Rowwise()},
                          {"lm_head", VocabParallelHead()},
                      }};
}

ShardingPlan default_plan(const models::CausalLM& model) {
  if (std::holds_alternative<models::GPT2Config>(model.config())) return gpt2_plan();
  if (const auto* llama = std::get_if<models::LlamaConfig>(&model.config())) {
    ShardingPlan plan = llama_plan();
    if (llama->qk_norm) plan.head_local = {"model.layers.*.self_attn.q_norm", "model.layers.*.self_attn.k_norm"};
    return plan;
  }
  if (const auto* moe = std::get_if<models::MixtralConfig>(&model.config())) {
    ShardingPlan plan = mixtral_plan();
    if (moe->qk_norm) plan.head_local = {"model.layers.*.self_attn.q_norm", "model.layers.*.self_attn.k_norm"};  // Qwen3-MoE
    return plan;
  }
  throw ConfigError(fmt::format("no tensor-parallel plan for model type '{}'; pass custom_policy",
                                models::model_type(model.config())));
}

bool path_matches(const std::string& pattern, const std::string& path) {
  size_t p = 0, q = 0;
  while (true) {
    const size_t p_end = pattern.find('.', p), q_end = path.find('.', q);
    const std::string_view segment(pattern.data() + p, (p_end == std::string::npos ? pattern.size() : p_end) - p);
    const std::string_view name(path.data() + q, (q_end == std::string::npos ? path.size() : q_end) - q);
    if (segment != "*" && segment != name) return false;
    if ((p_end == std::string::npos) != (q_end == std::string::npos)) return false;
    if (p_end == std::string::npos) return true;
    p = p_end + 1;
    q = q_end + 1;
  }
}

}  // namespace colossus::parallel::plan

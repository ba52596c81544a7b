// Model configurations that mirror Hugging Face's config.json for GPT-2 and
// LLaMA: read from and written back to that file, named presets, and one
// validate() per config that names the bad field and a valid alternative.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace colossus::models {

// Keys of config.json that Colossus does not interpret (bos/eos ids, dtype,
// task params...), each value kept as its JSON text so that a loaded config
// is written back without losing them.
using ExtraJson = std::map<std::string, std::string>;

struct GPT2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  std::optional<int64_t> n_inner{};  // FFN width; unset means 4 * n_embd, as in HF
  std::string activation_function = "gelu_new";
  double resid_pdrop = 0.1;
  double embd_pdrop = 0.1;
  double attn_pdrop = 0.1;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  bool scale_attn_weights = true;
  bool scale_attn_by_inverse_layer_idx = false;
  bool tie_word_embeddings = true;
  ExtraJson extra{};

  int64_t ffn_size() const { return n_inner.value_or(4 * n_embd); }
  int64_t head_dim() const { return n_embd / n_head; }
  void validate() const;
};

// HF's rope_scaling / rope_parameters. "default" leaves the frequencies alone;
// "linear" divides them by factor; "dynamic" (NTK) raises the base once the
// sequence is longer than max_position_embeddings; "llama3" rescales by
// wavelength band (low_freq_factor, high_freq_factor, original_max_position_embeddings).
struct RopeScaling {
  std::string rope_type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::optional<int64_t> original_max_position_embeddings{};  // llama3, longrope; unset means max_position_embeddings
  // "longrope" (Phi-3; config.json's older names "su" and "yarn" read as it):
  // the frequencies are divided dimension by dimension by short_factor, or by
  // long_factor for a sequence longer than original_max_position_embeddings,
  // and cos/sin are scaled by attention_factor (unset: sqrt(1 + ln(factor) /
  // ln(original_max_position_embeddings)) for factor > 1, else 1). A file
  // without "factor" means max_position_embeddings / original_max_position_embeddings,
  // which the reader stores in factor.
  std::vector<double> short_factor{};
  std::vector<double> long_factor{};
  std::optional<double> attention_factor{};
  // Phi-3 style partial RoPE: only the first int(head_dim * this) dimensions
  // of each head rotate (their frequencies computed over that many
  // dimensions), the rest pass through. transformers reads it at the top
  // level of config.json or inside rope_parameters.
  double partial_rotary_factor = 1.0;
  // "yarn" (DeepSeek-V2/V3): frequencies blended between factor-interpolated
  // and original by a linear ramp over the dimensions whose rotation counts
  // over original_max_position_embeddings lie between beta_slow and
  // beta_fast (the ramp's ends floored/ceiled when truncate), cos/sin scaled
  // by attention_factor (unset: mscale(factor, mscale) / mscale(factor,
  // mscale_all_dim) when both are set, else mscale(factor)), where
  // mscale(s, m) = 0.1 m ln(s) + 1 for s > 1, else 1. MLA also multiplies
  // its softmax scale by mscale(factor, mscale_all_dim)^2.
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> mscale{};
  std::optional<double> mscale_all_dim{};
  bool truncate = true;
};

struct LlamaConfig {
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  std::optional<int64_t> num_key_value_heads{};  // unset means num_attention_heads (no GQA)
  std::optional<int64_t> head_dim{};           // unset means hidden_size / num_attention_heads
  std::string hidden_act = "silu";
  int64_t max_position_embeddings = 2048;
  double initializer_range = 0.02;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling{};
  bool attention_bias = false;
  bool mlp_bias = false;
  double attention_dropout = 0.0;
  bool tie_word_embeddings = false;
  std::optional<int64_t> pad_token_id{};  // its embedding row starts at zero and gets no gradient, as in HF
  // The family, as HF's "model_type": "llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text" or "phi3",
  // which are LLaMA's architecture with the switches below (each family's
  // config.json keys and defaults: config_families.cpp).
  std::string family = "llama";
  bool qkv_bias = false;  // Qwen2: bias on q/k/v_proj, none on o_proj
  bool qk_norm = false;   // Qwen3: RMSNorm over head_dim on every q and k head, before RoPE
  // Sliding-window attention as transformers configures it: Mistral's
  // sliding_window; Qwen2/3's only with use_sliding_window, on the layers from
  // max_window_layers on (or as layer_types lists them).
  std::optional<int64_t> sliding_window{};
  bool use_sliding_window = false;
  int64_t max_window_layers = 0;
  std::vector<std::string> layer_types{};  // Qwen2/3, Gemma 2: "full_attention" / "sliding_attention" per layer; empty: derived
  // Gemma 2 and 3 (families "gemma2", "gemma3_text"): RMSNorm as x * (1 + w), the embedding scaled
  // by sqrt(hidden_size), norms before and after the MLP too, GeGLU
  // (hidden_act gelu_pytorch_tanh), and these three.
  std::optional<double> query_pre_attn_scalar{};   // attention scale 1/sqrt(this); unset: 1/sqrt(head_dim)
  std::optional<double> attn_logit_softcapping{};   // scores -> c * tanh(scores / c)
  std::optional<double> final_logit_softcapping{};  // logits -> c * tanh(logits / c)
  // Gemma 3 (family "gemma3_text"): Gemma 2's blocks with (1 + w) q/k norms
  // (qk_norm), and the sliding layers rotate by a RoPE of this base (the
  // full layers by rope_theta and rope_scaling).
  double rope_local_base_freq = 10000.0;
  // Phi-3 (family "phi3"): dropout on the attention and MLP outputs before
  // each residual add, in training. (Its checkpoints fuse q/k/v_proj into
  // qkv_proj and gate/up_proj into gate_up_proj: phi3.h.)
  double resid_pdrop = 0.0;
  ExtraJson extra{};

  int64_t kv_heads() const { return num_key_value_heads.value_or(num_attention_heads); }
  int64_t resolved_head_dim() const { return head_dim.value_or(hidden_size / num_attention_heads); }
  // The dimensions of each head that RoPE rotates: int(head_dim * partial_rotary_factor), as transformers.
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(resolved_head_dim()) * rope_scaling.partial_rotary_factor);
  }
  // The window of the layers that have one, if any layer does (they share it).
  std::optional<int64_t> attention_window() const;
  // The sliding window of block `layer` as transformers applies it (Mistral:
  // every layer; Qwen2/3: with use_sliding_window, the layers from
  // max_window_layers on or those layer_types names); 0 when it sees every
  // earlier position.
  int64_t layer_window(int64_t layer) const;
  // Whether block `layer` is a sliding layer by layer_types (or the family's
  // default pattern), whatever sliding_window says: Gemma 3's sliding layers
  // also take the local RoPE.
  bool is_sliding_layer(int64_t layer) const;
  bool is_gemma() const { return family == "gemma2" || family == "gemma3_text"; }
  // The window when every layer has one (the smallest), else 0: keys older
  // than it are never read again, so a KV cache may drop them.
  int64_t window_on_every_layer() const;
  void validate() const;
};

// Mixtral (HF MixtralConfig): LLaMA's attention, norms and RoPE (the base
// fields, read and written under the same config.json keys; sliding_window
// on every layer, as Mistral) with a sparse
// mixture-of-experts FFN per block. intermediate_size is each expert's width.
// router_z_loss_coef and capacity_factor are Colossus extensions (config.json
// keys of the same names, which transformers keeps and ignores).
struct MixtralConfig : LlamaConfig {
  int64_t num_local_experts = 8;
  int64_t num_experts_per_tok = 2;
  double router_aux_loss_coef = 0.001;
  double router_jitter_noise = 0.0;
  bool output_router_logits = false;  // as HF: adds router_aux_loss_coef * aux loss to the loss
  double router_z_loss_coef = 0.0;          // ST-MoE z-loss, added to the loss when > 0
  std::optional<double> capacity_factor{};  // unset: dropless; else each expert keeps ceil(cf * N * k / E) tokens

  // The Qwen MoE families (HF Qwen2MoeConfig / Qwen3MoeConfig, config_moe_families.cpp) are this model
  // with the fields below; their attention is Qwen2's (qkv_bias) or Qwen3's (qk_norm), so `family` holds
  // "qwen2" or "qwen3" and moe_family the model_type: "mixtral", "qwen2_moe" or "qwen3_moe".
  std::string moe_family = "mixtral";
  std::optional<int64_t> moe_intermediate_size{};  // each routed expert's width; unset: intermediate_size (Mixtral)
  int64_t shared_expert_intermediate_size = 0;     // Qwen2-MoE: > 0, a shared expert gated by sigmoid(shared_expert_gate x)
  bool norm_topk_prob = true;                      // renormalise the top-k probabilities to sum 1 (Mixtral always)
  int64_t decoder_sparse_step = 1;                 // layer i is sparse when (i + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers{};          // ... and i is not listed here; else a dense MLP of intermediate_size

  bool is_qwen_moe() const { return moe_family == "qwen2_moe" || moe_family == "qwen3_moe"; }
  int64_t expert_intermediate_size() const { return moe_intermediate_size.value_or(intermediate_size); }
  // Whether block `layer` has the sparse MoE block (HF's rule), else a dense MLP.
  bool is_sparse_layer(int64_t layer) const;
  // Mixtral's defaults where they differ from LLaMA's (HF MixtralConfig).
  static MixtralConfig defaults();
  void validate() const;
};

// DeepSeek-V2 / V2-Lite / V3 (HF DeepseekV2Config, DeepseekV3Config; family
// "deepseek_v2" / "deepseek_v3"): multi-head latent attention (queries
// through an optional q_lora_rank bottleneck, keys and values from one
// kv_lora_rank latent plus a shared qk_rope_head_dim RoPE key) and a
// DeepSeekMoE FFN (n_routed_experts of moe_intermediate_size, top
// num_experts_per_tok, plus an always-on shared MLP of n_shared_experts x
// moe_intermediate_size) on the layers from first_k_dense_replace on, a dense
// MLP of intermediate_size before. The LLaMA fields keep their meaning;
// head_dim is qk_rope_head_dim, as transformers sets it. Read, written and
// validated in config_deepseek.cpp.
struct DeepseekConfig : LlamaConfig {
  std::optional<int64_t> q_lora_rank = 1536;  // unset: a plain q_proj (V2-Lite)
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;
  int64_t moe_intermediate_size = 1407;
  int64_t n_routed_experts = 64;
  int64_t n_shared_experts = 2;
  int64_t num_experts_per_tok = 6;
  int64_t first_k_dense_replace = 0;
  double routed_scaling_factor = 1.0;
  // V2: "greedy" (top-k of the softmax) or "group_limited_greedy" (top-k
  // within the topk_group groups of n_group with the highest max score). V3:
  // "noaux_tc" only: sigmoid scores; experts chosen (within the topk_group
  // groups with the highest sum of their two best) by score +
  // e_score_correction_bias, weighted by the score alone.
  std::string topk_method = "greedy";
  std::optional<int64_t> n_group{};
  std::optional<int64_t> topk_group{};
  bool norm_topk_prob = false;  // V3: the top-k weights renormalised to sum 1 (before routed_scaling_factor)
  // V3: RoPE on interleaved pairs (x0, x1), (x2, x3), ... (V2 always).
  bool rope_interleave = true;
  // DeepSeek's training aux losses: read and written back, not applied
  // (transformers applies neither).
  std::optional<double> aux_loss_alpha{};
  std::optional<bool> seq_aux{};
  // Colossus extension (config.json key of the same name): V3's
  // aux-loss-free balancing step gamma; after each optimizer step
  // (DeepseekForCausalLM::update_router_biases) e_score_correction_bias moves
  // by +gamma for experts loaded below the mean and -gamma above it. 0: off.
  double router_bias_update_speed = 0.001;

  // transformers' DeepseekV2Config / DeepseekV3Config defaults.
  static DeepseekConfig defaults(const std::string& family);
  bool is_v3() const { return family == "deepseek_v3"; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool is_moe_layer(int64_t layer) const { return layer >= first_k_dense_replace; }
  void validate() const;
};

using ModelConfig = std::variant<GPT2Config, LlamaConfig, MixtralConfig, DeepseekConfig>;

// HF's "model_type": "gpt2", "llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3", "mixtral",
// "qwen2_moe", "qwen3_moe", "deepseek_v2" or "deepseek_v3".
std::string model_type(const ModelConfig& config);
int64_t vocab_size(const ModelConfig& config);
int64_t hidden_size(const ModelConfig& config);
int64_t num_layers(const ModelConfig& config);
// Positions the model was configured for (n_positions / max_position_embeddings).
int64_t max_positions(const ModelConfig& config);
void validate(const ModelConfig& config);
// Parameters the config describes (optional Llama biases left out), in double so a
// config with absurd sizes cannot overflow: what creating the model would allocate.
double estimated_parameters(const ModelConfig& config);

// Parses config.json text (transformers v4 "rope_theta"/"rope_scaling" or v5
// "rope_parameters"); the model kind comes from "model_type". Throws
// ConfigError naming the key on a missing model_type, a wrong JSON type or an
// unsupported setting, and validates the result.
ModelConfig config_from_json(const std::string& json_text);
// The config.json text transformers' from_pretrained reads (v4 and v5).
std::string config_to_json(const ModelConfig& config);

ModelConfig read_config(const std::string& path);
void write_config(const ModelConfig& config, const std::string& path);

// gpt2-124m, gpt2-350m, llama-1b-like, and the test sizes gpt2-tiny, llama-tiny,
// qwen2-tiny, qwen3-tiny, mistral-tiny, gemma2-tiny, gemma3-tiny, phi3-tiny, mixtral-tiny,
// qwen2_moe-tiny, qwen3_moe-tiny, deepseek_v2-tiny, deepseek_v3-tiny.
// Presets use dropout 0 (training recipes set it; 0 keeps every parallel
// layout bit-comparable). Throws ConfigError listing the names on a typo.
ModelConfig preset(std::string_view name);
std::vector<std::string> preset_names();

}  // namespace colossus::models

// ModelConfig: config.json in both transformers spellings, round trips,
// presets (sizes checked by counting parameters on the meta device), errors.
#include "colossus/core/errors.h"
#include "colossus/models/config.h"
#include "colossus/models/pretrained.h"
#include "colossus/models/rope.h"

#include <fmt/format.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <map>

namespace colossus::models {
namespace {

template <class F>
std::string config_error_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

TEST(ModelConfig, EveryPresetSurvivesAJsonRoundTrip) {
  for (const auto& name : preset_names()) {
    ModelConfig config = preset(name);
    EXPECT_NO_THROW(validate(config)) << name;
    std::string json = config_to_json(config);
    EXPECT_EQ(config_to_json(config_from_json(json)), json) << name;
  }
}

int64_t parameter_count(const ModelConfig& config) {
  // The meta device allocates nothing, so even the 1B preset costs no memory.
  auto model = create_model(config, {.device = c10::kMeta, .init = false});
  int64_t total = 0;
  for (const auto& p : model->parameters()) total += p.numel();
  return total;
}

TEST(ModelConfig, EstimatedParametersTrackTheRealCountAndAbsurdSizesAreRefused) {
  for (const auto& name : preset_names()) {
    const double real = static_cast<double>(parameter_count(preset(name)));
    EXPECT_NEAR(estimated_parameters(preset(name)) / real, 1.0, 0.02) << name;
  }
  // A typo'd n_layer is refused before anything is allocated, naming the sizes.
  auto config = std::get<GPT2Config>(preset("gpt2-tiny"));
  config.n_layer = 1'000'000'000'000;
  const std::string error = config_error_of([&] { create_model(config); });
  EXPECT_NE(error.find("1000000000000 layers"), std::string::npos) << error;
  EXPECT_NE(error.find("more than this machine's"), std::string::npos) << error;
}

TEST(ModelConfig, PresetsHaveTheirNamedSizes) {
  // HF's gpt2 (124M) and gpt2-medium (355M) parameter counts.
  EXPECT_EQ(parameter_count(preset("gpt2-124m")), 124439808);
  EXPECT_EQ(parameter_count(preset("gpt2-350m")), 354823168);
  const auto llama = std::get<LlamaConfig>(preset("llama-1b-like"));
  EXPECT_EQ(llama.hidden_size, 2048);
  EXPECT_EQ(llama.num_hidden_layers, 16);
  EXPECT_EQ(llama.num_attention_heads, 16);
  EXPECT_EQ(llama.kv_heads(), 8);
  EXPECT_EQ(llama.intermediate_size, 5632);
  EXPECT_EQ(llama.vocab_size, 32000);
  const int64_t c = 2048, kv = 8 * 128, f = 5632, v = 32000;
  const int64_t per_layer = c * c + 2 * c * kv + c * c + 3 * c * f + 2 * c;
  EXPECT_EQ(parameter_count(llama), 2 * v * c + 16 * per_layer + c);
  EXPECT_NE(config_error_of([] { preset("llama-7b"); }).find("llama-tiny"), std::string::npos);
  // Meta-Llama-3-8B's parameter count.
  EXPECT_EQ(parameter_count(preset("llama3-8b-like")), 8030261248);
}

TEST(ModelConfig, ReadsTransformersV4RopeScaling) {
  auto config = config_from_json(R"({
    "model_type": "llama", "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2,
    "intermediate_size": 512, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 4096.0,
    "rope_theta": 500000.0,
    "rope_scaling": {"type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "eos_token_id": [128001, 128009], "torch_dtype": "bfloat16"})");
  const auto& c = std::get<LlamaConfig>(config);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.rope_type, "llama3");
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_EQ(c.kv_heads(), 2);
  EXPECT_EQ(c.resolved_head_dim(), 32);
  // Keys we do not interpret come back unchanged.
  std::string json = config_to_json(config);
  EXPECT_NE(json.find("128009"), std::string::npos);
  EXPECT_NE(json.find("\"torch_dtype\": \"bfloat16\""), std::string::npos);
}

TEST(ModelConfig, ReadsTransformersV5RopeParametersAndWritesBothSpellings) {
  auto config = config_from_json(R"({
    "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
    "num_hidden_layers": 1, "vocab_size": 100,
    "rope_parameters": {"rope_type": "linear", "rope_theta": 20000.0, "factor": 4.0}})");
  const auto& c = std::get<LlamaConfig>(config);
  EXPECT_EQ(c.rope_theta, 20000.0);
  EXPECT_EQ(c.rope_scaling.rope_type, "linear");
  EXPECT_EQ(c.rope_scaling.factor, 4.0);
  std::string json = config_to_json(config);
  EXPECT_NE(json.find("\"rope_scaling\""), std::string::npos);
  EXPECT_NE(json.find("\"rope_parameters\""), std::string::npos);
  EXPECT_NE(json.find("\"rope_theta\": 20000.0"), std::string::npos);
}

TEST(ModelConfig, ReadsGpt2Config) {
  auto config = config_from_json(R"({"model_type": "gpt2", "n_embd": 48, "n_head": 6, "n_layer": 3,
    "n_positions": 128, "vocab_size": 300, "n_inner": null, "activation_function": "gelu_new",
    "task_specific_params": {"text-generation": {"do_sample": true}}})");
  const auto& c = std::get<GPT2Config>(config);
  EXPECT_EQ(c.n_embd, 48);
  EXPECT_EQ(c.ffn_size(), 192);
  EXPECT_EQ(c.head_dim(), 8);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(model_type(config), "gpt2");
  EXPECT_EQ(num_layers(config), 3);
  EXPECT_NE(config_to_json(config).find("do_sample"), std::string::npos);
}

// Each family reads its own keys with transformers' defaults and writes back
// its model_type and architecture.
TEST(ModelConfig, FamiliesReadTheirKeysAndDefaults) {
  const auto qwen2 = std::get<LlamaConfig>(config_from_json(R"({"model_type": "qwen2", "attention_bias": true})"));
  EXPECT_EQ(qwen2.family, "qwen2");
  EXPECT_TRUE(qwen2.qkv_bias);
  EXPECT_FALSE(qwen2.attention_bias) << "Qwen2's o_proj has no bias whatever attention_bias says";
  EXPECT_EQ(qwen2.vocab_size, 151936);
  EXPECT_EQ(qwen2.kv_heads(), 32);
  EXPECT_EQ(qwen2.attention_window(), std::nullopt) << "no window without use_sliding_window";
  const auto windowed = std::get<LlamaConfig>(config_from_json(
      R"({"model_type": "qwen2", "num_hidden_layers": 4, "use_sliding_window": true, "sliding_window": 512,
          "max_window_layers": 2, "max_position_embeddings": 4096})"));
  EXPECT_EQ(windowed.attention_window(), 512);
  EXPECT_EQ(max_positions(windowed), 4096) << "a window limits what each layer sees, not the length";
  EXPECT_EQ(windowed.layer_window(0), 0);
  EXPECT_EQ(windowed.layer_window(1), 0);
  EXPECT_EQ(windowed.layer_window(2), 512) << "the layers from max_window_layers on slide";
  EXPECT_EQ(windowed.layer_window(3), 512);
  auto listed = windowed;
  listed.layer_types = {"sliding_attention", "full_attention", "full_attention", "full_attention"};
  EXPECT_EQ(listed.layer_window(0), 512) << "layer_types, when given, decides";
  EXPECT_EQ(listed.layer_window(2), 0);
  const auto qwen3 = std::get<LlamaConfig>(config_from_json(R"({"model_type": "qwen3"})"));
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_EQ(qwen3.resolved_head_dim(), 128);
  const auto mistral = std::get<LlamaConfig>(config_from_json(R"({"model_type": "mistral"})"));
  EXPECT_EQ(mistral.attention_window(), 4096);
  EXPECT_EQ(mistral.layer_window(0), 4096) << "Mistral slides on every layer";
  EXPECT_EQ(mistral.window_on_every_layer(), 4096);
  EXPECT_EQ(windowed.window_on_every_layer(), 0) << "Qwen2's first layers see everything";
  // Gemma 2: transformers' defaults, the even layers windowed, written back for transformers.
  const auto gemma2 = std::get<LlamaConfig>(config_from_json(R"({"model_type": "gemma2", "num_hidden_layers": 4})"));
  EXPECT_EQ(gemma2.hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(gemma2.query_pre_attn_scalar, 256);
  EXPECT_EQ(gemma2.final_logit_softcapping, 30.0);
  EXPECT_EQ(gemma2.attn_logit_softcapping, 50.0);
  EXPECT_TRUE(gemma2.tie_word_embeddings);
  EXPECT_EQ(gemma2.layer_window(0), 4096);
  EXPECT_EQ(gemma2.layer_window(1), 0);
  const auto gemma2_json = nlohmann::json::parse(config_to_json(gemma2));
  EXPECT_EQ(gemma2_json["architectures"][0], "Gemma2ForCausalLM");
  EXPECT_EQ(gemma2_json["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_TRUE(gemma2_json["query_pre_attn_scalar"].is_number_integer()) << "transformers types it int";
  EXPECT_EQ(gemma2_json["layer_types"][1], "full_attention");
  // Gemma 3: v4's keys (rope_local_base_freq, sliding_window_pattern, rope_scaling) and v5's nested rope_parameters.
  const auto gemma3_v4 = std::get<LlamaConfig>(config_from_json(
      R"({"model_type": "gemma3_text", "num_hidden_layers": 7, "sliding_window_pattern": 3, "rope_theta": 1e6,
          "rope_local_base_freq": 5e3, "rope_scaling": {"rope_type": "linear", "factor": 8.0}})"));
  EXPECT_TRUE(gemma3_v4.qk_norm);
  EXPECT_EQ(gemma3_v4.rope_local_base_freq, 5e3);
  EXPECT_EQ(gemma3_v4.rope_scaling.rope_type, "linear");
  EXPECT_TRUE(gemma3_v4.is_sliding_layer(0));
  EXPECT_FALSE(gemma3_v4.is_sliding_layer(2)) << "every third layer is full";
  EXPECT_EQ(gemma3_v4.final_logit_softcapping, std::nullopt);
  const auto gemma3_v5 = std::get<LlamaConfig>(config_from_json(
      R"({"model_type": "gemma3_text", "num_hidden_layers": 6, "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}})"));
  EXPECT_EQ(gemma3_v5.rope_theta, 1e6);
  EXPECT_EQ(gemma3_v5.rope_scaling.factor, 8.0);
  EXPECT_EQ(gemma3_v5.rope_local_base_freq, 1e4);
  EXPECT_FALSE(gemma3_v5.is_sliding_layer(5)) << "transformers' default: five sliding, then a full layer";
  EXPECT_TRUE(gemma3_v5.is_sliding_layer(4));
  const auto gemma3_back = std::get<LlamaConfig>(config_from_json(config_to_json(gemma3_v4)));
  EXPECT_EQ(gemma3_back.rope_local_base_freq, 5e3);
  EXPECT_EQ(gemma3_back.layer_types, gemma3_v4.layer_types);
  EXPECT_EQ(mistral.kv_heads(), 8);
  const auto mistral_full = std::get<LlamaConfig>(config_from_json(R"({"model_type": "mistral", "sliding_window": null})"));
  EXPECT_EQ(mistral_full.attention_window(), std::nullopt);
  const std::string written = config_to_json(qwen2);
  EXPECT_NE(written.find("\"Qwen2ForCausalLM\""), std::string::npos) << written;
  EXPECT_NE(written.find("\"attention_bias\": true"), std::string::npos) << "the unused key is kept as it was";
  EXPECT_EQ(std::get<LlamaConfig>(config_from_json(written)).qkv_bias, true);
}

TEST(ModelConfig, Phi3ReadsLongropeAsTransformersAndWritesItBack) {
  // Phi3Config's defaults (Phi-3-mini-4k).
  const auto mini = std::get<LlamaConfig>(config_from_json(R"({"model_type": "phi3"})"));
  EXPECT_EQ(mini.family, "phi3");
  EXPECT_EQ(mini.vocab_size, 32064);
  EXPECT_EQ(mini.hidden_size, 3072);
  EXPECT_EQ(mini.intermediate_size, 8192);
  EXPECT_EQ(mini.kv_heads(), 32);
  EXPECT_EQ(mini.max_position_embeddings, 4096);
  EXPECT_EQ(mini.rms_norm_eps, 1e-5);
  EXPECT_EQ(mini.pad_token_id, 32000);
  EXPECT_EQ(mini.rope_scaling.rope_type, "default");
  EXPECT_EQ(mini.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(mini.attention_window(), std::nullopt);
  // Phi-3-mini-128k's shape: v4 rope_scaling with the old name "su", no
  // factor (max / original = 32 sets the cos/sin scale), a window on every layer.
  const std::string factors = "[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]";
  const auto long_context = std::get<LlamaConfig>(config_from_json(fmt::format(
      R"({{"model_type": "phi3", "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 131072,
          "original_max_position_embeddings": 4096, "sliding_window": 262144, "rope_theta": 10000.0,
          "rope_scaling": {{"type": "su", "short_factor": {0}, "long_factor": {0}}}}})",
      factors)));
  EXPECT_EQ(long_context.rope_scaling.rope_type, "longrope");
  EXPECT_EQ(long_context.rope_scaling.factor, 32.0);
  EXPECT_EQ(long_context.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(long_context.rope_scaling.short_factor.size(), 8u);
  EXPECT_DOUBLE_EQ(rope_attention_scaling(rope_spec(long_context)), std::sqrt(1 + std::log(32.0) / std::log(4096.0)));
  EXPECT_EQ(long_context.layer_window(1), 262144) << "Phi-3's window is on every layer, as Mistral's";
  // v5 rope_parameters (theta inside); the top-level original_max_position_embeddings wins, as in transformers.
  const auto v5 = std::get<LlamaConfig>(config_from_json(fmt::format(
      R"({{"model_type": "phi3", "hidden_size": 64, "num_attention_heads": 4, "original_max_position_embeddings": 512,
          "rope_parameters": {{"rope_type": "longrope", "rope_theta": 250000.0, "factor": 2.0, "attention_factor": 1.25,
                               "original_max_position_embeddings": 1024, "short_factor": {0}, "long_factor": {0}}}}})",
      factors)));
  EXPECT_EQ(v5.rope_theta, 250000.0);
  EXPECT_EQ(v5.rope_scaling.factor, 2.0);
  EXPECT_EQ(v5.rope_scaling.original_max_position_embeddings, 512);
  EXPECT_DOUBLE_EQ(rope_attention_scaling(rope_spec(v5)), 1.25);
  // Written back for transformers: both spellings, the top-level original
  // length, an unset pad id as null (Phi3Config would default it to 32000).
  auto no_pad = long_context;
  no_pad.pad_token_id.reset();
  const auto written = nlohmann::json::parse(config_to_json(no_pad));
  EXPECT_EQ(written["architectures"][0], "Phi3ForCausalLM");
  EXPECT_EQ(written["original_max_position_embeddings"], 4096);
  EXPECT_TRUE(written["pad_token_id"].is_null());
  EXPECT_EQ(written["rope_scaling"]["rope_type"], "longrope");
  EXPECT_EQ(written["rope_parameters"]["long_factor"].size(), 8u);
  EXPECT_FALSE(written.contains("attention_bias"));
  const auto back = std::get<LlamaConfig>(config_from_json(written.dump()));
  EXPECT_EQ(back.rope_scaling.short_factor, long_context.rope_scaling.short_factor);
  EXPECT_EQ(back.rope_scaling.factor, 32.0);
  EXPECT_EQ(back.pad_token_id, std::nullopt);
  EXPECT_EQ(config_to_json(back), config_to_json(no_pad));
  // Partial RoPE (Phi-4-mini's 0.75): top level (v4) or in rope_parameters
  // (v5, winning there), written back in both places.
  for (const char* json : {R"({"model_type": "phi3", "partial_rotary_factor": 0.75})",
                           R"({"model_type": "phi3", "partial_rotary_factor": 0.5,
                               "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.75}})"}) {
    const auto partial = std::get<LlamaConfig>(config_from_json(json));
    EXPECT_EQ(partial.rope_scaling.partial_rotary_factor, 0.75);
    EXPECT_EQ(partial.rotary_dim(), 72);  // int(96 x 0.75)
    const auto written = config_to_json(partial);
    EXPECT_EQ(nlohmann::json::parse(written)["partial_rotary_factor"], 0.75) << written;
    EXPECT_EQ(nlohmann::json::parse(written)["rope_parameters"]["partial_rotary_factor"], 0.75) << written;
    EXPECT_EQ(std::get<LlamaConfig>(config_from_json(written)).rotary_dim(), 72);
  }
  // Refused by name: RoPE types Phi3Config refuses, factor lists of the wrong
  // length, longrope without its lists, an odd number of rotated dimensions.
  auto message = [](const std::string& json) { return config_error_of([&] { config_from_json(json); }); };
  EXPECT_NE(message(R"({"model_type": "phi3", "rope_scaling": {"rope_type": "linear", "factor": 2.0}})").find("linear"),
            std::string::npos);
  EXPECT_NE(message(fmt::format(R"({{"model_type": "phi3", "rope_scaling": {{"type": "longrope", "short_factor": {0},
                                    "long_factor": {0}}}}})",
                                factors))
                .find("short_factor"),
            std::string::npos);
  EXPECT_NE(message(R"({"model_type": "phi3", "rope_scaling": {"type": "longrope", "short_factor": [1.0]}})")
                .find("long_factor"),
            std::string::npos);
  EXPECT_NE(message(R"({"model_type": "phi3", "partial_rotary_factor": 0.7})").find("= 67 rotated dimensions"),
            std::string::npos);
  EXPECT_NE(message(R"({"model_type": "llama", "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0]}})")
                .find("longrope"),
            std::string::npos);
}

TEST(ModelConfig, Phi3CheckpointsFuseQkvAndGateUp) {
  auto model = create_model(preset("phi3-tiny"), {.seed = 3});
  const checkpoint::NamedTensors state = state_dict(*model);
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  EXPECT_FALSE(by_name.contains("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(by_name.contains("model.layers.1.mlp.up_proj.weight"));
  const auto& c = std::get<LlamaConfig>(model->config());
  const int64_t d = c.resolved_head_dim();
  ASSERT_TRUE(by_name.contains("model.layers.1.self_attn.qkv_proj.weight"));
  EXPECT_EQ(by_name.at("model.layers.1.self_attn.qkv_proj.weight").sizes(),
            (std::vector<int64_t>{(c.num_attention_heads + 2 * c.kv_heads()) * d, c.hidden_size}));
  auto params = model->named_parameters();
  // Rows [q | k | v] and [gate | up].
  const at::Tensor& qkv = by_name.at("model.layers.1.self_attn.qkv_proj.weight");
  EXPECT_TRUE(qkv.narrow(0, c.num_attention_heads * d, c.kv_heads() * d)
                  .equal(params["model.layers.1.self_attn.k_proj.weight"]));
  const at::Tensor& gate_up = by_name.at("model.layers.0.mlp.gate_up_proj.weight");
  EXPECT_TRUE(gate_up.narrow(0, c.intermediate_size, c.intermediate_size).equal(params["model.layers.0.mlp.up_proj.weight"]));
  // And back: a second model loads them into its q/k/v and gate/up.
  auto copy = create_model(preset("phi3-tiny"), {.seed = 4});
  load_state_dict(*copy, by_name, "phi3 state");
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(item.value().equal(copy->named_parameters()[item.key()])) << item.key();
  }
  // A fused tensor of the wrong shape is refused naming it.
  by_name["model.layers.0.mlp.gate_up_proj.weight"] = gate_up.narrow(0, 0, c.intermediate_size);
  try {
    load_state_dict(*copy, by_name, "phi3 state");
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.gate_up_proj.weight"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, BadValuesAreConfigErrorsNamingThem) {
  auto message = [](const char* json) { return config_error_of([&] { config_from_json(json); }); };
  EXPECT_NE(message(R"({"model_type": "bert"})").find("bert"), std::string::npos);
  EXPECT_NE(message(R"({"n_layer": 2})").find("model_type"), std::string::npos);
  EXPECT_NE(message(R"({"model_type": "gpt2", "n_layer": "two"})").find("n_layer"), std::string::npos);
  EXPECT_NE(message(R"({"model_type": "gpt2", "n_embd": 50, "n_head": 4})").find("n_head"), std::string::npos);
  EXPECT_NE(message(R"({"model_type": "gpt2", "add_cross_attention": true})").find("add_cross_attention"), std::string::npos);
  EXPECT_NE(message(R"({"model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 5})").find("num_key_value_heads"),
            std::string::npos);
  EXPECT_NE(message(R"({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})").find("yarn"),
            std::string::npos);
  EXPECT_NE(message(R"({"model_type": "llama", "hidden_act": "gelu"})").find("hidden_act"), std::string::npos);
  EXPECT_NE(message("{not json").find("not valid JSON"), std::string::npos);
  // Settings that change the model are refused by name, never ignored.
  EXPECT_NE(message(R"({"model_type": "qwen2", "partial_rotary_factor": 0.5})").find("partial_rotary_factor"),
            std::string::npos);
  EXPECT_NE(message(R"({"model_type": "llama", "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                        "partial_rotary_factor": 0.25}})")
                .find("partial_rotary_factor is 0.25; transformers rotates part of each head only in phi3"),
            std::string::npos);
  EXPECT_NE(message(R"({"model_type": "gemma3"})").find("gemma3_text"), std::string::npos);  // the supported list
  EXPECT_NE(message(R"({"model_type": "gemma2", "use_bidirectional_attention": true})").find("use_bidirectional_attention"),
            std::string::npos);
  EXPECT_NE(message(R"({"model_type": "gemma2", "hidden_activation": "silu"})").find("gelu_pytorch_tanh"),
            std::string::npos);
  EXPECT_NE(message(R"({"model_type": "gemma3_text", "rope_parameters": {"full_attention": {"rope_type": "default"},
                        "sliding_attention": {"rope_type": "linear", "factor": 2.0}}})")
                .find("sliding_attention.rope_type"),
            std::string::npos);
  EXPECT_NE(message(R"({"model_type": "qwen3", "layer_types": ["full_attention"]})").find("layer_types"),
            std::string::npos);
  EXPECT_NE(config_error_of([] { read_config("/nonexistent/config.json"); }).find("/nonexistent/config.json"),
            std::string::npos);
}

}  // namespace
}  // namespace colossus::models

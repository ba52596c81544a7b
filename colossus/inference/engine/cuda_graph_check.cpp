// CUDA builds only (in the colossus_cuda bundle): the `colossus check`
// self-test of CUDA graphs in the engine, registered with the kernel registry.
#include "colossus/inference/engine/engine.h"
#include "colossus/kernels/registry.h"
#include "colossus/models/pretrained.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <random>
#include <string>
#include <vector>

namespace colossus::inference {

namespace {

// The engine's decode steps replayed from graphs give the same greedy tokens
// as eager steps: a small LLaMA (head_dim 32, GQA) on CUDA in fp32 and bf16,
// seven requests of mixed lengths so batches shrink through several buckets.
std::string check_engine_graphs() {
  models::LlamaConfig config{.vocab_size = 128, .hidden_size = 128, .intermediate_size = 256,
                             .num_hidden_layers = 2, .num_attention_heads = 4, .num_key_value_heads = 2,
                             .max_position_embeddings = 256, .initializer_range = 0.2};
  std::mt19937 rng(3);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t len : {5, 17, 1, 33, 9, 2, 12}) {
    std::vector<int64_t> p;
    for (int64_t i = 0; i < len; ++i) p.push_back(static_cast<int64_t>(rng() % 128));
    prompts.push_back(p);
  }
  for (const char* dtype : {"fp32", "bf16"}) {
    auto model = models::create_model(config, {.seed = 5,
                                               .dtype = std::string(dtype) == "bf16" ? at::kBFloat16 : at::kFloat,
                                               .device = at::Device(at::kCUDA, 0)});
    std::vector<std::vector<std::vector<int64_t>>> outputs;
    int64_t graph_steps = 0;
    for (bool graphs : {false, true}) {
      InferenceConfig ic{.max_batch_size = 8, .max_input_len = 64, .max_output_len = 24, .dtype = dtype,
                                    .block_size = 16, .num_blocks = 64, .use_cuda_graph = graphs,
                                    .max_context_len_to_capture = 128};
      InferenceEngine engine(model, nullptr, ic);
      outputs.push_back(engine.generate(prompts, {.max_new_tokens = 24}));
      if (graphs) graph_steps = engine.stats().graph_steps;
    }
    if (graph_steps == 0) return fmt::format("{}: no decode step replayed a graph", dtype);
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (outputs[0][i] != outputs[1][i]) {
        return fmt::format("{} prompt {}: eager {} vs graphs {}", dtype, i, fmt::join(outputs[0][i], ","),
                           fmt::join(outputs[1][i], ","));
      }
    }
  }
  return {};
}

[[maybe_unused]] const bool registered = [] {
  kernels::register_kernel({"engine_cuda_graph", "cuda", check_engine_graphs});
  return true;
}();

}  // namespace

}  // namespace colossus::inference

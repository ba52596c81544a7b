// CUDA graphs for the engine's decode steps: at::cuda::CUDAGraph behind the
// DeviceGraph interface, registered in cuda_slots().make_device_graph.
#include "colossus/inference/engine/engine.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/registry.h"
#include "colossus/models/pretrained.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <random>

namespace colossus::kernels {

namespace {

class CudaDeviceGraph final : public DeviceGraph {
 public:
  // Capture may not run on the legacy default stream: a side stream of its own.
  explicit CudaDeviceGraph(int device_index)
      : device_(static_cast<c10::DeviceIndex>(device_index)),
        side_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_)) {}

  void capture(const std::function<void()>& body) override {
    c10::cuda::CUDAGuard device_guard(device_);
    c10::cuda::device_synchronize();
    {
      c10::cuda::CUDAStreamGuard stream_guard(side_);
      graph_.capture_begin();
      try {
        body();
      } catch (...) {
        // End the broken capture so the stream and the allocator return to
        // normal work; the body's error is the one worth reporting.
        try {
          graph_.capture_end();
        } catch (...) {
        }
        graph_.reset();
        throw;
      }
      graph_.capture_end();
    }
    c10::cuda::device_synchronize();
  }

  void run_on_capture_stream(const std::function<void()>& body) override {
    c10::cuda::CUDAGuard device_guard(device_);
    c10::cuda::device_synchronize();
    {
      c10::cuda::CUDAStreamGuard stream_guard(side_);
      body();
    }
    c10::cuda::device_synchronize();
  }

  void replay() override {
    c10::cuda::CUDAGuard device_guard(device_);
    graph_.replay();
  }

 private:
  c10::DeviceIndex device_;
  c10::cuda::CUDAStream side_;
  at::cuda::CUDAGraph graph_;
};

std::unique_ptr<DeviceGraph> make_cuda_graph(int device_index) { return std::make_unique<CudaDeviceGraph>(device_index); }

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
      inference::InferenceConfig ic{.max_batch_size = 8, .max_input_len = 64, .max_output_len = 24, .dtype = dtype,
                                    .block_size = 16, .num_blocks = 64, .use_cuda_graph = graphs,
                                    .max_context_len_to_capture = 128};
      inference::InferenceEngine engine(model, nullptr, ic);
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
  cuda_slots().make_device_graph = make_cuda_graph;
  register_kernel({"engine_cuda_graph", "cuda", check_engine_graphs});
  return true;
}();

}  // namespace

}  // namespace colossus::kernels

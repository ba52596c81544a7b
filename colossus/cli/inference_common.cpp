// See inference_common.h.
#include "colossus/cli/inference_common.h"

#include "colossus/core/accelerator.h"
#include "colossus/core/errors.h"
#include "colossus/data/corpus.h"
#include "colossus/lora/merged_model.h"
#include "colossus/models/config.h"
#include "colossus/parallel/plan/sharder.h"

#include <ATen/Context.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <type_traits>
#include <variant>

namespace colossus::cli {

c10::ScalarType parse_dtype(const std::string& name) {
  static const std::map<std::string, c10::ScalarType> dtypes{
      {"fp32", c10::kFloat}, {"bf16", c10::kBFloat16}, {"fp16", c10::kHalf}};
  return dtypes.at(name);
}

c10::Device parse_device(const std::string& name) {
  if (name == "cpu") return c10::kCPU;
  if (name.rfind("cuda", 0) != 0) {
    throw ConfigError(fmt::format("--device '{}' is not a device; expected cpu, cuda or cuda:N", name));
  }
  const auto accelerator = probe_accelerator();
  if (!accelerator) {
    throw ConfigError(
        fmt::format("--device {} needs a CUDA build of colossus; this one is CPU only (use --device cpu)", name));
  }
  if (accelerator->devices.empty()) {
    throw ConfigError(fmt::format("--device {}: no GPU is visible{}; use --device cpu", name,
                                  accelerator->error.empty() ? "" : " (" + accelerator->error + ")"));
  }
  return name == "cuda" ? c10::Device(c10::kCUDA, 0) : c10::Device(name);
}

c10::Device resolve_device(const std::string& name) {
  if (name != "auto") return parse_device(name);
  const auto accelerator = probe_accelerator();
  return accelerator && !accelerator->devices.empty() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
}

int visible_gpus() { return static_cast<int>(at::getNumGPUs()); }

void check_tensor_parallel_size(int64_t tp, const models::ModelConfig& config, const std::string& device_option,
                                const c10::Device& device, int gpus) {
  if (tp < 1) {
    throw ConfigError(fmt::format("--tensor_parallel_size {}: use 1 (one process) or more ranks", tp));
  }
  if (tp == 1) return;
  try {
    parallel::plan::validate_tp(config, tp);
  } catch (const ConfigError& e) {
    std::vector<int64_t> fitting{1};  // the sizes this model splits into (1: not split)
    for (int64_t size = 2; size <= 1024; ++size) {
      try {
        parallel::plan::validate_tp(config, size);
        fitting.push_back(size);
      } catch (const ConfigError&) {
      }
    }
    throw ConfigError(fmt::format("--tensor_parallel_size {} does not split this {} model: {}; sizes that do: {}", tp,
                                  models::model_type(config), e.what(), fmt::join(fitting, ", ")));
  }
  if (device_option.rfind("cuda:", 0) == 0) {
    throw ConfigError(fmt::format("--device {} names one GPU, but --tensor_parallel_size {} gives each rank its own "
                                  "(rank r on cuda:r); use --device cuda (or auto)",
                                  device_option, tp));
  }
  if (device.is_cuda() && tp > gpus) {
    throw ConfigError(fmt::format("--tensor_parallel_size {} runs one rank per GPU but {}; {}", tp,
                                  gpus == 0 ? "no GPU is visible (or this colossus is CPU only)"
                                            : fmt::format("{} GPU{} visible", gpus, gpus == 1 ? " is" : "s are"),
                                  gpus == 0 ? "use --device cpu" : fmt::format("use at most {}, or --device cpu", gpus)));
  }
}

std::string resolve_dtype(const std::string& name, const std::string& model_dir, const c10::Device& device) {
  if (name != "auto") return name;
  if (!device.is_cuda()) return "fp32";  // CPU half-precision matmuls are slow
  std::ifstream in(std::filesystem::path(model_dir) / "config.json");
  const auto config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::string saved;
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (config.is_object() && config.contains(key) && config[key].is_string()) saved = config[key].get<std::string>();
  }
  return saved == "float16" ? "fp16" : "bf16";  // bfloat16, float32 and unknown: bf16
}

std::shared_ptr<models::CausalLM> load_inference_model(const std::string& model_dir, const std::string& lora_dir,
                                                       const models::LoadOptions& options, bool report) {
  const auto start = std::chrono::steady_clock::now();
  std::string adapter = lora_dir;
  if (adapter.empty()) adapter = lora::checkpoint_adapter_dir(model_dir).value_or("");
  auto model = adapter.empty() ? models::load_pretrained(model_dir, options)
                               : lora::load_merged(model_dir, adapter, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (report) std::fprintf(stderr, "loaded %s%s (%s, %lld layers, %s, %s) in %.1f s\n", model_dir.c_str(),
               adapter.empty() ? "" : (" + LoRA " + adapter + " (merged)").c_str(),
               models::model_type(model->config()).c_str(), static_cast<long long>(models::num_layers(model->config())),
               c10::toString(options.dtype), options.device.str().c_str(), seconds);
  return model;
}

std::unique_ptr<data::Tokenizer> open_tokenizer(const std::string& option, const std::string& model_dir) {
  if (option == "byte") return data::make_byte_tokenizer();
  if (!option.empty()) return data::load_tokenizer(option);
  if (data::holds_tokenizer(model_dir)) return data::load_tokenizer(model_dir);
  throw ConfigError(
      fmt::format("no tokenizer in '{}' (looked for tokenizer.json, vocab.json + merges.txt, "
                  "tokenizer.model); pass --tokenizer DIR, or --tokenizer byte for the byte tokenizer",
                  model_dir));
}

int64_t context_length(const models::CausalLM& model) { return models::max_positions(model.config()); }

}  // namespace colossus::cli

// See inference_common.h.
#include "colossus/cli/inference_common.h"

#include "colossus/core/accelerator.h"
#include "colossus/core/errors.h"
#include "colossus/data/corpus.h"

#include <fmt/format.h>

#include <filesystem>
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

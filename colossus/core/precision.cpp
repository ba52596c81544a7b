#include "colossus/core/precision.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>

namespace colossus {

std::optional<Precision> precision_named(std::string_view name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  return std::nullopt;
}

Precision parse_precision(std::string_view name, std::string_view option) {
  if (auto precision = precision_named(name)) return *precision;
  throw ConfigError(fmt::format("{}='{}' is unknown; use fp32, bf16 or fp16", option, name));
}

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
  }
  return "fp32";
}

c10::ScalarType scalar_type_of(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return c10::kFloat;
    case Precision::kBf16: return c10::kBFloat16;
    case Precision::kFp16: return c10::kHalf;
  }
  return c10::kFloat;
}

const char* hf_dtype_name(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "float32";
    case Precision::kBf16: return "bfloat16";
    case Precision::kFp16: return "float16";
  }
  return "float32";
}

std::optional<const char*> hf_dtype_name(c10::ScalarType type) {
  if (type == c10::kDouble) return "float64";
  if (auto precision = precision_of(type)) return hf_dtype_name(*precision);
  return std::nullopt;
}

std::optional<Precision> precision_of(c10::ScalarType type) {
  if (type == c10::kFloat) return Precision::kFp32;
  if (type == c10::kBFloat16) return Precision::kBf16;
  if (type == c10::kHalf) return Precision::kFp16;
  return std::nullopt;
}

}  // namespace colossus

// The precisions of training and serving, named in one place: parsed from a
// config string once, with their tensor type and Hugging Face dtype name.
// Options structs keep the string a user wrote (it is what the config file
// and the error messages show); code that acts on it asks here.
#pragma once
#include <c10/core/ScalarType.h>

#include <optional>
#include <string_view>

namespace colossus {

enum class Precision { kFp32, kBf16, kFp16 };

// "fp32", "bf16" or "fp16"; nullopt for anything else.
std::optional<Precision> precision_named(std::string_view name);
// As precision_named, but throws ConfigError "<option>='<name>' is unknown;
// use fp32, bf16 or fp16" (option e.g. "gemini: precision").
Precision parse_precision(std::string_view name, std::string_view option);
const char* precision_name(Precision precision);
c10::ScalarType scalar_type_of(Precision precision);
// torch_dtype in a Hugging Face config.json: "float32", "bfloat16", "float16".
const char* hf_dtype_name(Precision precision);
// torch_dtype for a tensor type a checkpoint may hold (the three above and
// float64); nullopt for the others.
std::optional<const char*> hf_dtype_name(c10::ScalarType type);
// The precision a floating tensor type is; nullopt for others (float64, integers).
std::optional<Precision> precision_of(c10::ScalarType type);

}  // namespace colossus

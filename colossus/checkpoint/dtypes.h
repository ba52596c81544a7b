// The safetensors dtype names ("F32", "BF16", ...) and their torch scalar
// types, element sizes and the order the safetensors package lays them out in.
#pragma once
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string_view>

namespace colossus::checkpoint {

struct DtypeInfo {
  std::string_view name;  // as written in the header: "F32"
  c10::ScalarType scalar_type;
  int64_t itemsize;  // bytes per element
  int layout_rank;   // the safetensors package writes higher ranks first
};

// nullopt for a name safetensors or torch does not know (the caller reports it).
std::optional<DtypeInfo> dtype_from_name(std::string_view name);
std::optional<DtypeInfo> dtype_from_scalar_type(c10::ScalarType type);

// "F32, F16, ...": every supported name, for error messages.
std::string_view supported_dtype_names();

}  // namespace colossus::checkpoint

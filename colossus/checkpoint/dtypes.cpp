#include "colossus/checkpoint/dtypes.h"

#include <array>

namespace colossus::checkpoint {

namespace {

// layout_rank reproduces the order the Rust safetensors writer sorts by
// (dtype descending, then name), measured with safetensors 0.8: U64 first,
// BOOL last. Matching it makes our files byte-identical to save_file's.
constexpr std::array kDtypes = {
    DtypeInfo{"U64", c10::ScalarType::UInt64, 8, 17},
    DtypeInfo{"I64", c10::ScalarType::Long, 8, 16},
    DtypeInfo{"F64", c10::ScalarType::Double, 8, 15},
    DtypeInfo{"C64", c10::ScalarType::ComplexFloat, 8, 14},
    DtypeInfo{"F32", c10::ScalarType::Float, 4, 13},
    DtypeInfo{"U32", c10::ScalarType::UInt32, 4, 12},
    DtypeInfo{"I32", c10::ScalarType::Int, 4, 11},
    DtypeInfo{"BF16", c10::ScalarType::BFloat16, 2, 10},
    DtypeInfo{"F16", c10::ScalarType::Half, 2, 9},
    DtypeInfo{"U16", c10::ScalarType::UInt16, 2, 8},
    DtypeInfo{"I16", c10::ScalarType::Short, 2, 7},
    DtypeInfo{"F8_E5M2FNUZ", c10::ScalarType::Float8_e5m2fnuz, 1, 6},
    DtypeInfo{"F8_E4M3FNUZ", c10::ScalarType::Float8_e4m3fnuz, 1, 5},
    DtypeInfo{"F8_E4M3", c10::ScalarType::Float8_e4m3fn, 1, 4},
    DtypeInfo{"F8_E5M2", c10::ScalarType::Float8_e5m2, 1, 3},
    DtypeInfo{"I8", c10::ScalarType::Char, 1, 2},
    DtypeInfo{"U8", c10::ScalarType::Byte, 1, 1},
    DtypeInfo{"BOOL", c10::ScalarType::Bool, 1, 0},
};

}  // namespace

std::optional<DtypeInfo> dtype_from_name(std::string_view name) {
  for (const auto& info : kDtypes) {
    if (info.name == name) return info;
  }
  return std::nullopt;
}

std::optional<DtypeInfo> dtype_from_scalar_type(c10::ScalarType type) {
  for (const auto& info : kDtypes) {
    if (info.scalar_type == type) return info;
  }
  return std::nullopt;
}

std::string_view supported_dtype_names() {
  return "F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL C64 F8_E4M3 F8_E5M2 F8_E4M3FNUZ F8_E5M2FNUZ";
}

}  // namespace colossus::checkpoint

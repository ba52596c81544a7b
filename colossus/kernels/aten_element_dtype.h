// The kernels' ElementDtype of an ATen dtype, for the torch-side callers that
// fill the kernels' raw-pointer arguments (models, lora). Not for .cu files:
// it includes c10.
#pragma once
#include "colossus/kernels/element_dtype.h"

#include <c10/core/ScalarType.h>

#include <optional>

namespace colossus::kernels {

// fp32 / fp16 / bf16; nullopt for a dtype the kernels do not take.
inline std::optional<ElementDtype> element_dtype_of(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return ElementDtype::kFloat32;
    case c10::ScalarType::Half: return ElementDtype::kFloat16;
    case c10::ScalarType::BFloat16: return ElementDtype::kBFloat16;
    default: return std::nullopt;
  }
}

}  // namespace colossus::kernels

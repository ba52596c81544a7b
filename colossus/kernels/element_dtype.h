// The element types the fused layer kernels (norm.h, rope.h, swiglu.h) take
// through their raw-pointer API, and the 16-byte alignment their vector paths
// need (host-side, so the models layer can tell beforehand which tensors the
// kernels accept).
#pragma once
#include <cstdint>

namespace colossus::kernels {

enum class ElementDtype : int32_t { kFloat32, kFloat16, kBFloat16 };

inline int64_t element_bytes(ElementDtype dtype) { return dtype == ElementDtype::kFloat32 ? 4 : 2; }
// Elements in one 16-byte vector: 4 fp32, 8 fp16/bf16.
inline int64_t vector_elements(ElementDtype dtype) { return 16 / element_bytes(dtype); }
// Null counts as aligned (an absent optional operand).
inline bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

}  // namespace colossus::kernels

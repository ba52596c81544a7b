// CRC32C (Castagnoli), table-driven, and the masked form that TFRecord framing
// stores. Check value: crc32c("123456789") == 0xE3069283.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace colossus::metrics {

// CRC32C of `size` bytes; pass a previous result as `crc` to continue a running checksum.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
inline uint32_t crc32c(std::string_view bytes) { return crc32c(bytes.data(), bytes.size()); }

// TFRecord's masking: rotate right by 15 and add a constant, so a CRC stored
// inside CRC-protected data does not checksum to a fixed pattern.
inline uint32_t mask_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace colossus::metrics

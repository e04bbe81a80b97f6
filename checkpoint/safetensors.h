// The safetensors container (github.com/huggingface/safetensors): its element types and layout,
// shared by the streaming writer (safetensors_writer.h) and the validating reader
// (safetensors_reader.h).
//
// File layout: an unsigned 64-bit little-endian header length N, N bytes of JSON header, then
// the data. The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (byte offsets from the start of the data), plus an optional "__metadata__" object of string
// values. Tensors lie back to back in offset order with no gaps, and the header is padded with
// spaces so that the data starts at a multiple of 8 bytes.
#ifndef ZEROSHARD_CHECKPOINT_SAFETENSORS_H_
#define ZEROSHARD_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zeroshard::checkpoint {

// The element types safetensors names (the byte-sized and wider ones; sub-byte types are not
// supported).
enum class SafetensorsDType {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

// "BOOL", "U8", ..., "F32", "BF16", ... as the header spells them.
absl::string_view SafetensorsDTypeName(SafetensorsDType dtype);
// Bytes per element.
int SafetensorsDTypeSize(SafetensorsDType dtype);
// INVALID_ARGUMENT for a name this reader does not know.
absl::StatusOr<SafetensorsDType> ParseSafetensorsDType(absl::string_view name);

// The official reader refuses headers longer than this (bytes).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// The header's reserved key, and the bytes of the length that precedes the header.
inline constexpr absl::string_view kSafetensorsMetadataKey = "__metadata__";
inline constexpr uint64_t kSafetensorsLengthPrefixBytes = 8;

// "__metadata__": string keys to string values. Ordered, so the header is deterministic.
using SafetensorsMetadata = std::map<std::string, std::string>;

}  // namespace zeroshard::checkpoint

#endif  // ZEROSHARD_CHECKPOINT_SAFETENSORS_H_

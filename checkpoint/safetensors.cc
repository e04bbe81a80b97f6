// The safetensors element types: names and sizes as the header spells them.
#include "checkpoint/safetensors.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/dcheck.h"

namespace zeroshard::checkpoint {
namespace {

struct DTypeEntry {
  SafetensorsDType dtype;
  absl::string_view name;
  int size;
};

constexpr DTypeEntry kDTypes[] = {
    {SafetensorsDType::kBool, "BOOL", 1},      {SafetensorsDType::kU8, "U8", 1},
    {SafetensorsDType::kI8, "I8", 1},          {SafetensorsDType::kF8E5M2, "F8_E5M2", 1},
    {SafetensorsDType::kF8E4M3, "F8_E4M3", 1}, {SafetensorsDType::kI16, "I16", 2},
    {SafetensorsDType::kU16, "U16", 2},        {SafetensorsDType::kF16, "F16", 2},
    {SafetensorsDType::kBF16, "BF16", 2},      {SafetensorsDType::kI32, "I32", 4},
    {SafetensorsDType::kU32, "U32", 4},        {SafetensorsDType::kF32, "F32", 4},
    {SafetensorsDType::kF64, "F64", 8},        {SafetensorsDType::kI64, "I64", 8},
    {SafetensorsDType::kU64, "U64", 8},
};

const DTypeEntry& EntryOf(SafetensorsDType dtype) {
  for (const DTypeEntry& entry : kDTypes) {
    if (entry.dtype == dtype) return entry;
  }
  ZS_DCHECK(false) << "invalid SafetensorsDType " << static_cast<int>(dtype);
  return kDTypes[0];
}

}  // namespace

absl::string_view SafetensorsDTypeName(SafetensorsDType dtype) { return EntryOf(dtype).name; }

int SafetensorsDTypeSize(SafetensorsDType dtype) { return EntryOf(dtype).size; }

absl::StatusOr<SafetensorsDType> ParseSafetensorsDType(absl::string_view name) {
  for (const DTypeEntry& entry : kDTypes) {
    if (entry.name == name) return entry.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", absl::CHexEscape(name), "\""));
}

}  // namespace zeroshard::checkpoint

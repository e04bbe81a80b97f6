// Typed loops for the engine's buffer conversions, one instantiation per dtype pair.
#include "worker/engine/element_convert.h"

#include <cstdint>
#include <cstring>

#include "common/dcheck.h"

namespace zeroshard::engine {
namespace {

using numerics::DType;

// Whether byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool Overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const auto a_begin = reinterpret_cast<uintptr_t>(a);
  const auto b_begin = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && a_begin < b_begin + b_bytes && b_begin < a_begin + a_bytes;
}

template <DType kType>
struct Element;

template <>
struct Element<DType::kFloat32> {
  using Storage = float;
  static float Load(float value) { return value; }
  static float Store(float value) { return value; }
};

template <>
struct Element<DType::kBFloat16> {
  using Storage = uint16_t;
  static float Load(uint16_t value) { return numerics::BFloat16ToFloat(value); }
  static uint16_t Store(float value) { return numerics::FloatToBFloat16(value); }
};

template <>
struct Element<DType::kFloat16> {
  using Storage = uint16_t;
  static float Load(uint16_t value) { return numerics::HalfToFloat(value); }
  static uint16_t Store(float value) { return numerics::FloatToHalf(value); }
};

template <DType kStorage, DType kDst>
void StoreScaledLoop(const float* grad, float scale, int64_t count, void* dst) {
  using Storage = Element<kStorage>;
  using Dst = Element<kDst>;
  auto* out = static_cast<typename Dst::Storage*>(dst);
  for (int64_t i = 0; i < count; ++i) {
    out[i] = Dst::Store(Storage::Load(Storage::Store(grad[i] * scale)));
  }
}

template <DType kSrc, DType kDst>
void ConvertLoop(const void* src, void* dst, int64_t count) {
  const auto* in = static_cast<const typename Element<kSrc>::Storage*>(src);
  auto* out = static_cast<typename Element<kDst>::Storage*>(dst);
  for (int64_t i = 0; i < count; ++i) out[i] = Element<kDst>::Store(Element<kSrc>::Load(in[i]));
}

template <DType kSrc, DType kDst>
void AddLoop(const void* src, void* dst, int64_t count) {
  const auto* in = static_cast<const typename Element<kSrc>::Storage*>(src);
  auto* out = static_cast<typename Element<kDst>::Storage*>(dst);
  for (int64_t i = 0; i < count; ++i) {
    out[i] = Element<kDst>::Store(Element<kDst>::Load(out[i]) + Element<kSrc>::Load(in[i]));
  }
}

// Calls Loop<kA, kB>::Run(args...) for the runtime pair (a, b).
template <template <DType, DType> class Loop, DType kA, class... Args>
void DispatchSecond(DType b, Args... args) {
  switch (b) {
    case DType::kFloat32:
      return Loop<kA, DType::kFloat32>::Run(args...);
    case DType::kBFloat16:
      return Loop<kA, DType::kBFloat16>::Run(args...);
    case DType::kFloat16:
      return Loop<kA, DType::kFloat16>::Run(args...);
  }
}

template <template <DType, DType> class Loop, class... Args>
void Dispatch(DType a, DType b, Args... args) {
  switch (a) {
    case DType::kFloat32:
      return DispatchSecond<Loop, DType::kFloat32>(b, args...);
    case DType::kBFloat16:
      return DispatchSecond<Loop, DType::kBFloat16>(b, args...);
    case DType::kFloat16:
      return DispatchSecond<Loop, DType::kFloat16>(b, args...);
  }
}

template <DType kStorage, DType kDst>
struct StoreScaled {
  static void Run(const float* grad, float scale, int64_t count, void* dst) {
    StoreScaledLoop<kStorage, kDst>(grad, scale, count, dst);
  }
};

template <DType kSrc, DType kDst>
struct Convert {
  static void Run(const void* src, void* dst, int64_t count) {
    if (kSrc == kDst) {
      if (src != dst) std::memcpy(dst, src, count * numerics::DTypeSize(kSrc));
      return;
    }
    ConvertLoop<kSrc, kDst>(src, dst, count);
  }
};

template <DType kSrc, DType kDst>
struct Add {
  static void Run(const void* src, void* dst, int64_t count) {
    AddLoop<kSrc, kDst>(src, dst, count);
  }
};

}  // namespace

comm::ElementType ToElementType(numerics::DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return comm::ElementType::kFloat32;
    case DType::kBFloat16:
      return comm::ElementType::kBFloat16;
    case DType::kFloat16:
      return comm::ElementType::kFloat16;
  }
  return comm::ElementType::kFloat32;
}

void StoreScaledGradient(const float* grad, float scale, int64_t count, DType storage_dtype,
                         void* dst, DType dst_dtype) {
  Dispatch<StoreScaled>(storage_dtype, dst_dtype, grad, scale, count, dst);
}

void ConvertElements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t count) {
  ZS_DCHECK((src == dst && src_dtype == dst_dtype) ||
            !Overlap(src, count * numerics::DTypeSize(src_dtype), dst,
                     count * numerics::DTypeSize(dst_dtype)))
      << count << " elements";
  Dispatch<Convert>(src_dtype, dst_dtype, src, dst, count);
}

void AddElements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t count) {
  ZS_DCHECK(!Overlap(src, count * numerics::DTypeSize(src_dtype), dst,
                     count * numerics::DTypeSize(dst_dtype)))
      << count << " elements";
  Dispatch<Add>(src_dtype, dst_dtype, src, dst, count);
}

void ZeroElements(void* dst, DType dtype, int64_t count) {
  if (count > 0) std::memset(dst, 0, count * numerics::DTypeSize(dtype));
}

}  // namespace zeroshard::engine

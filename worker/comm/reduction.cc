// ReduceElements: one loop per (type, op); the fp32/fp64 sums are alias-free loops built at -O3,
// with an AVX2 variant chosen at run time (elementwise adds: the same bits at any vector width).
#include "worker/comm/reduction.h"

#include <cmath>
#include <cstdint>

#include "common/dcheck.h"
#include "numerics/dtype.h"

namespace zeroshard::comm {
namespace {

// Whether the `bytes`-byte ranges at `a` and `b` share a byte.
bool Overlap(const void* a, const void* b, size_t bytes) {
  const auto a_begin = reinterpret_cast<uintptr_t>(a);
  const auto b_begin = reinterpret_cast<uintptr_t>(b);
  return bytes > 0 && a_begin < b_begin + bytes && b_begin < a_begin + bytes;
}

// The vectorisable cores: their pointers never overlap. Each keeps the operand order
// received + own (IEEE, one rounding per element), so every vector width gives the same bits.
template <typename T>
inline void AddReceivedInto(T* __restrict own, const T* __restrict received, size_t count) {
  for (size_t i = 0; i < count; ++i) own[i] = received[i] + own[i];
}

template <typename T>
inline void AddOwnInto(T* __restrict received, const T* __restrict own, size_t count) {
  for (size_t i = 0; i < count; ++i) received[i] = received[i] + own[i];
}

template <typename T>
inline void AddInto(T* __restrict out, const T* __restrict received, const T* __restrict own,
                    size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = received[i] + own[i];
}

// out[i] = received[i] + own[i] where `out` equals `own`, `received`, or neither (the ring's
// in-place and out-of-place uses); the three cases are split so each loop is alias-free.
template <typename T>
inline void SumLoopBody(T* out, const T* received, const T* own, size_t count) {
  if (out == own) {
    AddReceivedInto(out, received, count);
  } else if (out == received) {
    AddOwnInto(out, own, count);
  } else {
    AddInto(out, received, own, count);
  }
}

template <typename T>
__attribute__((target("avx2"))) void SumLoopAvx2(T* out, const T* received, const T* own,
                                                 size_t count) {
  SumLoopBody(out, received, own, count);
}

template <typename T>
void SumLoopBaseline(T* out, const T* received, const T* own, size_t count) {
  SumLoopBody(out, received, own, count);
}

bool HasAvx2() {
  static const bool has_avx2 = __builtin_cpu_supports("avx2");
  return has_avx2;
}

// fp32/fp64 sums: AVX2 when the CPU has it, else the baseline (SSE2) build of the same loop.
template <typename T>
void SumLoop(T* out, const T* received, const T* own, size_t count) {
  if (HasAvx2()) {
    SumLoopAvx2(out, received, own, count);
  } else {
    SumLoopBaseline(out, received, own, count);
  }
}

template <typename T>
void FloatMaxLoop(T* out, const T* received, const T* own, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const T a = received[i];
    const T b = own[i];
    out[i] = (std::isnan(a) || std::isnan(b)) ? (a + b) : (a < b ? b : a);
  }
}

// Signed overflow wraps: the sum is taken on the unsigned type of the same width.
template <typename T, typename U>
void IntSumLoop(T* out, const T* received, const T* own, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    out[i] = static_cast<T>(static_cast<U>(received[i]) + static_cast<U>(own[i]));
  }
}

template <typename T>
void IntMaxLoop(T* out, const T* received, const T* own, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = received[i] < own[i] ? own[i] : received[i];
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void HalfWidthLoop(uint16_t* out, const uint16_t* received, const uint16_t* own, size_t count,
                   ReduceOp op) {
  if (op == ReduceOp::kSum) {
    for (size_t i = 0; i < count; ++i) out[i] = FromFloat(ToFloat(received[i]) + ToFloat(own[i]));
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    const float a = ToFloat(received[i]);
    const float b = ToFloat(own[i]);
    out[i] = FromFloat((std::isnan(a) || std::isnan(b)) ? (a + b) : (a < b ? b : a));
  }
}

}  // namespace

void ReduceElements(void* out, const void* received, const void* own, size_t count,
                    ElementType type, ReduceOp op) {
  const size_t bytes = count * ElementSize(type);
  ZS_DCHECK(!Overlap(received, own, bytes)) << "received and own overlap";
  ZS_DCHECK(out == own || out == received ||
            (!Overlap(out, own, bytes) && !Overlap(out, received, bytes)))
      << "out partly overlaps an operand";
  const bool sum = op == ReduceOp::kSum;
  switch (type) {
    case ElementType::kFloat64: {
      auto* o = static_cast<double*>(out);
      auto* r = static_cast<const double*>(received);
      auto* w = static_cast<const double*>(own);
      sum ? SumLoop(o, r, w, count) : FloatMaxLoop(o, r, w, count);
      return;
    }
    case ElementType::kFloat32: {
      auto* o = static_cast<float*>(out);
      auto* r = static_cast<const float*>(received);
      auto* w = static_cast<const float*>(own);
      sum ? SumLoop(o, r, w, count) : FloatMaxLoop(o, r, w, count);
      return;
    }
    case ElementType::kBFloat16:
      HalfWidthLoop<numerics::BFloat16ToFloat, numerics::FloatToBFloat16>(
          static_cast<uint16_t*>(out), static_cast<const uint16_t*>(received),
          static_cast<const uint16_t*>(own), count, op);
      return;
    case ElementType::kFloat16:
      HalfWidthLoop<numerics::HalfToFloat, numerics::FloatToHalf>(
          static_cast<uint16_t*>(out), static_cast<const uint16_t*>(received),
          static_cast<const uint16_t*>(own), count, op);
      return;
    case ElementType::kInt32: {
      auto* o = static_cast<int32_t*>(out);
      auto* r = static_cast<const int32_t*>(received);
      auto* w = static_cast<const int32_t*>(own);
      sum ? IntSumLoop<int32_t, uint32_t>(o, r, w, count) : IntMaxLoop(o, r, w, count);
      return;
    }
    case ElementType::kInt64: {
      auto* o = static_cast<int64_t*>(out);
      auto* r = static_cast<const int64_t*>(received);
      auto* w = static_cast<const int64_t*>(own);
      sum ? IntSumLoop<int64_t, uint64_t>(o, r, w, count) : IntMaxLoop(o, r, w, count);
      return;
    }
  }
}

}  // namespace zeroshard::comm

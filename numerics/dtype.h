// Element types of gradients and parameter copies (fp32, bf16, fp16) and their exact
// conversions to and from fp32 (round to nearest even), usable on the host and on CUDA devices.
// Shared by both planes: the optimizer kernels and the collectives compute with them, and
// checkpoint export widens stored parameters with them.
#ifndef ZEROSHARD_NUMERICS_DTYPE_H_
#define ZEROSHARD_NUMERICS_DTYPE_H_

#include <cstdint>
#include <cstring>

#include "numerics/host_device.h"

namespace zeroshard::numerics {

// A tensor element type. bf16 and fp16 values are stored as their raw uint16_t bit patterns.
//
// Three element-type enums exist, one per layer, and each layer depends only on its own:
//  - v1::DType (proto/zeroshard/v1/types.proto) is the API's: it has DTYPE_UNSPECIFIED (proto3's
//    "unset") and FLOAT64, which a job may not choose for parameters or gradients.
//  - numerics::DType (this one) is what the optimizer kernels compute on: exactly the three
//    storage types they implement, so a switch over it needs no "unsupported" branch. Host and
//    device code include it, so it cannot depend on protobuf.
//  - comm::ElementType (worker/comm/communicator.h) is what a collective moves and reduces: it adds
//    fp64 (the norm's partial sums) and int32/int64, which no kernel stores.
// The mappings are one function each: v1 -> numerics in worker/daemon's ToKernelDType (which
// names the spec field it refuses), numerics -> comm in worker/engine/element_convert.h's
// ToElementType.
enum class DType : int32_t {
  kFloat32 = 0,
  kBFloat16 = 1,
  kFloat16 = 2,
};

inline bool IsValidDType(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

// Bytes per element (0 for an invalid value).
ZS_HOST_DEVICE inline int DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
  }
  return 0;
}

inline const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
  }
  return "invalid";
}

ZS_HOST_DEVICE inline uint32_t FloatToBits(float value) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
#endif
}

ZS_HOST_DEVICE inline float BitsToFloat(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
#endif
}

// bf16 is the upper half of an fp32: widening is exact.
ZS_HOST_DEVICE inline float BFloat16ToFloat(uint16_t bf16) {
  return BitsToFloat(static_cast<uint32_t>(bf16) << 16);
}

// Round to nearest, ties to even; overflow rounds to +-Inf; NaN stays NaN (quieted).
ZS_HOST_DEVICE inline uint16_t FloatToBFloat16(float value) {
  const uint32_t bits = FloatToBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// IEEE binary16 to fp32, exact (subnormal halves become normal floats). NaN stays NaN (quieted).
ZS_HOST_DEVICE inline float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1fu) {
    const uint32_t quiet = mantissa != 0 ? 0x400000u : 0u;
    return BitsToFloat(sign | 0x7f800000u | (mantissa << 13) | quiet);
  }
  if (exponent == 0) {
    if (mantissa == 0) return BitsToFloat(sign);
    // Subnormal: value = mantissa * 2^-24; normalise so the leading one is bit 10.
    uint32_t float_exponent = 113;  // biased fp32 exponent of 2^-14
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --float_exponent;
    }
    return BitsToFloat(sign | (float_exponent << 23) | ((mantissa & 0x3ffu) << 13));
  }
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// fp32 to IEEE binary16, round to nearest, ties to even, with subnormal results and
// overflow to +-Inf, as the F16C instruction VCVTPS2PH does. NaN stays NaN (quieted).
ZS_HOST_DEVICE inline uint16_t FloatToHalf(float value) {
  const uint32_t bits = FloatToBits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  // 65520 (0x477ff000) is halfway between the largest half, 65504, and 2^16: ties go up to Inf.
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (magnitude >= 0x38800000u) {
    // Normal half: rebias the exponent by -112 and round away the low 13 mantissa bits.
    const uint32_t rounded = magnitude - 0x38000000u + 0x0fffu + ((magnitude >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }
  // At most 2^-25, half of the smallest subnormal: rounds to zero (the tie goes to even, 0).
  if (magnitude <= 0x33000000u) return static_cast<uint16_t>(sign);
  // Subnormal half: value / 2^-24, rounded to an integer.
  const uint32_t exponent = magnitude >> 23;
  const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;  // 14..24
  uint32_t result = significand >> shift;
  const uint32_t remainder = significand & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (remainder > halfway || (remainder == halfway && (result & 1u) != 0)) ++result;
  return static_cast<uint16_t>(sign | result);
}

}  // namespace zeroshard::numerics

#endif  // ZEROSHARD_NUMERICS_DTYPE_H_

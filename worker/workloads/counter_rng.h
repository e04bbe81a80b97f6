// A counter-based generator keyed by (seed, stream, index): integer hashing (SplitMix64) turned
// into uniform floats with exact float arithmetic, so NumPy reproduces it bit for bit.
#ifndef ZEROSHARD_WORKER_WORKLOADS_COUNTER_RNG_H_
#define ZEROSHARD_WORKER_WORKLOADS_COUNTER_RNG_H_

#include <cstdint>

#include "absl/types/span.h"

namespace zeroshard::workloads {

// SplitMix64's increment (the golden-ratio gamma) and its output function. All arithmetic is
// modulo 2^64.
inline constexpr uint64_t kSplitMix64Gamma = 0x9E3779B97F4A7C15ULL;
uint64_t SplitMix64Mix(uint64_t z);

// Output number `n` (0-based) of SplitMix64 started at `state`: Mix(state + (n + 1) * gamma).
uint64_t SplitMix64Output(uint64_t state, uint64_t n);

// The uniform float in [-1, 1) that 64 random bits stand for: u = bits >> 40 (the top 24 bits),
// value = float(u - 2^23) * 2^-23. Every step is exact, so the value is a multiple of 2^-23.
float BitsToSymmetricUniform(uint64_t bits);

// The bound of torch's default Linear init, 1 / sqrt(fan_in), computed in float32 with IEEE
// (correctly rounded) conversion, sqrt and division: 1.0f / sqrtf(float(fan_in)).
float InitBound(int64_t fan_in);

// One stream of the generator: value `index` is a pure function of (seed, stream, index).
//   key  = SplitMix64Output(SplitMix64Output(seed, 0), stream)
//   bits = SplitMix64Output(key, index)
// Immutable, so safe to share between threads.
class CounterRng {
 public:
  CounterRng(uint64_t seed, uint64_t stream);

  uint64_t Bits(uint64_t index) const { return SplitMix64Output(key_, index); }

  // BitsToSymmetricUniform(Bits(index)): uniform in [-1, 1).
  float SymmetricUniform(uint64_t index) const { return BitsToSymmetricUniform(Bits(index)); }

  // out[k] = SymmetricUniform(first_index + k) * scale, the product rounded to float32.
  void FillSymmetricUniform(uint64_t first_index, float scale, absl::Span<float> out) const;

 private:
  uint64_t key_;
};

}  // namespace zeroshard::workloads

#endif  // ZEROSHARD_WORKER_WORKLOADS_COUNTER_RNG_H_

// The counter-based generator of counter_rng.h (specified in docs/workloads.md).
#include "worker/workloads/counter_rng.h"

#include <cmath>

namespace zeroshard::workloads {

uint64_t SplitMix64Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t SplitMix64Output(uint64_t state, uint64_t n) {
  return SplitMix64Mix(state + (n + 1) * kSplitMix64Gamma);
}

float BitsToSymmetricUniform(uint64_t bits) {
  const int32_t centered = static_cast<int32_t>(bits >> 40) - (int32_t{1} << 23);
  // |centered| <= 2^23 fits a float's 24-bit significand, and the scale is a power of two.
  return static_cast<float>(centered) * 0x1p-23f;
}

float InitBound(int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); }

CounterRng::CounterRng(uint64_t seed, uint64_t stream)
    : key_(SplitMix64Output(SplitMix64Output(seed, 0), stream)) {}

void CounterRng::FillSymmetricUniform(uint64_t first_index, float scale,
                                      absl::Span<float> out) const {
  for (size_t k = 0; k < out.size(); ++k) out[k] = SymmetricUniform(first_index + k) * scale;
}

}  // namespace zeroshard::workloads

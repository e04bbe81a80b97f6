// Tests of the CPU optimizer kernels: each optimizer against a scalar reference written here from
// torch.optim's published algorithms (and the Lion paper), independently of the kernel's code;
// bit-identical results across thread counts and instruction sets; the first step; a zero scale.
#include "kernels/cpu_optimizer.h"

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/optimizer_test_configs.h"
#include "numerics/dtype.h"

namespace zeroshard::kernels {
namespace {

// Tolerance of every comparison with the reference: |kernel - reference| <= kRelTol *
// max(|reference|, kAbsFloor). Both compute the same IEEE operations in the same order, so
// after 100 steps they agree far inside this.
constexpr double kRelTol = 1e-6;
constexpr double kAbsFloor = 1e-3;

// ---- Reference conversions (independent of numerics/dtype.h) ----

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even by comparing the distances to the two neighbouring bf16 values.
uint16_t RefToBFloat16(float value) {
  if (std::isnan(value)) return 0x7fc0;
  const uint32_t bits = Bits(value);
  const uint32_t truncated = bits & 0xffff0000u;
  const double low = FromBits(truncated);
  const int exponent = static_cast<int>((bits >> 23) & 0xff);
  const double ulp = std::ldexp(1.0, (exponent == 0 ? 1 : exponent) - 127 - 7);
  const double magnitude_low = std::fabs(low);
  const double distance_low = std::fabs(static_cast<double>(value)) - magnitude_low;
  const double distance_high = magnitude_low + ulp - std::fabs(static_cast<double>(value));
  const uint16_t down = static_cast<uint16_t>(truncated >> 16);
  if (distance_low < distance_high) return down;
  if (distance_low > distance_high) return down + 1;
  return (down & 1) ? down + 1 : down;
}

float RefFromBFloat16(uint16_t v) { return FromBits(static_cast<uint32_t>(v) << 16); }

__attribute__((target("f16c"))) uint16_t RefToHalf(float value) {
  return _cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

__attribute__((target("f16c"))) float RefFromHalf(uint16_t v) { return _cvtsh_ss(v); }

// ---- The reference optimizers: torch.optim's single-tensor algorithms, element by element ----

struct RefState {
  std::vector<float> param;
  std::vector<float> state[3];
};

void ReferenceStep(const OptimizerConfig& c, int64_t step, float grad_scale, double wd,
                   double lr_scale, const std::vector<float>& grads, RefState& st) {
  const double lr = c.lr * lr_scale;
  for (size_t i = 0; i < grads.size(); ++i) {
    float& p = st.param[i];
    float g = grads[i] * grad_scale;
    if (c.maximize) g = -g;
    switch (c.kind) {
      case OptimizerKind::kSgd: {
        if (wd != 0) g = g + static_cast<float>(wd) * p;
        if (c.momentum != 0) {
          float& buf = st.state[0][i];
          if (step == 1) {
            buf = g;
          } else {
            buf = buf * static_cast<float>(c.momentum) + static_cast<float>(1 - c.dampening) * g;
          }
          g = c.nesterov ? g + static_cast<float>(c.momentum) * buf : buf;
        }
        p = p + static_cast<float>(-lr) * g;
        break;
      }
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW: {
        float& m = st.state[0][i];
        float& v = st.state[1][i];
        float& vmax = st.state[2][i];
        if (step == 1) m = v = vmax = 0.0f;
        if (c.kind == OptimizerKind::kAdamW) {
          p = p * static_cast<float>(1 - lr * wd);
        } else if (wd != 0) {
          g = g + static_cast<float>(wd) * p;
        }
        m = m * static_cast<float>(c.beta1) + static_cast<float>(1 - c.beta1) * g;
        v = v * static_cast<float>(c.beta2) + static_cast<float>(1 - c.beta2) * g * g;
        const double bias_correction1 = 1 - std::pow(c.beta1, static_cast<double>(step));
        const double bias_correction2 = 1 - std::pow(c.beta2, static_cast<double>(step));
        const double step_size = lr / bias_correction1;
        const double bias_correction2_sqrt = std::sqrt(bias_correction2);
        float denom;
        if (c.amsgrad) {
          vmax = std::max(vmax, v);
          denom = std::sqrt(vmax) / static_cast<float>(bias_correction2_sqrt) +
                  static_cast<float>(c.eps);
        } else {
          denom =
              std::sqrt(v) / static_cast<float>(bias_correction2_sqrt) + static_cast<float>(c.eps);
        }
        p = p + static_cast<float>(-step_size) * m / denom;
        break;
      }
      case OptimizerKind::kAdagrad: {
        float& sum = st.state[0][i];
        if (step == 1) sum = static_cast<float>(c.initial_accumulator_value);
        if (wd != 0) g = g + static_cast<float>(wd) * p;
        const double clr = lr / (1 + (step - 1) * c.lr_decay);
        sum = sum + g * g;
        const float std_dev = std::sqrt(sum) + static_cast<float>(c.eps);
        p = p + static_cast<float>(-clr) * g / std_dev;
        break;
      }
      case OptimizerKind::kLion: {
        // Chen et al. 2023, Algorithm 2: c = b1 m + (1 - b1) g; p -= lr (sign(c) + wd p);
        // m = b2 m + (1 - b2) g.
        float& m = st.state[0][i];
        if (step == 1) m = 0.0f;
        const float interp = m * static_cast<float>(c.beta1) + static_cast<float>(1 - c.beta1) * g;
        float update = interp > 0 ? 1.0f : (interp < 0 ? -1.0f : 0.0f);
        if (wd != 0) update = update + static_cast<float>(wd) * p;
        p = p - static_cast<float>(lr) * update;
        m = m * static_cast<float>(c.beta2) + static_cast<float>(1 - c.beta2) * g;
        break;
      }
    }
  }
}

// ---- A set of pieces with their backing arrays, started at unaligned addresses ----

// Pieces for one optimizer, their kernel-side arrays and the reference's copy of them.
// `copy_dtype` < 0: no parameter copy. Thread contract: not thread-safe (one test uses one).
class PieceSet {
 public:
  // Even-numbered pieces are decayed with `weight_decay`, odd ones not at all.
  PieceSet(const OptimizerConfig& config, double weight_decay, std::vector<int64_t> lengths,
           numerics::DType grad_dtype, int copy_dtype, uint32_t seed)
      : config_(config), grad_dtype_(grad_dtype), copy_dtype_(copy_dtype), rng_(seed) {
    const int states = StateArraysPerParam(config);
    for (size_t k = 0; k < lengths.size(); ++k) {
      Piece piece;
      const int64_t n = lengths[k];
      piece.offset = static_cast<int64_t>(k % 4);  // 0..3 elements past an aligned start
      piece.length = n;
      piece.weight_decay = k % 2 == 0 ? weight_decay : 0.0;
      piece.lr_scale = k % 3 == 0 ? 1.0 : (k % 3 == 1 ? 0.5 : 2.0);
      piece.grad_bytes.assign((n + piece.offset) * 4, 0);
      piece.master.assign(n + piece.offset, 0.0f);
      for (int s = 0; s < states; ++s) {
        // Garbage before step 1: the first step must ignore it.
        piece.state[s].assign(n + piece.offset, std::nanf(""));
      }
      piece.copy_bytes.assign((n + piece.offset) * 4, 0);
      piece.ref.param.resize(n);
      for (int s = 0; s < 3; ++s) piece.ref.state[s].assign(n, 0.0f);
      for (int64_t i = 0; i < n; ++i) {
        const float x = Uniform();
        piece.master[piece.offset + i] = x;
        piece.ref.param[i] = x;
      }
      pieces_.push_back(std::move(piece));
    }
  }

  // Scales some master weights to the fp16 overflow and subnormal ranges.
  void AddExtremeMasters() {
    for (Piece& piece : pieces_) {
      for (int64_t i = 0; i < piece.length; i += 5) {
        float& x = piece.master[piece.offset + i];
        x = (i % 10 == 0) ? x * 7e4f : x * 3e-6f;
        piece.ref.param[i] = x;
      }
    }
  }

  // Fills the gradients with new random values (a few special ones if `special`).
  void NewGradients(bool special) {
    for (Piece& piece : pieces_) {
      piece.ref_grads.resize(piece.length);
      for (int64_t i = 0; i < piece.length; ++i) {
        float x = Uniform();
        if (special) {
          switch (i % 11) {
            case 3:
              x = 0.0f;
              break;
            case 5:
              x = -0.0f;
              break;
            case 7:
              x = x * 1e-30f;
              break;
            case 9:
              x = x * 3e4f;
              break;
            default:
              break;
          }
        }
        unsigned char* at =
            piece.grad_bytes.data() + (piece.offset + i) * numerics::DTypeSize(grad_dtype_);
        float widened = x;
        if (grad_dtype_ == numerics::DType::kBFloat16) {
          const uint16_t h = RefToBFloat16(x);
          std::memcpy(at, &h, 2);
          widened = RefFromBFloat16(h);
        } else if (grad_dtype_ == numerics::DType::kFloat16) {
          const uint16_t h = RefToHalf(x);
          std::memcpy(at, &h, 2);
          widened = RefFromHalf(h);
        } else {
          std::memcpy(at, &x, 4);
        }
        piece.ref_grads[i] = widened;
      }
    }
  }

  std::vector<UpdatePiece> Pieces() {
    std::vector<UpdatePiece> out;
    for (Piece& piece : pieces_) {
      UpdatePiece u;
      u.grad = piece.grad_bytes.data() + piece.offset * numerics::DTypeSize(grad_dtype_);
      u.grad_dtype = grad_dtype_;
      u.master = piece.master.data() + piece.offset;
      for (int s = 0; s < 3; ++s) {
        if (!piece.state[s].empty()) u.state[s] = piece.state[s].data() + piece.offset;
      }
      if (copy_dtype_ >= 0) {
        u.param_dtype = static_cast<numerics::DType>(copy_dtype_);
        u.param_copy = piece.copy_bytes.data() + piece.offset * numerics::DTypeSize(u.param_dtype);
      }
      u.length = piece.length;
      u.weight_decay = piece.weight_decay;
      u.lr_scale = piece.lr_scale;
      out.push_back(u);
    }
    return out;
  }

  void ReferenceStepAll(int64_t step, float grad_scale) {
    for (Piece& piece : pieces_) {
      ReferenceStep(config_, step, grad_scale, piece.weight_decay, piece.lr_scale, piece.ref_grads,
                    piece.ref);
    }
  }

  // Compares the kernel's arrays with the reference's within the stated tolerance.
  void ExpectMatchesReference(const std::string& label) const {
    const int states = StateArraysPerParam(config_);
    for (size_t k = 0; k < pieces_.size(); ++k) {
      const Piece& piece = pieces_[k];
      int failures = 0;
      for (int64_t i = 0; i < piece.length && failures < 5; ++i) {
        const float kernel = piece.master[piece.offset + i];
        if (!Close(kernel, piece.ref.param[i])) {
          ++failures;
          ADD_FAILURE() << label << " piece " << k << " master[" << i << "] = " << kernel
                        << ", reference " << piece.ref.param[i];
        }
        for (int s = 0; s < states; ++s) {
          const float kernel_state = piece.state[s][piece.offset + i];
          if (!Close(kernel_state, piece.ref.state[s][i])) {
            ++failures;
            ADD_FAILURE() << label << " piece " << k << " state" << s << "[" << i
                          << "] = " << kernel_state << ", reference " << piece.ref.state[s][i];
          }
        }
        if (copy_dtype_ >= 0 && !CopyMatches(piece, i)) {
          ++failures;
          ADD_FAILURE() << label << " piece " << k << " param copy[" << i << "] is not " << kernel
                        << " rounded to "
                        << numerics::DTypeName(static_cast<numerics::DType>(copy_dtype_));
        }
      }
    }
  }

  // The master weights and states as numbers (so +0 equals -0).
  std::vector<float> Values() const {
    std::vector<float> values;
    for (const Piece& piece : pieces_) {
      values.insert(values.end(), piece.master.begin(), piece.master.end());
      for (int s = 0; s < 3; ++s) {
        values.insert(values.end(), piece.state[s].begin(), piece.state[s].end());
      }
    }
    return values;
  }

  // Every byte the kernel writes, for bitwise comparisons.
  std::vector<unsigned char> Snapshot() const {
    std::vector<unsigned char> bytes;
    auto append = [&](const void* data, size_t n) {
      const unsigned char* b = static_cast<const unsigned char*>(data);
      bytes.insert(bytes.end(), b, b + n);
    };
    for (const Piece& piece : pieces_) {
      append(piece.master.data(), piece.master.size() * 4);
      for (int s = 0; s < 3; ++s) append(piece.state[s].data(), piece.state[s].size() * 4);
      append(piece.copy_bytes.data(), piece.copy_bytes.size());
    }
    return bytes;
  }

 private:
  struct Piece {
    int64_t offset = 0;
    int64_t length = 0;
    double weight_decay = 0.0;
    double lr_scale = 1.0;
    std::vector<unsigned char> grad_bytes;
    std::vector<float> master;
    std::vector<float> state[3];
    std::vector<unsigned char> copy_bytes;
    std::vector<float> ref_grads;
    RefState ref;
  };

  static bool Close(float kernel, float reference) {
    if (std::isnan(kernel) || std::isnan(reference)) return false;
    const double diff = std::fabs(static_cast<double>(kernel) - reference);
    return diff <= kRelTol * std::max(std::fabs(static_cast<double>(reference)), kAbsFloor);
  }

  bool CopyMatches(const Piece& piece, int64_t i) const {
    const float master = piece.master[piece.offset + i];
    const numerics::DType dtype = static_cast<numerics::DType>(copy_dtype_);
    const unsigned char* at =
        piece.copy_bytes.data() + (piece.offset + i) * numerics::DTypeSize(dtype);
    if (dtype == numerics::DType::kFloat32) {
      float copy;
      std::memcpy(&copy, at, 4);
      return Bits(copy) == Bits(master);
    }
    uint16_t copy;
    std::memcpy(&copy, at, 2);
    return copy ==
           (dtype == numerics::DType::kBFloat16 ? RefToBFloat16(master) : RefToHalf(master));
  }

  float Uniform() { return std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng_); }

  OptimizerConfig config_;
  numerics::DType grad_dtype_;
  int copy_dtype_;
  std::mt19937 rng_;
  std::vector<Piece> pieces_;
};

const numerics::DType kGradDTypes[] = {numerics::DType::kFloat32, numerics::DType::kBFloat16,
                                       numerics::DType::kFloat16};
const int kCopyDTypes[] = {-1, static_cast<int>(numerics::DType::kFloat32),
                           static_cast<int>(numerics::DType::kBFloat16),
                           static_cast<int>(numerics::DType::kFloat16)};

std::string CopyName(int copy_dtype) {
  return copy_dtype < 0 ? std::string("nocopy")
                        : numerics::DTypeName(static_cast<numerics::DType>(copy_dtype));
}

// ---- Against the reference ----

class ReferenceTest : public ::testing::TestWithParam<std::tuple<int, numerics::DType, int>> {
 protected:
  NamedOptimizerConfig named() const { return OptimizerTestConfigs()[std::get<0>(GetParam())]; }
  numerics::DType grad_dtype() const { return std::get<1>(GetParam()); }
  int copy_dtype() const { return std::get<2>(GetParam()); }
};

TEST_P(ReferenceTest, HundredStepsOnSmallPieces) {
  const NamedOptimizerConfig named_config = named();
  PieceSet set(named_config.config, named_config.weight_decay, {0, 1, 7, 63, 64, 1000},
               grad_dtype(), copy_dtype(), 1);
  ThreadPool pool(2);
  const float grad_scale = 0.75f;
  for (int64_t step = 1; step <= 100; ++step) {
    set.NewGradients(false);
    std::vector<UpdatePiece> pieces = set.Pieces();
    ASSERT_TRUE(ApplyUpdateCpu(named_config.config, step, grad_scale, pieces, &pool).ok());
    set.ReferenceStepAll(step, grad_scale);
  }
  set.ExpectMatchesReference(named_config.name);
}

TEST_P(ReferenceTest, FewStepsOnAMillionElements) {
  const NamedOptimizerConfig named_config = named();
  // The large size checks chunking and threading; the small sizes cover every copy dtype.
  if (copy_dtype() != static_cast<int>(numerics::DType::kBFloat16))
    GTEST_SKIP() << "bf16 copies only";
  PieceSet set(named_config.config, named_config.weight_decay, {1000003, 5}, grad_dtype(),
               copy_dtype(), 2);
  ThreadPool pool(2);
  for (int64_t step = 1; step <= 3; ++step) {
    set.NewGradients(false);
    std::vector<UpdatePiece> pieces = set.Pieces();
    ASSERT_TRUE(ApplyUpdateCpu(named_config.config, step, 1.0f / 3.0f, pieces, &pool).ok());
    set.ReferenceStepAll(step, 1.0f / 3.0f);
  }
  set.ExpectMatchesReference(named_config.name);
}

TEST_P(ReferenceTest, ManyPiecesInOneCall) {
  const NamedOptimizerConfig named_config = named();
  std::mt19937 rng(7);
  std::vector<int64_t> lengths;
  for (int k = 0; k < 300; ++k) lengths.push_back(rng() % 200);
  PieceSet set(named_config.config, named_config.weight_decay, lengths, grad_dtype(), copy_dtype(),
               3);
  for (int64_t step = 1; step <= 5; ++step) {
    set.NewGradients(false);
    std::vector<UpdatePiece> pieces = set.Pieces();
    ASSERT_TRUE(ApplyUpdateCpu(named_config.config, step, 2.0f, pieces, nullptr).ok());
    set.ReferenceStepAll(step, 2.0f);
  }
  set.ExpectMatchesReference(named_config.name);
}

// ---- Bitwise equality across thread counts and instruction sets ----

TEST_P(ReferenceTest, BitwiseAcrossThreadsAndInstructionSets) {
  const NamedOptimizerConfig named_config = named();
  const std::vector<int64_t> lengths = {2 * kCpuChunkElements + 37, 1000, 5, 16, 0};
  auto run = [&](int threads, SimdLevel simd) {
    PieceSet set(named_config.config, named_config.weight_decay, lengths, grad_dtype(),
                 copy_dtype(), 4);
    set.AddExtremeMasters();
    std::unique_ptr<ThreadPool> pool;
    if (threads > 1) pool = std::make_unique<ThreadPool>(threads);
    for (int64_t step = 1; step <= 2; ++step) {
      set.NewGradients(true);
      std::vector<UpdatePiece> pieces = set.Pieces();
      EXPECT_TRUE(ApplyUpdateCpu(named_config.config, step, 0.5f, pieces, pool.get(), simd).ok());
    }
    return set.Snapshot();
  };
  const std::vector<unsigned char> expected = run(1, SimdLevel::kScalar);
  int levels_checked = 0;
  for (SimdLevel simd : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!SimdLevelSupported(simd)) continue;
    ++levels_checked;
    for (int threads : {1, 2, 3}) {
      EXPECT_TRUE(run(threads, simd) == expected)
          << named_config.name << " differs on " << SimdLevelName(simd) << " with " << threads
          << " threads";
    }
  }
  EXPECT_GE(levels_checked, 1);
}

INSTANTIATE_TEST_SUITE_P(
    AllOptimizers, ReferenceTest,
    ::testing::Combine(::testing::Range(0, static_cast<int>(OptimizerTestConfigs().size())),
                       ::testing::ValuesIn(kGradDTypes), ::testing::ValuesIn(kCopyDTypes)),
    [](const ::testing::TestParamInfo<ReferenceTest::ParamType>& info) {
      return OptimizerTestConfigs()[std::get<0>(info.param)].name + "_grad_" +
             numerics::DTypeName(std::get<1>(info.param)) + "_copy_" +
             CopyName(std::get<2>(info.param));
    });

// ---- Particular behaviours ----

TEST(CpuOptimizerTest, ThisMachineHasAvx512) {
  // The development machine has AVX-512; elsewhere this only reports what was found.
  std::printf("best SIMD level: %s\n", SimdLevelName(BestSimdLevel()));
  EXPECT_TRUE(SimdLevelSupported(SimdLevel::kScalar));
  EXPECT_NE(BestSimdLevel(), SimdLevel::kAuto);
}

TEST(CpuOptimizerTest, ZeroScaleIsAZeroGradient) {
  for (const NamedOptimizerConfig& named : OptimizerTestConfigs()) {
    PieceSet scaled(named.config, named.weight_decay, {1000, 3}, numerics::DType::kFloat32, -1, 5);
    PieceSet zero(named.config, named.weight_decay, {1000, 3}, numerics::DType::kFloat32, -1, 5);
    for (int64_t step = 1; step <= 3; ++step) {
      scaled.NewGradients(false);
      zero.NewGradients(false);
      std::vector<UpdatePiece> scaled_pieces = scaled.Pieces();
      std::vector<UpdatePiece> zero_pieces = zero.Pieces();
      for (UpdatePiece& piece : zero_pieces) {
        std::memset(const_cast<void*>(piece.grad), 0, piece.length * 4);
      }
      ASSERT_TRUE(ApplyUpdateCpu(named.config, step, 0.0f, scaled_pieces, nullptr).ok());
      ASSERT_TRUE(ApplyUpdateCpu(named.config, step, 1.0f, zero_pieces, nullptr).ok());
    }
    // A scaled gradient is a signed zero, so compare numbers, not bits.
    const std::vector<float> scaled_values = scaled.Values();
    const std::vector<float> zero_values = zero.Values();
    ASSERT_EQ(scaled_values.size(), zero_values.size());
    for (size_t i = 0; i < scaled_values.size(); ++i) {
      ASSERT_TRUE(scaled_values[i] == zero_values[i] ||
                  (std::isnan(scaled_values[i]) && std::isnan(zero_values[i])))
          << named.name << " value " << i << ": " << scaled_values[i] << " vs " << zero_values[i];
    }
  }
}

TEST(CpuOptimizerTest, ZeroScaleLeavesUndecayedAdamParamsUnchanged) {
  std::vector<float> grad = {1.0f, -2.0f, 3.0f, 1e30f};
  std::vector<float> master = {0.5f, -0.25f, 2.0f, 1.0f};
  const std::vector<float> before = master;
  std::vector<float> m(4), v(4);
  UpdatePiece piece;
  piece.grad = grad.data();
  piece.master = master.data();
  piece.state[0] = m.data();
  piece.state[1] = v.data();
  piece.length = 4;
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdam;
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(ApplyUpdateCpu(config, step, 0.0f, {piece}, nullptr).ok());
  }
  EXPECT_EQ(master, before);
  EXPECT_EQ(m, std::vector<float>(4, 0.0f));
  EXPECT_EQ(v, std::vector<float>(4, 0.0f));
}

TEST(CpuOptimizerTest, InvalidCallsWriteNothing) {
  std::vector<float> grad(8, 1.0f), master(8, 1.0f), m(8, 0.0f);
  UpdatePiece piece;
  piece.grad = grad.data();
  piece.master = master.data();
  piece.state[0] = m.data();
  piece.length = 8;
  UpdatePiece missing_state = piece;
  missing_state.state[0] = nullptr;
  OptimizerConfig config;
  config.kind = OptimizerKind::kLion;
  const absl::Status status = ApplyUpdateCpu(config, 1, 1.0f, {piece, missing_state}, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(master, std::vector<float>(8, 1.0f));
  EXPECT_EQ(ApplyUpdateCpu(config, 0, 1.0f, {piece}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuOptimizerTest, SgdWithoutMomentumNeedsNoState) {
  std::vector<float> grad = {1.0f, 2.0f}, master = {1.0f, 1.0f};
  UpdatePiece piece;
  piece.grad = grad.data();
  piece.master = master.data();
  piece.length = 2;
  OptimizerConfig config;
  config.kind = OptimizerKind::kSgd;
  config.lr = 0.5;
  ASSERT_TRUE(ApplyUpdateCpu(config, 1, 1.0f, {piece}, nullptr).ok());
  EXPECT_EQ(master, (std::vector<float>{0.5f, 0.0f}));
}

}  // namespace
}  // namespace zeroshard::kernels

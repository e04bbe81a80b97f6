// Benchmark of the fused CPU optimizer kernels: GB/s of each optimizer against, in the same run
// and on the same instruction set (AVX2 or AVX-512, chosen at run time), a single-pass bandwidth
// baseline with the same reads and writes and trivial arithmetic, and a multi-pass reference
// with the pass structure of torch.optim's foreach implementation (one loop per _foreach_ call).
// Prints one JSON object per line. Run: bazel run -c opt //tests/bench:optimizer_bench
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/cpu_optimizer.h"
#include "kernels/thread_pool.h"
#include "numerics/dtype.h"

ABSL_FLAG(int64_t, params, int64_t{64} << 20, "parameters per update");
ABSL_FLAG(int, reps, 5, "timed repetitions (the median is reported)");
ABSL_FLAG(int, threads, 0, "the 'all threads' count; 0: the machine's hardware threads");
ABSL_FLAG(std::string, isa, "auto",
          "instruction set of the kernel and the baselines: auto (the best this processor has), "
          "avx2 or avx512");
ABSL_FLAG(int64_t, pieces, 1,
          "pieces the parameters are cut into (a model's tensors): each carries its own scalars, "
          "and `grouped` runs them with per-group values (an attached trainer's param_groups)");
ABSL_FLAG(std::string, cases, "all",
          "comma-separated cases to run: sgd, adam, adamw, adagrad, lion, adamw_bf16; or all");

namespace zeroshard::kernels {
namespace {

// ---- Bandwidth baseline and multi-pass reference: one implementation per instruction set ----

// The arrays of the bandwidth baseline. Null state or copy arrays are neither read nor written.
struct BaselineArrays {
  const void* grad;
  numerics::DType grad_dtype;
  float* param;
  float* state0;
  float* state1;
  uint16_t* copy;
};

// The elementwise operations of torch's foreach optimizers, each one pass over whole arrays:
// out[i] = f(a[i], b[i], c[i], scalar), or the bf16 conversions through in16 / out16.
enum class Op {
  kMul,         // a * s: _foreach_mul_(tensors, scalar)
  kAddScaled,   // a + s * b: _foreach_add_(tensors, others, alpha=s)
  kLerp,        // a + s * (b - a): _foreach_lerp_ with weight s < 0.5
  kAddcmul,     // a + s * b * c: _foreach_addcmul_
  kAddcdiv,     // a + s * b / c: _foreach_addcdiv_
  kSqrt,        // sqrt(a): _foreach_sqrt (a new array)
  kDiv,         // a / s: _foreach_div_(tensors, scalar)
  kAdd,         // a + s: _foreach_add_(tensors, scalar)
  kSign,        // sign(a): _foreach_sign_
  kCopy,        // a: clone
  kWidenBf16,   // in16 as fp32: grad.float()
  kNarrowBf16,  // a truncated to bf16 into out16: the bf16 parameter's copy_
};

struct Pass {
  Op op;
  float* out = nullptr;
  const float* a = nullptr;
  const float* b = nullptr;
  const float* c = nullptr;
  float scalar = 0.0f;
  const uint16_t* in16 = nullptr;
  uint16_t* out16 = nullptr;
};

using BaselineRangeFn = void (*)(const BaselineArrays& arrays, int64_t begin, int64_t end);
using PassRangeFn = void (*)(const Pass& pass, int64_t begin, int64_t end);

// Lengths are multiples of 16 (Main rounds --params up), so neither path needs a tail loop.
#define ZS_AVX2 __attribute__((target("avx2")))
#define ZS_AVX512 __attribute__((target("avx512f")))

namespace avx2 {

ZS_AVX2 inline __m256 LoadBf16(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

ZS_AVX2 inline void StoreBf16Truncated(uint16_t* p, __m256 x) {
  const __m256i upper = _mm256_srli_epi32(_mm256_castps_si256(x), 16);
  _mm_storeu_si128(
      reinterpret_cast<__m128i*>(p),
      _mm_packus_epi32(_mm256_castsi256_si128(upper), _mm256_extracti128_si256(upper, 1)));
}

// For each element: g = grad; p += g; state_k += g; copy = upper half of p (bf16 truncation).
ZS_AVX2 void BaselineRange(const BaselineArrays& a, int64_t begin, int64_t end) {
  const bool bf16 = a.grad_dtype == numerics::DType::kBFloat16;
  const float* grad32 = static_cast<const float*>(a.grad);
  const uint16_t* grad16 = static_cast<const uint16_t*>(a.grad);
  for (int64_t i = begin; i + 8 <= end; i += 8) {
    const __m256 g = bf16 ? LoadBf16(grad16 + i) : _mm256_loadu_ps(grad32 + i);
    const __m256 p = _mm256_add_ps(_mm256_loadu_ps(a.param + i), g);
    _mm256_storeu_ps(a.param + i, p);
    if (a.state0) _mm256_storeu_ps(a.state0 + i, _mm256_add_ps(_mm256_loadu_ps(a.state0 + i), g));
    if (a.state1) _mm256_storeu_ps(a.state1 + i, _mm256_add_ps(_mm256_loadu_ps(a.state1 + i), g));
    if (a.copy) StoreBf16Truncated(a.copy + i, p);
  }
}

ZS_AVX2 void PassRange(const Pass& pass, int64_t begin, int64_t end) {
  const __m256 s = _mm256_set1_ps(pass.scalar);
  float* out = pass.out;
  const float* a = pass.a;
  const float* b = pass.b;
  const float* c = pass.c;
  switch (pass.op) {
    case Op::kMul:
      for (int64_t i = begin; i < end; i += 8) {
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), s));
      }
      break;
    case Op::kAddScaled:
      for (int64_t i = begin; i < end; i += 8) {
        const __m256 sb = _mm256_mul_ps(s, _mm256_loadu_ps(b + i));
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), sb));
      }
      break;
    case Op::kLerp:
      for (int64_t i = begin; i < end; i += 8) {
        const __m256 x = _mm256_loadu_ps(a + i);
        const __m256 step = _mm256_mul_ps(s, _mm256_sub_ps(_mm256_loadu_ps(b + i), x));
        _mm256_storeu_ps(out + i, _mm256_add_ps(x, step));
      }
      break;
    case Op::kAddcmul:
      for (int64_t i = begin; i < end; i += 8) {
        const __m256 product = _mm256_mul_ps(_mm256_loadu_ps(b + i), _mm256_loadu_ps(c + i));
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_mul_ps(s, product)));
      }
      break;
    case Op::kAddcdiv:
      for (int64_t i = begin; i < end; i += 8) {
        const __m256 quotient = _mm256_div_ps(_mm256_loadu_ps(b + i), _mm256_loadu_ps(c + i));
        _mm256_storeu_ps(out + i,
                         _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_mul_ps(s, quotient)));
      }
      break;
    case Op::kSqrt:
      for (int64_t i = begin; i < end; i += 8) {
        _mm256_storeu_ps(out + i, _mm256_sqrt_ps(_mm256_loadu_ps(a + i)));
      }
      break;
    case Op::kDiv:
      for (int64_t i = begin; i < end; i += 8) {
        _mm256_storeu_ps(out + i, _mm256_div_ps(_mm256_loadu_ps(a + i), s));
      }
      break;
    case Op::kAdd:
      for (int64_t i = begin; i < end; i += 8) {
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), s));
      }
      break;
    case Op::kSign:
      for (int64_t i = begin; i < end; i += 8) {
        const __m256 x = _mm256_loadu_ps(a + i);
        const __m256 zero = _mm256_setzero_ps();
        const __m256 positive =
            _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_GT_OQ), _mm256_set1_ps(1.0f));
        const __m256 negative =
            _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_LT_OQ), _mm256_set1_ps(-1.0f));
        _mm256_storeu_ps(out + i, _mm256_or_ps(positive, negative));
      }
      break;
    case Op::kCopy:
      for (int64_t i = begin; i < end; i += 8) {
        _mm256_storeu_ps(out + i, _mm256_loadu_ps(a + i));
      }
      break;
    case Op::kWidenBf16:
      for (int64_t i = begin; i < end; i += 8) _mm256_storeu_ps(out + i, LoadBf16(pass.in16 + i));
      break;
    case Op::kNarrowBf16:
      for (int64_t i = begin; i < end; i += 8) {
        StoreBf16Truncated(pass.out16 + i, _mm256_loadu_ps(a + i));
      }
      break;
  }
}

}  // namespace avx2

namespace avx512 {

ZS_AVX512 inline __m512 LoadBf16(const uint16_t* p) {
  const __m512i wide =
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

ZS_AVX512 inline void StoreBf16Truncated(uint16_t* p, __m512 x) {
  const __m512i upper = _mm512_srli_epi32(_mm512_castps_si512(x), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(upper));
}

ZS_AVX512 void BaselineRange(const BaselineArrays& a, int64_t begin, int64_t end) {
  const bool bf16 = a.grad_dtype == numerics::DType::kBFloat16;
  const float* grad32 = static_cast<const float*>(a.grad);
  const uint16_t* grad16 = static_cast<const uint16_t*>(a.grad);
  for (int64_t i = begin; i + 16 <= end; i += 16) {
    const __m512 g = bf16 ? LoadBf16(grad16 + i) : _mm512_loadu_ps(grad32 + i);
    const __m512 p = _mm512_add_ps(_mm512_loadu_ps(a.param + i), g);
    _mm512_storeu_ps(a.param + i, p);
    if (a.state0) _mm512_storeu_ps(a.state0 + i, _mm512_add_ps(_mm512_loadu_ps(a.state0 + i), g));
    if (a.state1) _mm512_storeu_ps(a.state1 + i, _mm512_add_ps(_mm512_loadu_ps(a.state1 + i), g));
    if (a.copy) StoreBf16Truncated(a.copy + i, p);
  }
}

ZS_AVX512 void PassRange(const Pass& pass, int64_t begin, int64_t end) {
  const __m512 s = _mm512_set1_ps(pass.scalar);
  float* out = pass.out;
  const float* a = pass.a;
  const float* b = pass.b;
  const float* c = pass.c;
  switch (pass.op) {
    case Op::kMul:
      for (int64_t i = begin; i < end; i += 16) {
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(a + i), s));
      }
      break;
    case Op::kAddScaled:
      for (int64_t i = begin; i < end; i += 16) {
        const __m512 sb = _mm512_mul_ps(s, _mm512_loadu_ps(b + i));
        _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(a + i), sb));
      }
      break;
    case Op::kLerp:
      for (int64_t i = begin; i < end; i += 16) {
        const __m512 x = _mm512_loadu_ps(a + i);
        const __m512 step = _mm512_mul_ps(s, _mm512_sub_ps(_mm512_loadu_ps(b + i), x));
        _mm512_storeu_ps(out + i, _mm512_add_ps(x, step));
      }
      break;
    case Op::kAddcmul:
      for (int64_t i = begin; i < end; i += 16) {
        const __m512 product = _mm512_mul_ps(_mm512_loadu_ps(b + i), _mm512_loadu_ps(c + i));
        _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_mul_ps(s, product)));
      }
      break;
    case Op::kAddcdiv:
      for (int64_t i = begin; i < end; i += 16) {
        const __m512 quotient = _mm512_div_ps(_mm512_loadu_ps(b + i), _mm512_loadu_ps(c + i));
        _mm512_storeu_ps(out + i,
                         _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_mul_ps(s, quotient)));
      }
      break;
    case Op::kSqrt:
      for (int64_t i = begin; i < end; i += 16) {
        _mm512_storeu_ps(out + i, _mm512_sqrt_ps(_mm512_loadu_ps(a + i)));
      }
      break;
    case Op::kDiv:
      for (int64_t i = begin; i < end; i += 16) {
        _mm512_storeu_ps(out + i, _mm512_div_ps(_mm512_loadu_ps(a + i), s));
      }
      break;
    case Op::kAdd:
      for (int64_t i = begin; i < end; i += 16) {
        _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(a + i), s));
      }
      break;
    case Op::kSign:
      for (int64_t i = begin; i < end; i += 16) {
        const __m512 x = _mm512_loadu_ps(a + i);
        const __m512 zero = _mm512_setzero_ps();
        const __m512 positive = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero, _CMP_GT_OQ), zero,
                                                     _mm512_set1_ps(1.0f));
        _mm512_storeu_ps(out + i, _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ),
                                                       positive, _mm512_set1_ps(-1.0f)));
      }
      break;
    case Op::kCopy:
      for (int64_t i = begin; i < end; i += 16) {
        _mm512_storeu_ps(out + i, _mm512_loadu_ps(a + i));
      }
      break;
    case Op::kWidenBf16:
      for (int64_t i = begin; i < end; i += 16) _mm512_storeu_ps(out + i, LoadBf16(pass.in16 + i));
      break;
    case Op::kNarrowBf16:
      for (int64_t i = begin; i < end; i += 16) {
        StoreBf16Truncated(pass.out16 + i, _mm512_loadu_ps(a + i));
      }
      break;
  }
}

}  // namespace avx512

#undef ZS_AVX2
#undef ZS_AVX512

// ---- The benchmark ----

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// 64-byte aligned, as the engine's allocator and torch's CPU allocator return their buffers.
template <class T>
std::unique_ptr<T[], FreeDeleter> AlignedArray(int64_t n, T value) {
  const size_t bytes = (static_cast<size_t>(n) * sizeof(T) + 63) / 64 * 64;
  T* data = static_cast<T*>(std::aligned_alloc(64, bytes));
  if (data == nullptr) {
    std::fprintf(stderr, "out of memory allocating %zu bytes\n", bytes);
    std::exit(1);
  }
  std::fill_n(data, n, value);
  return std::unique_ptr<T[], FreeDeleter>(data);
}

struct Arrays {
  int64_t n = 0;
  std::unique_ptr<float[], FreeDeleter> grad32, master, s0, s1, tmp_g, tmp_a, tmp_b;
  std::unique_ptr<uint16_t[], FreeDeleter> grad16, copy16;
};

// Runs fn(begin, end) over [0, n) in the kernels' chunks on `pool`.
void ForChunks(ThreadPool& pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t chunks = (n + kCpuChunkElements - 1) / kCpuChunkElements;
  pool.ParallelFor(chunks, [&](int64_t c) {
    const int64_t begin = c * kCpuChunkElements;
    fn(begin, std::min(n, begin + kCpuChunkElements));
  });
}

struct Case {
  const char* label;  // the --cases name
  OptimizerKind kind;
  numerics::DType grad_dtype;
  bool bf16_copy;
};

// The weight decay of the bench's piece (AdamW's and Lion's usual 0.01; none for the others).
double BenchWeightDecay(OptimizerKind kind) {
  return kind == OptimizerKind::kAdamW || kind == OptimizerKind::kLion ? 0.01 : 0.0;
}

OptimizerConfig BenchConfig(OptimizerKind kind) {
  OptimizerConfig config;
  config.kind = kind;
  if (kind == OptimizerKind::kSgd) config.momentum = 0.9;
  if (kind == OptimizerKind::kLion) config.beta2 = 0.99;
  return config;
}

// The passes of one step of torch's foreach implementation of the case's optimizer (torch 2.x,
// torch/optim/*.py `_multi_tensor_*`, not capturable, no amsgrad, no maximize) with the bench's
// hyperparameters: one Pass per _foreach_ call over parameter-sized arrays. Host-side scalar
// work (bias corrections, step counts) is not a pass. Unscaling and clipping are not included:
// torch runs them outside the optimizer's step, so the reference does less work than our kernel.
std::vector<Pass> TorchForeachPasses(const Case& c, Arrays& arrays) {
  float* p = arrays.master.get();
  float* m = arrays.s0.get();
  float* v = arrays.s1.get();
  float* d = arrays.tmp_a.get();  // the intermediate foreach allocates (denom, numerator, ...)
  float* u = arrays.tmp_b.get();
  const float* g = arrays.grad32.get();
  std::vector<Pass> passes;
  if (c.grad_dtype == numerics::DType::kBFloat16) {
    // bf16 gradients meet fp32 master weights: grad.float() first.
    passes.push_back({Op::kWidenBf16, arrays.tmp_g.get()});
    passes.back().in16 = arrays.grad16.get();
    g = arrays.tmp_g.get();
  }
  switch (c.kind) {
    case OptimizerKind::kSgd:
      // _multi_tensor_sgd with momentum: mul_(bufs, momentum); add_(bufs, grads, alpha=1 -
      // dampening); add_(params, bufs, alpha=-lr).
      passes.push_back({Op::kMul, m, m, nullptr, nullptr, 0.9f});
      passes.push_back({Op::kAddScaled, m, m, g, nullptr, 1.0f});
      passes.push_back({Op::kAddScaled, p, p, m, nullptr, -1e-3f});
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      // _multi_tensor_adam(w): [AdamW: mul_(params, 1 - lr * wd)]; lerp_(exp_avgs, grads,
      // 1 - beta1); mul_(exp_avg_sqs, beta2); addcmul_(exp_avg_sqs, grads, grads, 1 - beta2);
      // denom = sqrt(exp_avg_sqs); div_(denom, bias_correction2_sqrt); add_(denom, eps);
      // addcdiv_(params, exp_avgs, denom, -step_size). Adam here has weight_decay 0.
      if (c.kind == OptimizerKind::kAdamW)
        passes.push_back({Op::kMul, p, p, nullptr, nullptr, 0.99999f});
      passes.push_back({Op::kLerp, m, m, g, nullptr, 0.1f});
      passes.push_back({Op::kMul, v, v, nullptr, nullptr, 0.999f});
      passes.push_back({Op::kAddcmul, v, v, g, g, 0.001f});
      passes.push_back({Op::kSqrt, d, v});
      passes.push_back({Op::kDiv, d, d, nullptr, nullptr, 0.0447f});
      passes.push_back({Op::kAdd, d, d, nullptr, nullptr, 1e-8f});
      passes.push_back({Op::kAddcdiv, p, p, m, d, -1e-2f});
      break;
    case OptimizerKind::kAdagrad:
      // _multi_tensor_adagrad: addcmul_(state_sums, grads, grads, 1); std = sqrt(state_sums);
      // add_(std, eps); numerator = mul(grads, -clr); addcdiv_(params, numerator, std).
      passes.push_back({Op::kAddcmul, m, m, g, g, 1.0f});
      passes.push_back({Op::kSqrt, d, m});
      passes.push_back({Op::kAdd, d, d, nullptr, nullptr, 1e-10f});
      passes.push_back({Op::kMul, u, g, nullptr, nullptr, -1e-2f});
      passes.push_back({Op::kAddcdiv, p, p, u, d, 1.0f});
      break;
    case OptimizerKind::kLion:
      // Not in torch.optim; lion-pytorch's foreach step: mul_(params, 1 - lr * wd);
      // update = clone(exp_avgs); lerp_(update, grads, 1 - beta1); sign_(update);
      // add_(params, update, alpha=-lr); lerp_(exp_avgs, grads, 1 - beta2).
      passes.push_back({Op::kMul, p, p, nullptr, nullptr, 0.999999f});
      passes.push_back({Op::kCopy, u, m});
      passes.push_back({Op::kLerp, u, u, g, nullptr, 0.1f});
      passes.push_back({Op::kSign, u, u});
      passes.push_back({Op::kAddScaled, p, p, u, nullptr, -1e-4f});
      passes.push_back({Op::kLerp, m, m, g, nullptr, 0.01f});
      break;
  }
  if (c.bf16_copy) {
    passes.push_back({Op::kNarrowBf16, nullptr, p});
    passes.back().out16 = arrays.copy16.get();
  }
  return passes;
}

double Seconds(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void RunCase(const Case& c, SimdLevel isa, int threads, Arrays& a, int reps) {
  const OptimizerConfig config = BenchConfig(c.kind);
  const int states = StateArraysPerParam(config);
  UpdatePiece piece;
  piece.grad = c.grad_dtype == numerics::DType::kFloat32 ? static_cast<const void*>(a.grad32.get())
                                                         : static_cast<const void*>(a.grad16.get());
  piece.grad_dtype = c.grad_dtype;
  piece.master = a.master.get();
  piece.state[0] = a.s0.get();
  piece.state[1] = a.s1.get();
  if (c.bf16_copy) {
    piece.param_copy = a.copy16.get();
    piece.param_dtype = numerics::DType::kBFloat16;
  }
  piece.length = a.n;
  piece.weight_decay = BenchWeightDecay(c.kind);
  const int64_t bytes_per_param =
      numerics::DTypeSize(c.grad_dtype) + 8 + 8 * states + (c.bf16_copy ? 2 : 0);

  const BaselineRangeFn baseline_range =
      isa == SimdLevel::kAvx512 ? &avx512::BaselineRange : &avx2::BaselineRange;
  const PassRangeFn pass_range = isa == SimdLevel::kAvx512 ? &avx512::PassRange : &avx2::PassRange;
  const BaselineArrays baseline_arrays{piece.grad,
                                       c.grad_dtype,
                                       a.master.get(),
                                       states >= 1 ? a.s0.get() : nullptr,
                                       states >= 2 ? a.s1.get() : nullptr,
                                       c.bf16_copy ? a.copy16.get() : nullptr};
  const std::vector<Pass> passes = TorchForeachPasses(c, a);

  // The same elements cut into pieces; `grouped` points each at group values equal to the
  // configuration's, as an attached trainer's step does (the arithmetic is the same).
  const int64_t num_pieces = std::max<int64_t>(1, std::min(absl::GetFlag(FLAGS_pieces), a.n));
  std::vector<UpdatePiece> pieces;
  for (int64_t k = 0; k < num_pieces; ++k) {
    const int64_t begin = a.n * k / num_pieces;
    const int64_t end = a.n * (k + 1) / num_pieces;
    UpdatePiece part = piece;
    part.grad = static_cast<const char*>(piece.grad) + begin * numerics::DTypeSize(c.grad_dtype);
    part.master = piece.master + begin;
    for (int i = 0; i < states; ++i) part.state[i] = piece.state[i] + begin;
    if (c.bf16_copy) part.param_copy = a.copy16.get() + begin;
    part.length = end - begin;
    pieces.push_back(part);
  }
  GroupHyperparameters group;
  group.lr = config.lr;
  group.weight_decay = piece.weight_decay;
  group.beta1 = config.beta1;
  group.beta2 = config.beta2;
  group.eps = config.eps;
  group.momentum = config.momentum;
  group.dampening = config.dampening;
  std::vector<UpdatePiece> grouped_pieces = pieces;
  for (UpdatePiece& part : grouped_pieces) part.group = &group;

  ThreadPool pool(threads);
  int64_t step = 1;
  auto fused = [&] {
    const absl::Status status = ApplyUpdateCpu(config, step++, 0.5f, pieces, &pool, isa);
    if (!status.ok()) std::fprintf(stderr, "%s\n", status.ToString().c_str());
  };
  auto grouped = [&] {
    const absl::Status status = ApplyUpdateCpu(config, step++, 0.5f, grouped_pieces, &pool, isa);
    if (!status.ok()) std::fprintf(stderr, "%s\n", status.ToString().c_str());
  };
  auto baseline = [&] {
    ForChunks(pool, a.n,
              [&](int64_t begin, int64_t end) { baseline_range(baseline_arrays, begin, end); });
  };
  auto multipass = [&] {
    for (const Pass& pass : passes) {
      ForChunks(pool, a.n, [&](int64_t begin, int64_t end) { pass_range(pass, begin, end); });
    }
  };
  fused();  // step 1 initialises the state
  baseline();
  multipass();
  grouped();
  std::vector<double> fused_s, grouped_s, baseline_s, multipass_s;
  for (int r = 0; r < reps; ++r) {
    fused_s.push_back(Seconds(fused));
    grouped_s.push_back(Seconds(grouped));
    baseline_s.push_back(Seconds(baseline));
    multipass_s.push_back(Seconds(multipass));
  }
  const double bytes = static_cast<double>(bytes_per_param) * a.n;
  const double gbps = bytes / Median(fused_s) / 1e9;
  const double baseline_gbps = bytes / Median(baseline_s) / 1e9;
  const double multipass_gbps = bytes / Median(multipass_s) / 1e9;
  // `simd` (the kernel's instruction set) predates `isa`; both name the same one here.
  std::printf(
      "{\"bench\":\"optimizer\",\"optimizer\":\"%s\",\"grad_dtype\":\"%s\",\"param_dtype\":\"%s\","
      "\"threads\":%d,\"params\":%lld,\"simd\":\"%s\",\"isa\":\"%s\",\"bytes_per_param\":%lld,"
      "\"seconds\":%.5f,\"gbps\":%.2f,\"baseline_gbps\":%.2f,\"ratio\":%.3f,"
      "\"multipass_gbps\":%.2f,\"vs_multipass\":%.2f,\"multipass_passes\":%d,"
      "\"pieces\":%lld,\"grouped_gbps\":%.2f,\"grouped_vs_plain\":%.3f}\n",
      OptimizerKindName(c.kind), numerics::DTypeName(c.grad_dtype), c.bf16_copy ? "bf16" : "none",
      threads, static_cast<long long>(a.n), SimdLevelName(isa), SimdLevelName(isa),
      static_cast<long long>(bytes_per_param), Median(fused_s), gbps, baseline_gbps,
      gbps / baseline_gbps, multipass_gbps, gbps / multipass_gbps, static_cast<int>(passes.size()),
      static_cast<long long>(num_pieces), bytes / Median(grouped_s) / 1e9,
      Median(fused_s) / Median(grouped_s));
  std::fflush(stdout);
}

// The instruction set --isa names, or an error message.
bool ResolveIsa(const std::string& name, SimdLevel* isa, std::string* error) {
  if (name == "auto") {
    if (SimdLevelSupported(SimdLevel::kAvx512)) {
      *isa = SimdLevel::kAvx512;
    } else if (SimdLevelSupported(SimdLevel::kAvx2)) {
      *isa = SimdLevel::kAvx2;
    } else {
      *error = "the baselines need AVX2 or AVX-512; this processor has neither";
      return false;
    }
    return true;
  }
  if (name == "avx2" || name == "avx512") {
    *isa = name == "avx2" ? SimdLevel::kAvx2 : SimdLevel::kAvx512;
    if (!SimdLevelSupported(*isa)) {
      *error = "this processor does not support " + name;
      return false;
    }
    return true;
  }
  *error = "--isa must be auto, avx2 or avx512, not " + name;
  return false;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t n = (absl::GetFlag(FLAGS_params) + 15) / 16 * 16;
  const int reps = std::max(5, absl::GetFlag(FLAGS_reps));
  int all = absl::GetFlag(FLAGS_threads);
  if (all <= 0) all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  SimdLevel isa;
  std::string error;
  if (!ResolveIsa(absl::GetFlag(FLAGS_isa), &isa, &error)) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  const Case all_cases[] = {
      {"sgd", OptimizerKind::kSgd, numerics::DType::kFloat32, false},
      {"adam", OptimizerKind::kAdam, numerics::DType::kFloat32, false},
      {"adamw", OptimizerKind::kAdamW, numerics::DType::kFloat32, false},
      {"adagrad", OptimizerKind::kAdagrad, numerics::DType::kFloat32, false},
      {"lion", OptimizerKind::kLion, numerics::DType::kFloat32, false},
      {"adamw_bf16", OptimizerKind::kAdamW, numerics::DType::kBFloat16, true},
  };
  std::vector<Case> cases;
  const std::string wanted = absl::GetFlag(FLAGS_cases);
  for (absl::string_view label : absl::StrSplit(wanted, ',')) {
    bool found = false;
    for (const Case& c : all_cases) {
      if (label == "all" || label == c.label) {
        cases.push_back(c);
        found = true;
      }
    }
    if (!found) {
      std::vector<std::string> names;
      for (const Case& c : all_cases) names.push_back(c.label);
      std::fprintf(stderr, "unknown case '%s' in --cases (known: all, %s)\n",
                   std::string(label).c_str(), absl::StrJoin(names, ", ").c_str());
      return 1;
    }
  }

  Arrays a;
  a.n = n;
  a.grad32 = AlignedArray<float>(n, 0.0f);
  a.grad16 = AlignedArray<uint16_t>(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    const float x = static_cast<float>((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
    a.grad32[i] = x;
    a.grad16[i] = numerics::FloatToBFloat16(x);
  }
  a.master = AlignedArray<float>(n, 0.5f);
  a.s0 = AlignedArray<float>(n, 0.0f);
  a.s1 = AlignedArray<float>(n, 0.0f);
  a.tmp_g = AlignedArray<float>(n, 0.0f);
  a.tmp_a = AlignedArray<float>(n, 0.0f);
  a.tmp_b = AlignedArray<float>(n, 0.0f);
  a.copy16 = AlignedArray<uint16_t>(n, 0);
  std::vector<int> thread_counts = {1};
  if (all > 1) thread_counts.push_back(all);
  for (const Case& c : cases) {
    for (int threads : thread_counts) RunCase(c, isa, threads, a, reps);
  }
  return 0;
}

}  // namespace
}  // namespace zeroshard::kernels

int main(int argc, char** argv) { return zeroshard::kernels::Main(argc, argv); }

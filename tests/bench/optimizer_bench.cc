// Benchmark of the fused CPU optimizer kernels: GB/s of each optimizer against, in the same run,
// a single-pass bandwidth baseline with the same reads and writes and trivial arithmetic, and a
// multi-pass implementation (one loop per arithmetic operation, as an unfused framework runs).
// Prints one JSON object per line. Run: bazel run -c opt //kernels:optimizer_bench
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "kernels/cpu_optimizer.h"
#include "kernels/dtype.h"
#include "kernels/thread_pool.h"

ABSL_FLAG(int64_t, params, int64_t{64} << 20, "parameters per update");
ABSL_FLAG(int, reps, 5, "timed repetitions (the median is reported)");
ABSL_FLAG(int, threads, 0, "the 'all threads' count; 0: the machine's hardware threads");

namespace zeroshard::kernels {
namespace {

#define ZS_BENCH_TARGET __attribute__((target("avx512f,avx512bw")))

// Runs fn(begin, end) over [0, n) in the kernels' chunks on `pool`.
void ForChunks(ThreadPool& pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t chunks = (n + kCpuChunkElements - 1) / kCpuChunkElements;
  pool.ParallelFor(chunks, [&](int64_t c) {
    const int64_t begin = c * kCpuChunkElements;
    fn(begin, std::min(n, begin + kCpuChunkElements));
  });
}

// ---- Bandwidth baseline: one vectorised pass, same arrays, trivial arithmetic ----

ZS_BENCH_TARGET __m512 LoadGrad(const void* grad, DType dtype, int64_t i) {
  if (dtype == DType::kFloat32) return _mm512_loadu_ps(static_cast<const float*>(grad) + i);
  const __m256i h =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(grad) + i));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// For each element: g = grad; p += g; state_k += g; copy = upper half of p (bf16 truncation).
ZS_BENCH_TARGET void BaselineRange(const void* grad, DType grad_dtype, float* p, float* s0,
                                   float* s1, uint16_t* copy, int64_t begin, int64_t end) {
  for (int64_t i = begin; i + 16 <= end; i += 16) {
    const __m512 g = LoadGrad(grad, grad_dtype, i);
    const __m512 np = _mm512_add_ps(_mm512_loadu_ps(p + i), g);
    _mm512_storeu_ps(p + i, np);
    if (s0) _mm512_storeu_ps(s0 + i, _mm512_add_ps(_mm512_loadu_ps(s0 + i), g));
    if (s1) _mm512_storeu_ps(s1 + i, _mm512_add_ps(_mm512_loadu_ps(s1 + i), g));
    if (copy) {
      const __m512i upper = _mm512_srli_epi32(_mm512_castps_si512(np), 16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(copy + i), _mm512_cvtepi32_epi16(upper));
    }
  }
}

// ---- Multi-pass: each arithmetic operation is its own vectorised loop over the arrays ----

enum class Op { kMul, kAdd, kDiv, kMulScalar, kAddScalar, kSqrt, kMax, kSign, kWidenBf16, kBf16 };

ZS_BENCH_TARGET void PassRange(Op op, float* out, const float* a, const void* b, float scalar,
                               int64_t begin, int64_t end) {
  const __m512 s = _mm512_set1_ps(scalar);
  const float* bf = static_cast<const float*>(b);
  for (int64_t i = begin; i + 16 <= end; i += 16) {
    if (op == Op::kWidenBf16) {
      _mm512_storeu_ps(out + i, LoadGrad(b, DType::kBFloat16, i));
      continue;
    }
    const __m512 x = _mm512_loadu_ps(a + i);
    __m512 r;
    switch (op) {
      case Op::kMul:
        r = _mm512_mul_ps(x, _mm512_loadu_ps(bf + i));
        break;
      case Op::kAdd:
        r = _mm512_add_ps(x, _mm512_loadu_ps(bf + i));
        break;
      case Op::kDiv:
        r = _mm512_div_ps(x, _mm512_loadu_ps(bf + i));
        break;
      case Op::kMax:
        r = _mm512_max_ps(x, _mm512_loadu_ps(bf + i));
        break;
      case Op::kMulScalar:
        r = _mm512_mul_ps(x, s);
        break;
      case Op::kAddScalar:
        r = _mm512_add_ps(x, s);
        break;
      case Op::kSqrt:
        r = _mm512_sqrt_ps(x);
        break;
      case Op::kSign: {
        const __m512 zero = _mm512_setzero_ps();
        r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero, _CMP_GT_OQ), zero,
                                 _mm512_set1_ps(1.0f));
        r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), r, _mm512_set1_ps(-1.0f));
        break;
      }
      case Op::kBf16: {
        const __m512i upper = _mm512_srli_epi32(_mm512_castps_si512(x), 16);
        _mm256_storeu_si256(
            reinterpret_cast<__m256i*>(static_cast<uint16_t*>(const_cast<void*>(b)) + i),
            _mm512_cvtepi32_epi16(upper));
        continue;
      }
      default:
        r = x;
        break;
    }
    _mm512_storeu_ps(out + i, r);
  }
}

struct Arrays {
  int64_t n;
  std::vector<float> grad32, master, s0, s1, tmp_g, tmp_a, tmp_b;
  std::vector<uint16_t> grad16, copy16;
};

class MultiPass {
 public:
  MultiPass(ThreadPool& pool, int64_t n) : pool_(pool), n_(n) {}
  void Run(Op op, float* out, const float* a, const void* b, float scalar = 0.0f) {
    ForChunks(pool_, n_,
              [&](int64_t begin, int64_t end) { PassRange(op, out, a, b, scalar, begin, end); });
  }

 private:
  ThreadPool& pool_;
  int64_t n_;
};

// The unfused step of each optimizer (the same operations the fused kernel does, one per pass).
void RunMultiPass(OptimizerKind kind, DType grad_dtype, bool copy, Arrays& a, ThreadPool& pool) {
  MultiPass mp(pool, a.n);
  float* p = a.master.data();
  float* m = a.s0.data();
  float* v = a.s1.data();
  float* g = a.tmp_g.data();
  float* t = a.tmp_a.data();
  float* u = a.tmp_b.data();
  // The unscale by 1 / (W * loss_scale) and the clip coefficient are two passes in an unfused
  // framework (the fused kernel's grad_scale is their product).
  if (grad_dtype == DType::kBFloat16) {
    mp.Run(Op::kWidenBf16, g, nullptr, a.grad16.data());
    mp.Run(Op::kMulScalar, g, g, nullptr, 0.5f);
  } else {
    mp.Run(Op::kMulScalar, g, a.grad32.data(), nullptr, 0.5f);
  }
  mp.Run(Op::kMulScalar, g, g, nullptr, 0.75f);
  switch (kind) {
    case OptimizerKind::kSgd:  // momentum: buf = buf*mu + (1-d) g; p += -lr buf
      mp.Run(Op::kMulScalar, m, m, nullptr, 0.9f);
      mp.Run(Op::kMulScalar, t, g, nullptr, 1.0f);
      mp.Run(Op::kAdd, m, m, t);
      mp.Run(Op::kMulScalar, t, m, nullptr, -1e-3f);
      mp.Run(Op::kAdd, p, p, t);
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      if (kind == OptimizerKind::kAdamW) {
        mp.Run(Op::kMulScalar, p, p, nullptr, 0.99999f);
      } else {
        mp.Run(Op::kMulScalar, t, p, nullptr, 1e-2f);
        mp.Run(Op::kAdd, g, g, t);
      }
      mp.Run(Op::kMulScalar, m, m, nullptr, 0.9f);
      mp.Run(Op::kMulScalar, t, g, nullptr, 0.1f);
      mp.Run(Op::kAdd, m, m, t);
      mp.Run(Op::kMulScalar, v, v, nullptr, 0.999f);
      mp.Run(Op::kMulScalar, t, g, nullptr, 0.001f);
      mp.Run(Op::kMul, t, t, g);
      mp.Run(Op::kAdd, v, v, t);
      mp.Run(Op::kSqrt, t, v, nullptr);
      mp.Run(Op::kMulScalar, t, t, nullptr, 1.5f);
      mp.Run(Op::kAddScalar, t, t, nullptr, 1e-8f);
      mp.Run(Op::kMulScalar, u, m, nullptr, -1e-3f);
      mp.Run(Op::kDiv, u, u, t);
      mp.Run(Op::kAdd, p, p, u);
      break;
    case OptimizerKind::kAdagrad:
      mp.Run(Op::kMul, t, g, g);
      mp.Run(Op::kAdd, m, m, t);
      mp.Run(Op::kSqrt, t, m, nullptr);
      mp.Run(Op::kAddScalar, t, t, nullptr, 1e-10f);
      mp.Run(Op::kMulScalar, u, g, nullptr, -1e-2f);
      mp.Run(Op::kDiv, u, u, t);
      mp.Run(Op::kAdd, p, p, u);
      break;
    case OptimizerKind::kLion:
      mp.Run(Op::kMulScalar, t, m, nullptr, 0.9f);
      mp.Run(Op::kMulScalar, u, g, nullptr, 0.1f);
      mp.Run(Op::kAdd, t, t, u);
      mp.Run(Op::kSign, t, t, nullptr);
      mp.Run(Op::kMulScalar, u, p, nullptr, 0.1f);
      mp.Run(Op::kAdd, t, t, u);
      mp.Run(Op::kMulScalar, t, t, nullptr, -1e-4f);
      mp.Run(Op::kAdd, p, p, t);
      mp.Run(Op::kMulScalar, m, m, nullptr, 0.99f);
      mp.Run(Op::kMulScalar, u, g, nullptr, 0.01f);
      mp.Run(Op::kAdd, m, m, u);
      break;
  }
  if (copy) mp.Run(Op::kBf16, nullptr, p, a.copy16.data());
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

struct Case {
  OptimizerKind kind;
  DType grad_dtype;
  bool bf16_copy;
};

void RunCase(const Case& c, int threads, Arrays& a, int reps) {
  OptimizerConfig config;
  config.kind = c.kind;
  if (c.kind == OptimizerKind::kSgd) config.momentum = 0.9;
  if (c.kind == OptimizerKind::kLion) config.beta2 = 0.99;
  const int states = StateArraysPerParam(config);
  UpdatePiece piece;
  piece.grad = c.grad_dtype == DType::kFloat32 ? static_cast<const void*>(a.grad32.data())
                                               : static_cast<const void*>(a.grad16.data());
  piece.grad_dtype = c.grad_dtype;
  piece.master = a.master.data();
  piece.state[0] = a.s0.data();
  piece.state[1] = a.s1.data();
  if (c.bf16_copy) {
    piece.param_copy = a.copy16.data();
    piece.param_dtype = DType::kBFloat16;
  }
  piece.length = a.n;
  piece.weight_decay =
      c.kind == OptimizerKind::kAdamW || c.kind == OptimizerKind::kLion ? 0.01 : 0.0;
  const int64_t bytes_per_param = DTypeSize(c.grad_dtype) + 8 + 8 * states + (c.bf16_copy ? 2 : 0);

  ThreadPool pool(threads);
  int64_t step = 1;
  auto fused = [&] {
    const absl::Status status = ApplyUpdateCpu(config, step++, 0.5f, {piece}, &pool);
    if (!status.ok()) std::fprintf(stderr, "%s\n", status.ToString().c_str());
  };
  auto baseline = [&] {
    float* s0 = states >= 1 ? a.s0.data() : nullptr;
    float* s1 = states >= 2 ? a.s1.data() : nullptr;
    uint16_t* copy = c.bf16_copy ? a.copy16.data() : nullptr;
    ForChunks(pool, a.n, [&](int64_t begin, int64_t end) {
      BaselineRange(piece.grad, c.grad_dtype, a.master.data(), s0, s1, copy, begin, end);
    });
  };
  auto multipass = [&] { RunMultiPass(c.kind, c.grad_dtype, c.bf16_copy, a, pool); };
  fused();  // step 1 initialises the state
  baseline();
  std::vector<double> fused_s, baseline_s, multipass_s;
  for (int r = 0; r < reps; ++r) {
    fused_s.push_back(Seconds(fused));
    baseline_s.push_back(Seconds(baseline));
    multipass_s.push_back(Seconds(multipass));
  }
  const double bytes = static_cast<double>(bytes_per_param) * a.n;
  const double gbps = bytes / Median(fused_s) / 1e9;
  const double baseline_gbps = bytes / Median(baseline_s) / 1e9;
  const double multipass_gbps = bytes / Median(multipass_s) / 1e9;
  std::printf(
      "{\"bench\":\"optimizer\",\"optimizer\":\"%s\",\"grad_dtype\":\"%s\",\"param_dtype\":\"%s\","
      "\"threads\":%d,\"params\":%lld,\"simd\":\"%s\",\"bytes_per_param\":%lld,"
      "\"seconds\":%.5f,\"gbps\":%.2f,\"baseline_gbps\":%.2f,\"ratio\":%.3f,"
      "\"multipass_gbps\":%.2f,\"vs_multipass\":%.2f}\n",
      OptimizerKindName(c.kind), DTypeName(c.grad_dtype), c.bf16_copy ? "bf16" : "none", threads,
      static_cast<long long>(a.n), SimdLevelName(BestSimdLevel()),
      static_cast<long long>(bytes_per_param), Median(fused_s), gbps, baseline_gbps,
      gbps / baseline_gbps, multipass_gbps, gbps / multipass_gbps);
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t n = (absl::GetFlag(FLAGS_params) + 15) / 16 * 16;
  const int reps = std::max(5, absl::GetFlag(FLAGS_reps));
  int all = absl::GetFlag(FLAGS_threads);
  if (all <= 0) all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) {
    std::fprintf(stderr, "the baselines need AVX-512 (avx512f, avx512bw)\n");
    return 1;
  }
  Arrays a;
  a.n = n;
  a.grad32.assign(n, 0.0f);
  a.grad16.assign(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    const float x = static_cast<float>((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
    a.grad32[i] = x;
    a.grad16[i] = FloatToBFloat16(x);
  }
  a.master.assign(n, 0.5f);
  a.s0.assign(n, 0.0f);
  a.s1.assign(n, 0.0f);
  a.tmp_g.assign(n, 0.0f);
  a.tmp_a.assign(n, 0.0f);
  a.tmp_b.assign(n, 0.0f);
  a.copy16.assign(n, 0);
  const Case cases[] = {
      {OptimizerKind::kSgd, DType::kFloat32, false},
      {OptimizerKind::kAdam, DType::kFloat32, false},
      {OptimizerKind::kAdamW, DType::kFloat32, false},
      {OptimizerKind::kAdagrad, DType::kFloat32, false},
      {OptimizerKind::kLion, DType::kFloat32, false},
      {OptimizerKind::kAdamW, DType::kBFloat16, true},
  };
  std::vector<int> thread_counts = {1};
  if (all > 1) thread_counts.push_back(all);
  for (const Case& c : cases) {
    for (int threads : thread_counts) RunCase(c, threads, a, reps);
  }
  return 0;
}

}  // namespace
}  // namespace zeroshard::kernels

int main(int argc, char** argv) { return zeroshard::kernels::Main(argc, argv); }

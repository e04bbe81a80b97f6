// GPU checks of the CUDA optimizer kernels against the CPU kernels (which the unit tests check
// against torch.optim's algorithms): every optimizer, gradient dtype and parameter-copy dtype,
// aligned and unaligned pieces, gradient statistics, non-finite detection, and AdamW's
// bandwidth against a device-to-device copy. Prints one line per check; exits 0 when all pass,
// 1 when one fails, 2 when there is no CUDA device. See tests/gpu/README.md.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu_optimizer.h"
#include "kernels/cuda_optimizer.h"
#include "kernels/optimizer.h"
#include "kernels/optimizer_test_configs.h"
#include "kernels/thread_pool.h"
#include "numerics/dtype.h"

namespace zeroshard::kernels {
namespace {

// CPU and GPU run the same element code (kernels/update_math.h) with IEEE division and square
// root and no fused multiply-adds, so they are expected to agree bit for bit; the pass criterion
// is the unit tests' tolerance: |gpu - cpu| <= 1e-6 * max(|cpu|, 1e-3).
constexpr double kRelTol = 1e-6;
constexpr double kAbsFloor = 1e-3;
// GPU and CPU sum squares in different (each fixed) orders.
constexpr double kSumRelTol = 1e-12;

int g_failures = 0;

void Report(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failures;
}

void CheckCuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    std::printf("FAIL %s: %s\n", what, cudaGetErrorString(error));
    std::exit(1);
  }
}

// A device allocation of `bytes` bytes, freed on destruction. Not thread-safe.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    CheckCuda(cudaMalloc(&data_, bytes == 0 ? 1 : bytes), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* data() const { return static_cast<unsigned char*>(data_); }
  void Upload(const void* host) {
    CheckCuda(cudaMemcpy(data_, host, bytes_, cudaMemcpyHostToDevice), "upload");
  }
  void Download(void* host) const {
    CheckCuda(cudaMemcpy(host, data_, bytes_, cudaMemcpyDeviceToHost), "download");
  }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

// One piece on the host and on the device: arrays of `offset + length` elements, the piece
// starting `offset` elements in (so offsets 1..3 exercise the unaligned path).
struct MirroredPiece {
  int64_t offset;
  int64_t length;
  int grad_size;
  int copy_size;
  std::vector<unsigned char> grad, copy;
  std::vector<float> master, state[kMaxStateArrays];
  std::unique_ptr<DeviceBuffer> d_grad, d_master, d_state[kMaxStateArrays], d_copy;
};

bool Close(float gpu, float cpu) {
  if (std::isnan(gpu) || std::isnan(cpu)) return std::isnan(gpu) && std::isnan(cpu);
  return std::fabs(static_cast<double>(gpu) - cpu) <=
         kRelTol * std::max(std::fabs(static_cast<double>(cpu)), kAbsFloor);
}

void CheckUpdate(CudaOptimizerKernels& gpu, ThreadPool& pool, const NamedOptimizerConfig& named,
                 numerics::DType grad_dtype, int copy_dtype, const std::vector<int64_t>& lengths) {
  const int states = StateArraysPerParam(named.config);
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<MirroredPiece> pieces(lengths.size());
  for (size_t k = 0; k < lengths.size(); ++k) {
    MirroredPiece& p = pieces[k];
    p.offset = static_cast<int64_t>(k % 4);
    p.length = lengths[k];
    p.grad_size = numerics::DTypeSize(grad_dtype);
    p.copy_size =
        copy_dtype < 0 ? 4 : numerics::DTypeSize(static_cast<numerics::DType>(copy_dtype));
    const int64_t n = p.offset + p.length;
    p.grad.assign(n * p.grad_size, 0);
    p.copy.assign(n * p.copy_size, 0);
    p.master.resize(n);
    for (float& x : p.master) x = uniform(rng);
    p.d_grad = std::make_unique<DeviceBuffer>(p.grad.size());
    p.d_master = std::make_unique<DeviceBuffer>(n * 4);
    p.d_master->Upload(p.master.data());
    p.d_copy = std::make_unique<DeviceBuffer>(p.copy.size());
    p.d_copy->Upload(p.copy.data());
    for (int s = 0; s < states; ++s) {
      p.state[s].assign(n, 0.0f);
      p.d_state[s] = std::make_unique<DeviceBuffer>(n * 4);
      p.d_state[s]->Upload(p.state[s].data());
    }
  }
  auto make_pieces = [&](bool device) {
    std::vector<UpdatePiece> out;
    for (size_t k = 0; k < pieces.size(); ++k) {
      MirroredPiece& p = pieces[k];
      UpdatePiece u;
      u.grad = (device ? p.d_grad->data() : p.grad.data()) + p.offset * p.grad_size;
      u.grad_dtype = grad_dtype;
      u.master =
          reinterpret_cast<float*>(device ? p.d_master->data()
                                          : reinterpret_cast<unsigned char*>(p.master.data())) +
          p.offset;
      for (int s = 0; s < states; ++s) {
        u.state[s] =
            reinterpret_cast<float*>(device ? p.d_state[s]->data()
                                            : reinterpret_cast<unsigned char*>(p.state[s].data())) +
            p.offset;
      }
      if (copy_dtype >= 0) {
        u.param_dtype = static_cast<numerics::DType>(copy_dtype);
        u.param_copy = (device ? p.d_copy->data() : p.copy.data()) + p.offset * p.copy_size;
      }
      u.length = p.length;
      u.weight_decay = k % 2 == 0 ? named.weight_decay : 0.0;
      u.lr_scale = k % 3 == 0 ? 1.0 : 0.5;
      out.push_back(u);
    }
    return out;
  };
  const std::vector<UpdatePiece> host_pieces = make_pieces(false);
  const std::vector<UpdatePiece> device_pieces = make_pieces(true);
  for (int64_t step = 1; step <= 3; ++step) {
    for (MirroredPiece& p : pieces) {
      for (int64_t i = 0; i < p.length; ++i) {
        const float x = uniform(rng);
        unsigned char* at = p.grad.data() + (p.offset + i) * p.grad_size;
        if (grad_dtype == numerics::DType::kFloat32) {
          std::memcpy(at, &x, 4);
        } else {
          const uint16_t h = grad_dtype == numerics::DType::kBFloat16 ? numerics::FloatToBFloat16(x)
                                                                      : numerics::FloatToHalf(x);
          std::memcpy(at, &h, 2);
        }
      }
      p.d_grad->Upload(p.grad.data());
    }
    const absl::Status cpu_status = ApplyUpdateCpu(named.config, step, 0.5f, host_pieces, &pool);
    const absl::Status gpu_status = gpu.ApplyUpdate(named.config, step, 0.5f, device_pieces);
    if (!cpu_status.ok() || !gpu_status.ok()) {
      Report(false, named.name + ": " + cpu_status.ToString() + " / " + gpu_status.ToString());
      return;
    }
  }
  CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  int64_t compared = 0, bitwise_equal = 0, outside_tolerance = 0;
  auto compare = [&](const float* gpu_values, const float* cpu_values, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      ++compared;
      if (std::memcmp(&gpu_values[i], &cpu_values[i], 4) == 0) ++bitwise_equal;
      if (!Close(gpu_values[i], cpu_values[i])) ++outside_tolerance;
    }
  };
  bool copies_equal = true;
  for (MirroredPiece& p : pieces) {
    const int64_t n = p.offset + p.length;
    std::vector<float> gpu_values(n);
    p.d_master->Download(gpu_values.data());
    compare(gpu_values.data() + p.offset, p.master.data() + p.offset, p.length);
    for (int s = 0; s < states; ++s) {
      p.d_state[s]->Download(gpu_values.data());
      compare(gpu_values.data() + p.offset, p.state[s].data() + p.offset, p.length);
    }
    if (copy_dtype >= 0) {
      std::vector<unsigned char> gpu_copy(p.copy.size());
      p.d_copy->Download(gpu_copy.data());
      copies_equal = copies_equal && gpu_copy == p.copy;
    }
  }
  char line[512];
  std::snprintf(
      line, sizeof(line),
      "update %s grad=%s copy=%s: %lld values, %lld bitwise equal, %lld outside "
      "tolerance, param copies %s",
      named.name.c_str(), numerics::DTypeName(grad_dtype),
      copy_dtype < 0 ? "none" : numerics::DTypeName(static_cast<numerics::DType>(copy_dtype)),
      static_cast<long long>(compared), static_cast<long long>(bitwise_equal),
      static_cast<long long>(outside_tolerance), copies_equal ? "bitwise equal" : "DIFFER");
  // A copy is the master rounded once; with masters within tolerance it may differ only where
  // the masters differ, so copies must be equal whenever the masters are bitwise equal.
  Report(outside_tolerance == 0 && (copies_equal || bitwise_equal != compared), line);
}

void CheckGradStats(CudaOptimizerKernels& gpu, ThreadPool& pool, numerics::DType dtype) {
  const std::vector<int64_t> lengths = {0, 1, 17, 1000, 3 * 16384 + 5, 1000003};
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  const int size = numerics::DTypeSize(dtype);
  std::vector<std::vector<unsigned char>> host(lengths.size());
  std::vector<std::unique_ptr<DeviceBuffer>> device;
  std::vector<GradPiece> host_pieces, device_pieces;
  for (size_t k = 0; k < lengths.size(); ++k) {
    const int64_t offset = k % 4;
    host[k].assign((offset + lengths[k]) * size, 0);
    for (int64_t i = 0; i < lengths[k]; ++i) {
      const float x = uniform(rng);
      unsigned char* at = host[k].data() + (offset + i) * size;
      if (dtype == numerics::DType::kFloat32) {
        std::memcpy(at, &x, 4);
      } else {
        const uint16_t h = dtype == numerics::DType::kBFloat16 ? numerics::FloatToBFloat16(x)
                                                               : numerics::FloatToHalf(x);
        std::memcpy(at, &h, 2);
      }
    }
    device.push_back(std::make_unique<DeviceBuffer>(host[k].size()));
    device.back()->Upload(host[k].data());
    host_pieces.push_back(GradPiece{host[k].data() + offset * size, dtype, lengths[k]});
    device_pieces.push_back(GradPiece{device.back()->data() + offset * size, dtype, lengths[k]});
  }
  const absl::StatusOr<GradStats> cpu = ComputeGradStatsCpu(host_pieces, &pool);
  const absl::StatusOr<GradStats> first = gpu.ComputeGradStats(device_pieces);
  const absl::StatusOr<GradStats> second = gpu.ComputeGradStats(device_pieces);
  if (!cpu.ok() || !first.ok() || !second.ok()) {
    Report(false, std::string("grad stats ") + numerics::DTypeName(dtype) + ": a call failed");
    return;
  }
  const double rel = std::fabs(first->sum_squares - cpu->sum_squares) / cpu->sum_squares;
  Report(rel <= kSumRelTol && !first->non_finite,
         std::string("grad stats ") + numerics::DTypeName(dtype) + " sum matches the CPU (rel " +
             std::to_string(rel) + ")");
  Report(std::memcmp(&first->sum_squares, &second->sum_squares, 8) == 0,
         std::string("grad stats ") + numerics::DTypeName(dtype) + " repeatable bit for bit");
  DeviceBuffer device_sum(sizeof(double));
  double enqueued = 0.0;
  const absl::Status enqueue_status =
      gpu.EnqueueSumSquares(device_pieces, reinterpret_cast<double*>(device_sum.data()));
  CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  device_sum.Download(&enqueued);
  Report(enqueue_status.ok() && std::memcmp(&enqueued, &first->sum_squares, 8) == 0,
         std::string("grad stats ") + numerics::DTypeName(dtype) +
             " EnqueueSumSquares gives the same bits");
  // Non-finite values at the start, a tile boundary and the end of the large piece.
  const size_t big = lengths.size() - 1;
  const int64_t offset = big % 4;
  int detected = 0, tried = 0;
  for (float special :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()}) {
    for (int64_t pos : {int64_t{0}, int64_t{16383}, int64_t{16384}, lengths[big] - 1}) {
      std::vector<unsigned char> poisoned = host[big];
      unsigned char* at = poisoned.data() + (offset + pos) * size;
      if (dtype == numerics::DType::kFloat32) {
        std::memcpy(at, &special, 4);
      } else {
        const uint16_t h = dtype == numerics::DType::kBFloat16 ? numerics::FloatToBFloat16(special)
                                                               : numerics::FloatToHalf(special);
        std::memcpy(at, &h, 2);
      }
      device[big]->Upload(poisoned.data());
      const absl::StatusOr<GradStats> stats = gpu.ComputeGradStats(device_pieces);
      ++tried;
      if (stats.ok() && stats->non_finite) ++detected;
    }
  }
  device[big]->Upload(host[big].data());
  Report(detected == tried, std::string("grad stats ") + numerics::DTypeName(dtype) +
                                " non-finite " + std::to_string(detected) + "/" +
                                std::to_string(tried));
}

void CheckInvalid(CudaOptimizerKernels& gpu) {
  UpdatePiece piece;
  piece.length = 4;  // null arrays
  OptimizerConfig config;
  Report(gpu.ApplyUpdate(config, 1, 1.0f, {piece}).code() == absl::StatusCode::kInvalidArgument,
         "invalid piece is refused");
  Report(gpu.ApplyUpdate(config, 1, 1.0f, {}).ok(), "no pieces is a no-op");
}

// The tables a fresh instance holds: none before its first launch, some after (the worker reports
// them), kept rather than regrown by a launch of the same shape.
void CheckTableBytes() {
  absl::StatusOr<std::unique_ptr<CudaOptimizerKernels>> gpu = CudaOptimizerKernels::Create(nullptr);
  Report(gpu.ok(), "a second instance");
  if (!gpu.ok()) return;
  Report((*gpu)->TableBytes() == 0, "no tables before the first launch");
  const int64_t n = 4096;
  DeviceBuffer grad(n * 4), master(n * 4), m(n * 4), v(n * 4);
  CheckCuda(cudaMemset(grad.data(), 0, n * 4), "memset");
  CheckCuda(cudaMemset(master.data(), 0, n * 4), "memset");
  CheckCuda(cudaMemset(m.data(), 0, n * 4), "memset");
  CheckCuda(cudaMemset(v.data(), 0, n * 4), "memset");
  UpdatePiece piece;
  piece.grad = grad.data();
  piece.master = reinterpret_cast<float*>(master.data());
  piece.state[0] = reinterpret_cast<float*>(m.data());
  piece.state[1] = reinterpret_cast<float*>(v.data());
  piece.length = n;
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdamW;
  Report((*gpu)->ApplyUpdate(config, 1, 1.0f, {piece}).ok(), "update for the tables");
  Report((*gpu)->ApplyUpdate(config, 2, 1.0f, {piece}).ok(), "update for the tables");
  const int64_t held = (*gpu)->TableBytes();
  Report(held > 0, "tables are counted after a launch: " + std::to_string(held));
  Report((*gpu)->ApplyUpdate(config, 3, 1.0f, {piece}).ok(), "update for the tables");
  Report((*gpu)->TableBytes() == held, "tables are kept, not regrown");
  CheckCuda(cudaDeviceSynchronize(), "synchronize");
}

// AdamW fp32 (28 bytes per parameter) against cudaMemcpy device-to-device (2 bytes per byte).
void MeasureBandwidth(CudaOptimizerKernels& gpu) {
  const int64_t n = int64_t{64} << 20;
  DeviceBuffer grad(n * 4), master(n * 4), m(n * 4), v(n * 4), src(n * 16), dst(n * 16);
  CheckCuda(cudaMemset(grad.data(), 0, n * 4), "memset");
  CheckCuda(cudaMemset(master.data(), 0, n * 4), "memset");
  UpdatePiece piece;
  piece.grad = grad.data();
  piece.master = reinterpret_cast<float*>(master.data());
  piece.state[0] = reinterpret_cast<float*>(m.data());
  piece.state[1] = reinterpret_cast<float*>(v.data());
  piece.length = n;
  piece.weight_decay = 0.01;
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdamW;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  auto time = [&](auto&& fn) {
    std::vector<float> ms;
    for (int r = 0; r < 7; ++r) {
      cudaEventRecord(start);
      fn(r);
      cudaEventRecord(stop);
      cudaEventSynchronize(stop);
      float t = 0;
      cudaEventElapsedTime(&t, start, stop);
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2] / 1e3;
  };
  const double adamw_s = time([&](int r) {
    if (!gpu.ApplyUpdate(config, r + 1, 1.0f, {piece}).ok()) ++g_failures;
  });
  const double copy_s =
      time([&](int) { cudaMemcpyAsync(dst.data(), src.data(), n * 16, cudaMemcpyDeviceToDevice); });
  const double adamw_gbps = 28.0 * n / adamw_s / 1e9;
  const double copy_gbps = 2.0 * 16 * n / copy_s / 1e9;
  std::printf(
      "{\"bench\":\"optimizer_gpu\",\"optimizer\":\"adamw\",\"grad_dtype\":\"fp32\","
      "\"params\":%lld,\"gbps\":%.1f,\"copy_gbps\":%.1f,\"ratio\":%.3f,\"target\":0.85}\n",
      static_cast<long long>(n), adamw_gbps, copy_gbps, adamw_gbps / copy_gbps);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

int Main() {
  absl::StatusOr<std::unique_ptr<CudaOptimizerKernels>> gpu = CudaOptimizerKernels::Create(nullptr);
  if (!gpu.ok()) {
    std::printf("SKIP no CUDA device: %s\n", gpu.status().ToString().c_str());
    return 2;
  }
  ThreadPool pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const std::vector<int64_t> small = {0, 1, 7, 63, 64, 1000, 5, 16};
  for (const NamedOptimizerConfig& named : OptimizerTestConfigs()) {
    for (numerics::DType grad :
         {numerics::DType::kFloat32, numerics::DType::kBFloat16, numerics::DType::kFloat16}) {
      for (int copy : {-1, 0, 1, 2}) CheckUpdate(**gpu, pool, named, grad, copy, small);
    }
    CheckUpdate(**gpu, pool, named, numerics::DType::kBFloat16,
                static_cast<int>(numerics::DType::kBFloat16), {1000003, 3 * 16384 + 1, 64});
  }
  for (numerics::DType dtype :
       {numerics::DType::kFloat32, numerics::DType::kBFloat16, numerics::DType::kFloat16}) {
    CheckGradStats(**gpu, pool, dtype);
  }
  CheckInvalid(**gpu);
  CheckTableBytes();
  MeasureBandwidth(**gpu);
  std::printf("%s: %d failed\n", g_failures == 0 ? "ALL PASSED" : "FAILED", g_failures);
  return g_failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace zeroshard::kernels

int main() { return zeroshard::kernels::Main(); }

// The CUDA kernels: the fused optimizer update over many pieces in one launch (128-bit loads
// of fp32 arrays, grid-stride over tiles) and the deterministic two-stage sum of squares.
// The element arithmetic is kernels/update_math.h, the same code the CPU paths run.
#include <cuda_runtime.h>

#include "kernels/cuda_block_sum.cuh"
#include "kernels/cuda_launch.h"
#include "kernels/optimizer_kind.h"
#include "kernels/update_math.h"
#include "numerics/dtype.h"

namespace zeroshard::kernels {

namespace cuda_internal {
namespace {

__device__ __forceinline__ float LoadElement(const void* data, int32_t dtype, int64_t i) {
  if (dtype == static_cast<int32_t>(numerics::DType::kFloat32))
    return static_cast<const float*>(data)[i];
  const uint16_t bits = static_cast<const uint16_t*>(data)[i];
  return dtype == static_cast<int32_t>(numerics::DType::kBFloat16) ? numerics::BFloat16ToFloat(bits)
                                                                   : numerics::HalfToFloat(bits);
}

__device__ __forceinline__ uint16_t Narrow(float value, int32_t dtype) {
  return dtype == static_cast<int32_t>(numerics::DType::kBFloat16)
             ? numerics::FloatToBFloat16(value)
             : numerics::FloatToHalf(value);
}

// Four consecutive gradient elements at i (a multiple of 4) of an aligned piece.
__device__ __forceinline__ float4 LoadFour(const void* data, int32_t dtype, int64_t i) {
  if (dtype == static_cast<int32_t>(numerics::DType::kFloat32)) {
    return reinterpret_cast<const float4*>(static_cast<const float*>(data) + i)[0];
  }
  const uint2 raw = reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(data) + i)[0];
  const uint16_t h[4] = {static_cast<uint16_t>(raw.x & 0xffffu), static_cast<uint16_t>(raw.x >> 16),
                         static_cast<uint16_t>(raw.y & 0xffffu),
                         static_cast<uint16_t>(raw.y >> 16)};
  if (dtype == static_cast<int32_t>(numerics::DType::kBFloat16)) {
    return make_float4(numerics::BFloat16ToFloat(h[0]), numerics::BFloat16ToFloat(h[1]),
                       numerics::BFloat16ToFloat(h[2]), numerics::BFloat16ToFloat(h[3]));
  }
  return make_float4(numerics::HalfToFloat(h[0]), numerics::HalfToFloat(h[1]),
                     numerics::HalfToFloat(h[2]), numerics::HalfToFloat(h[3]));
}

__device__ __forceinline__ void StoreCopyFour(void* copy, int32_t dtype, int64_t i, float4 v) {
  if (dtype == static_cast<int32_t>(numerics::DType::kFloat32)) {
    reinterpret_cast<float4*>(static_cast<float*>(copy) + i)[0] = v;
    return;
  }
  uint2 packed;
  packed.x =
      static_cast<uint32_t>(Narrow(v.x, dtype)) | (static_cast<uint32_t>(Narrow(v.y, dtype)) << 16);
  packed.y =
      static_cast<uint32_t>(Narrow(v.z, dtype)) | (static_cast<uint32_t>(Narrow(v.w, dtype)) << 16);
  reinterpret_cast<uint2*>(static_cast<uint16_t*>(copy) + i)[0] = packed;
}

template <OptimizerKind kKind>
__device__ __forceinline__ void UpdateElement(const ElementScalars& s, bool has_momentum,
                                              float grad, float& param, float& a, float& b,
                                              float& c) {
  const float g = ScaledGradient(s, grad);
  if constexpr (kKind == OptimizerKind::kSgd) {
    SgdElement(s, g, param, a, has_momentum);
  } else if constexpr (kKind == OptimizerKind::kAdam || kKind == OptimizerKind::kAdamW) {
    AdamElement(s, kKind == OptimizerKind::kAdamW, g, param, a, b, c);
  } else if constexpr (kKind == OptimizerKind::kAdagrad) {
    AdagradElement(s, g, param, a);
  } else {
    LionElement(s, g, param, a);
  }
}

__device__ __forceinline__ float4 LoadState(const float* state, int64_t i) {
  return state != nullptr ? reinterpret_cast<const float4*>(state + i)[0]
                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

__device__ __forceinline__ void StoreState(float* state, int64_t i, float4 v) {
  if (state != nullptr) reinterpret_cast<float4*>(state + i)[0] = v;
}

template <OptimizerKind kKind>
__device__ void UpdateScalar(const DeviceUpdatePiece& p, int64_t i) {
  const bool has_momentum = p.has_momentum != 0;
  float param = p.master[i];
  float a = p.state[0] != nullptr ? p.state[0][i] : 0.0f;
  float b = p.state[1] != nullptr ? p.state[1][i] : 0.0f;
  float c = p.state[2] != nullptr ? p.state[2][i] : 0.0f;
  UpdateElement<kKind>(p.scalars, has_momentum, LoadElement(p.grad, p.grad_dtype, i), param, a, b,
                       c);
  p.master[i] = param;
  if (p.state[0] != nullptr) p.state[0][i] = a;
  if (p.state[1] != nullptr) p.state[1][i] = b;
  if (p.state[2] != nullptr) p.state[2][i] = c;
  if (p.param_copy != nullptr) {
    if (p.copy_dtype == static_cast<int32_t>(numerics::DType::kFloat32)) {
      static_cast<float*>(p.param_copy)[i] = param;
    } else {
      static_cast<uint16_t*>(p.param_copy)[i] = Narrow(param, p.copy_dtype);
    }
  }
}

template <OptimizerKind kKind>
__device__ void UpdateFour(const DeviceUpdatePiece& p, int64_t i) {
  const bool has_momentum = p.has_momentum != 0;
  const ElementScalars& s = p.scalars;
  const float4 g = LoadFour(p.grad, p.grad_dtype, i);
  float4 param = reinterpret_cast<const float4*>(p.master + i)[0];
  float4 a = LoadState(p.state[0], i);
  float4 b = LoadState(p.state[1], i);
  float4 c = LoadState(p.state[2], i);
  UpdateElement<kKind>(s, has_momentum, g.x, param.x, a.x, b.x, c.x);
  UpdateElement<kKind>(s, has_momentum, g.y, param.y, a.y, b.y, c.y);
  UpdateElement<kKind>(s, has_momentum, g.z, param.z, a.z, b.z, c.z);
  UpdateElement<kKind>(s, has_momentum, g.w, param.w, a.w, b.w, c.w);
  reinterpret_cast<float4*>(p.master + i)[0] = param;
  StoreState(p.state[0], i, a);
  StoreState(p.state[1], i, b);
  StoreState(p.state[2], i, c);
  if (p.param_copy != nullptr) StoreCopyFour(p.param_copy, p.copy_dtype, i, param);
}

template <OptimizerKind kKind>
__global__ void __launch_bounds__(kThreadsPerBlock)
    UpdateKernel(const DeviceUpdatePiece* __restrict__ pieces, const DeviceTile* __restrict__ tiles,
                 int64_t num_tiles) {
  for (int64_t t = blockIdx.x; t < num_tiles; t += gridDim.x) {
    const DeviceTile tile = tiles[t];
    const DeviceUpdatePiece& p = pieces[tile.piece];
    if (p.vector_aligned != 0) {
      const int64_t vector_end = tile.begin + (tile.end - tile.begin) / 4 * 4;
      for (int64_t i = tile.begin + 4 * static_cast<int64_t>(threadIdx.x); i < vector_end;
           i += 4 * kThreadsPerBlock) {
        UpdateFour<kKind>(p, i);
      }
      for (int64_t i = vector_end + threadIdx.x; i < tile.end; i += kThreadsPerBlock) {
        UpdateScalar<kKind>(p, i);
      }
    } else {
      for (int64_t i = tile.begin + threadIdx.x; i < tile.end; i += kThreadsPerBlock) {
        UpdateScalar<kKind>(p, i);
      }
    }
  }
}

// Stage 1: one fp64 sum per tile. Thread k adds elements begin + k, begin + k + 256, ... in
// order, then the block combines the threads in a fixed tree: independent of the grid size.
__global__ void __launch_bounds__(kThreadsPerBlock)
    TileSumSquaresKernel(const DeviceStatsPiece* __restrict__ pieces,
                         const DeviceTile* __restrict__ tiles, int64_t num_tiles,
                         double* __restrict__ tile_sums) {
  __shared__ double shared[kThreadsPerBlock];
  for (int64_t t = blockIdx.x; t < num_tiles; t += gridDim.x) {
    const DeviceTile tile = tiles[t];
    const DeviceStatsPiece p = pieces[tile.piece];
    double sum = 0.0;
    for (int64_t i = tile.begin + threadIdx.x; i < tile.end; i += kThreadsPerBlock) {
      const double x = LoadElement(p.data, p.dtype, i);
      sum = sum + x * x;
    }
    const double tile_sum = BlockSum<kThreadsPerBlock>(sum, shared);
    if (threadIdx.x == 0) tile_sums[t] = tile_sum;
  }
}

// Stage 2: one block adds the tile sums: thread k takes tiles k, k + 256, ... in order.
__global__ void __launch_bounds__(kThreadsPerBlock)
    FinalSumKernel(const double* __restrict__ tile_sums, int64_t num_tiles,
                   double* __restrict__ result) {
  __shared__ double shared[kThreadsPerBlock];
  double sum = 0.0;
  for (int64_t t = threadIdx.x; t < num_tiles; t += kThreadsPerBlock) sum = sum + tile_sums[t];
  const double total = BlockSum<kThreadsPerBlock>(sum, shared);
  if (threadIdx.x == 0) result[0] = total;
}

int BlocksFor(int64_t num_tiles) {
  return static_cast<int>(num_tiles < kMaxBlocks ? num_tiles : kMaxBlocks);
}

}  // namespace

cudaError_t LaunchUpdate(OptimizerKind kind, const DeviceUpdatePiece* pieces,
                         const DeviceTile* tiles, int64_t num_tiles, cudaStream_t stream) {
  if (num_tiles == 0) return cudaSuccess;
  const int blocks = BlocksFor(num_tiles);
  switch (kind) {
    case OptimizerKind::kSgd:
      UpdateKernel<OptimizerKind::kSgd>
          <<<blocks, kThreadsPerBlock, 0, stream>>>(pieces, tiles, num_tiles);
      break;
    case OptimizerKind::kAdam:
      UpdateKernel<OptimizerKind::kAdam>
          <<<blocks, kThreadsPerBlock, 0, stream>>>(pieces, tiles, num_tiles);
      break;
    case OptimizerKind::kAdamW:
      UpdateKernel<OptimizerKind::kAdamW>
          <<<blocks, kThreadsPerBlock, 0, stream>>>(pieces, tiles, num_tiles);
      break;
    case OptimizerKind::kAdagrad:
      UpdateKernel<OptimizerKind::kAdagrad>
          <<<blocks, kThreadsPerBlock, 0, stream>>>(pieces, tiles, num_tiles);
      break;
    case OptimizerKind::kLion:
      UpdateKernel<OptimizerKind::kLion>
          <<<blocks, kThreadsPerBlock, 0, stream>>>(pieces, tiles, num_tiles);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchSumSquares(const DeviceStatsPiece* pieces, const DeviceTile* tiles,
                             int64_t num_tiles, double* tile_sums, double* result,
                             cudaStream_t stream) {
  if (num_tiles > 0) {
    TileSumSquaresKernel<<<BlocksFor(num_tiles), kThreadsPerBlock, 0, stream>>>(
        pieces, tiles, num_tiles, tile_sums);
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) return error;
  }
  FinalSumKernel<<<1, kThreadsPerBlock, 0, stream>>>(tile_sums, num_tiles, result);
  return cudaGetLastError();
}

}  // namespace cuda_internal
}  // namespace zeroshard::kernels

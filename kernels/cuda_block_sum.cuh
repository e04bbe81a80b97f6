// The block-wide fp64 sum of the CUDA reductions (kernels/cuda_kernels.cu and
// worker/engine/cuda_element_kernels.cu): one fixed tree, so every caller gets the same bits.
// Device code only: include it from .cu files.
#ifndef ZEROSHARD_KERNELS_CUDA_BLOCK_SUM_CUH_
#define ZEROSHARD_KERNELS_CUDA_BLOCK_SUM_CUH_

namespace zeroshard::kernels {

// Sums `value` over a block of kThreads threads (a power of two, the block's size) in a fixed
// tree: thread k adds thread k + half, halving each round. `shared` holds kThreads doubles.
// Every thread of the block must call it; the result is valid in thread 0.
template <int kThreads>
__device__ inline double BlockSum(double value, double* shared) {
  static_assert(kThreads > 0 && (kThreads & (kThreads - 1)) == 0, "a power of two");
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] = shared[threadIdx.x] + shared[threadIdx.x + half];
    __syncthreads();
  }
  const double sum = shared[0];
  __syncthreads();
  return sum;
}

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_CUDA_BLOCK_SUM_CUH_

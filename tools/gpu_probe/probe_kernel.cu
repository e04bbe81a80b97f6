// A trivial device kernel for the GPU probe: proves the nvcc-built object runs on the device.
#include <cuda_runtime.h>

#include "tools/gpu_probe/probe_kernel.h"

namespace zeroshard::gpu_probe {
namespace {

__global__ void FillIota(int* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i;
}

}  // namespace

int RunProbeKernel(int n) {
  int* device = nullptr;
  if (cudaMalloc(&device, n * sizeof(int)) != cudaSuccess) return -1;
  FillIota<<<(n + 255) / 256, 256>>>(device, n);
  int last = -1;
  const bool ok =
      cudaGetLastError() == cudaSuccess &&
      cudaMemcpy(&last, device + n - 1, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
  cudaFree(device);
  return ok ? last : -1;
}

}  // namespace zeroshard::gpu_probe

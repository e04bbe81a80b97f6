// zeroshard-gpu-probe: reports the CUDA devices and NCCL version this machine offers and runs
// one kernel. Exits 0 when a device ran the kernel, 2 when there is no usable device.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>

#include "tools/gpu_probe/probe_kernel.h"

int main() {
  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  std::printf("nccl_version=%d\n", nccl_version);
  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: %s\n", cudaGetErrorString(error));
    return 2;
  }
  for (int d = 0; d < devices; ++d) {
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, d);
    std::printf("device %d: %s, sm_%d%d, %.1f GiB\n", d, prop.name, prop.major, prop.minor,
                prop.totalGlobalMem / 1073741824.0);
  }
  const int last = zeroshard::gpu_probe::RunProbeKernel(1 << 20);
  std::printf("kernel result=%d (expected %d)\n", last, (1 << 20) - 1);
  return last == (1 << 20) - 1 ? 0 : 1;
}

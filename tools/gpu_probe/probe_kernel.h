// Host entry point of the GPU probe's kernel (plain C++: no CUDA headers).
#ifndef ZEROSHARD_TOOLS_GPU_PROBE_PROBE_KERNEL_H_
#define ZEROSHARD_TOOLS_GPU_PROBE_PROBE_KERNEL_H_

namespace zeroshard::gpu_probe {

// Fills n ints with 0..n-1 on the current device and returns the last one (n - 1), or -1 on
// any CUDA error.
int RunProbeKernel(int n);

}  // namespace zeroshard::gpu_probe

#endif  // ZEROSHARD_TOOLS_GPU_PROBE_PROBE_KERNEL_H_

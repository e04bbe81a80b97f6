// ZS_HOST_DEVICE marks functions that compile for both the host and CUDA devices, so one
// definition of the element arithmetic serves the CPU paths, the CUDA kernels and the tests.
#ifndef ZEROSHARD_NUMERICS_HOST_DEVICE_H_
#define ZEROSHARD_NUMERICS_HOST_DEVICE_H_

#ifdef __CUDACC__
#define ZS_HOST_DEVICE __host__ __device__
#else
#define ZS_HOST_DEVICE
#endif

#endif  // ZEROSHARD_NUMERICS_HOST_DEVICE_H_

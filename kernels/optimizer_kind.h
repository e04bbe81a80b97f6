// The optimizers the kernels implement. A header of its own (no abseil) so that the CUDA code,
// compiled by nvcc, names them exactly as the API in optimizer.h does.
#ifndef ZEROSHARD_KERNELS_OPTIMIZER_KIND_H_
#define ZEROSHARD_KERNELS_OPTIMIZER_KIND_H_

#include <cstdint>

namespace zeroshard::kernels {

enum class OptimizerKind : int32_t {
  kSgd = 0,      // torch.optim.SGD
  kAdam = 1,     // torch.optim.Adam
  kAdamW = 2,    // torch.optim.AdamW
  kAdagrad = 3,  // torch.optim.Adagrad
  kLion = 4,     // Chen et al. 2023
};

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_OPTIMIZER_KIND_H_

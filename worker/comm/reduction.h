// Element-wise reduction of two typed buffers, the one arithmetic step of every CPU reduce ring.
#ifndef ZEROSHARD_WORKER_COMM_REDUCTION_H_
#define ZEROSHARD_WORKER_COMM_REDUCTION_H_

#include <cstddef>

#include "worker/comm/communicator.h"

namespace zeroshard::comm {

// out[i] = received[i] (op) own[i] for i < count.
// REQUIRES: `received` and `own` do not overlap; `out` is `own`, is `received`, or overlaps
// neither (the fp32/fp64 loops are compiled as alias-free).
// fp32/fp64 use IEEE arithmetic (no contraction); bf16/fp16 are widened to fp32, combined, and
// rounded back to nearest even (numerics/dtype.h), once per call; integers wrap on overflow.
// kMax gives NaN when either operand is NaN. Thread-compatible (pure function).
void ReduceElements(void* out, const void* received, const void* own, size_t count,
                    ElementType type, ReduceOp op);

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_REDUCTION_H_

// Test support: deterministic per-rank inputs, a reference for every collective computed in the
// ring's fixed reduction order, and one routine that runs every collective on a Communicator and
// compares the results bit for bit. Shared by the threads-as-ranks test and the peer process.
#ifndef ZEROSHARD_WORKER_COMM_COLLECTIVE_CHECKS_H_
#define ZEROSHARD_WORKER_COMM_COLLECTIVE_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"

namespace zeroshard::comm {

// `count` elements of `type` that rank `rank` contributes for stream `seed`. Floating-point
// values spread over many binades (so the order of additions changes the rounding); integers
// cover the whole range (so sums wrap).
std::vector<char> MakeInput(ElementType type, int rank, size_t count, uint64_t seed);

// The reduction over `inputs` (one per rank, equal lengths) that the ring computes: element i of
// piece p (pieces given by their start offsets, plus the end) is
// ((x[p+1] op x[p+2]) op ...) op x[p], ranks mod W, with bf16/fp16 rounded after every step.
std::vector<char> ReferenceReduce(const std::vector<std::vector<char>>& inputs, ElementType type,
                                  ReduceOp op, const std::vector<size_t>& piece_begin);

// Runs, on `communicator`, every collective with pieces of `piece_count` elements of `type`
// (reduce-scatter and all-gather in and out of place, all-reduce sum and max over the bucket and
// over an odd count, broadcast from two roots, barrier, and an all-reduce repeated to check it is
// bitwise stable), and compares each result with the reference. Every rank calls this with the
// same arguments. Returns the first mismatch or failure, after aborting the communicator so the
// other ranks fail at once instead of waiting for their timeouts.
absl::Status CheckAllCollectives(Communicator& communicator, size_t piece_count, ElementType type,
                                 uint64_t seed, absl::Duration timeout = absl::Seconds(60));

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_COLLECTIVE_CHECKS_H_

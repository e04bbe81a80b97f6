// Test support: runs a function on every rank of a group with one thread per rank, in the manner
// of spawn() in gloo's test/base_test.h, and reports which rank failed.
#ifndef ZEROSHARD_WORKER_COMM_TESTING_RANK_THREADS_H_
#define ZEROSHARD_WORKER_COMM_TESTING_RANK_THREADS_H_

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

// zeroshard::comm::testing rather than zeroshard::testing: the namespace follows the package (as
// everywhere in the repository), and zeroshard::testing is the integration tests' (LocalCluster).
// Inside zeroshard::comm, gtest's namespace is then spelled ::testing.
namespace zeroshard::comm::testing {

// Calls `body(rank)` for every rank in [0, world_size), each on its own thread, all at once, and
// returns only after every call has returned (so `body` may capture locals by reference). OK
// when every rank returned OK; otherwise the lowest failing rank's code, with a message naming
// each failing rank in rank order: "rank 2: <message>; rank 3: <message>". INVALID_ARGUMENT
// when world_size < 1.
//
// Thread contract: `body` runs concurrently on world_size threads, so what it shares between
// ranks must be synchronised. A rank that waits for peers must bound the wait (or be released
// by a failing peer, e.g. through Communicator::Abort), since a failed rank does not stop the
// others.
absl::Status RunOnRankThreads(int world_size, absl::FunctionRef<absl::Status(int rank)> body);

}  // namespace zeroshard::comm::testing

#endif  // ZEROSHARD_WORKER_COMM_TESTING_RANK_THREADS_H_

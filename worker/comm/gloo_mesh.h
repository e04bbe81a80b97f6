// ConnectGlooMeshes: the Gloo full meshes (one gloo::Context per transport lane) of a
// communicator, built here from Gloo's TCP pairs so that connecting them can be aborted.
#ifndef ZEROSHARD_WORKER_COMM_GLOO_MESH_H_
#define ZEROSHARD_WORKER_COMM_GLOO_MESH_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/abort_signal.h"
#include "worker/comm/store.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace zeroshard::comm {

struct GlooMeshOptions {
  int rank = 0;
  int world_size = 2;
  int lanes = 1;
  Store* store = nullptr;
  // Rank r publishes under "<store_prefix>/addresses/<r>" the Gloo addresses (tcp::Address
  // bytes) of its pairs, lane by lane, each lane's in the order of the peers' ranks.
  std::string store_prefix = "gloo";
  // The address this rank listens on and announces to its peers.
  std::string hostname = "127.0.0.1";
  // Everything (store waits and connecting) ends by then.
  absl::Time deadline = absl::InfiniteFuture();
  // Optional. Aborting it ends the rendezvous at once, whatever it is waiting for.
  AbortSignal* abort_signal = nullptr;
};

// Why not gloo::rendezvous::Context::connectFullMesh: Debian's Gloo gives no way to interrupt
// it. Its store waits block for its whole timeout, and a pair whose peer never connects waits
// in tcp::Pair::connect for five times that timeout (a peer killed while the ring connects
// left its survivors unkillable for minutes). Here every lane's pairs are created first and
// their addresses published in one store key per rank; the store is polled in short slices;
// then each pair is connected. Closing a pair (Pair::close) wakes a Pair::connect blocked on it
// (the pair is CLOSED, which its wait accepts), so on Abort or at the deadline every pair is
// closed from another thread and the call returns. Retrying connectFullMesh with short timeouts
// was the alternative: every retry would need fresh devices and keys, and ranks on different
// sides of a timeout would have to agree on which attempt won.
//
// Returns the lanes' contexts (lane l's pairs connect this rank to every other), or CANCELLED
// when aborted, DEADLINE_EXCEEDED when the peers have not all connected by the deadline,
// UNAVAILABLE for store and transport failures, INVALID_ARGUMENT for bad options. All ranks call
// it with the same world size, lanes and store prefix.
//
// Test hook: with ZEROSHARD_TESTONLY_STOP_BEFORE_CONNECTING=1 in its environment, a process
// stops itself (SIGSTOP) right after publishing its addresses, before it reads its peers' or
// connects any pair: its peers are then left connecting to a rank that never connects, as when
// a worker dies during the rendezvous (tests/integration/abort_test.cc). Never set it otherwise.
//
// Thread contract: a plain function; the abort signal may be aborted from any thread.
absl::StatusOr<std::vector<std::shared_ptr<gloo::Context>>> ConnectGlooMeshes(
    const GlooMeshOptions& options);

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_GLOO_MESH_H_

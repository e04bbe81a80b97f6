// RingLink: the transport under the ring algorithms of gloo_ring.h. A link moves whole messages
// (one pipeline segment each) between ranks; the rings decide what is sent when and in which
// order partial sums are combined, so every link gives the same bits.
#ifndef ZEROSHARD_WORKER_COMM_RING_LINK_H_
#define ZEROSHARD_WORKER_COMM_RING_LINK_H_

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace zeroshard::comm {

// Messages between one ordered pair of ranks are received in the order they were sent; `slot`
// (ring_schedule.h's MakeSlot) names each one, and is distinct among the messages in flight.
//
// Implementations: GlooLink (gloo_link.h, Gloo's TCP pairs, one per operation), ShmLink
// (shm_link.h, shared memory between ranks on one host, kept for the communicator's life) and
// RoutedLink (routed_link.h: each peer over one of those two, for groups that span hosts).
//
// Thread contract: used by one thread at a time (the communication thread running the ring).
// Implementations say what else may be called from other threads (e.g. an interrupt).
class RingLink {
 public:
  virtual ~RingLink() = default;

  // Whether Receive from `peer` reads from the caller's `landing` memory (which must then be
  // PostReceive'd and stay untouched until Receive returns). When false the link hands out its
  // own memory and `landing` is only a hint: nothing is written there by the link.
  virtual bool needs_landing(int peer) const = 0;

  // Starts sending `bytes` at `data` to `peer`; `data` must stay unchanged until WaitSends
  // returns. Does not block on the peer.
  virtual void Send(int peer, uint64_t slot, const void* data, size_t bytes) = 0;

  // Announces the receive of message `slot` from `peer` into `landing` (`bytes` long), before
  // the message may arrive. Links that need no landing ignore it.
  virtual void PostReceive(int peer, uint64_t slot, void* landing, size_t bytes) = 0;

  // Receives message `slot` (`bytes` long) from `peer` and hands it to `consume` in consecutive
  // parts (data, offset within the message, part bytes) whose bytes are multiples of 8 except
  // for the last part; `data` is valid only during the call. With a landing, the one part is
  // `landing` itself. Ends with an error when `deadline` passes or the link is interrupted.
  using Consumer = absl::FunctionRef<void(const char* data, size_t offset, size_t bytes)>;
  virtual absl::Status Receive(int peer, uint64_t slot, void* landing, size_t bytes,
                               absl::Time deadline, Consumer consume) = 0;

  // Blocks until every Send so far has left its `data`, or `deadline` passes.
  virtual absl::Status WaitSends(absl::Time deadline) = 0;
};

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_RING_LINK_H_

// GlooRing: the ring algorithms of one GlooCommunicator operation (pipelined reduce-scatter and
// all-gather, the broadcast chain, the barrier) over a RingLink (Gloo's TCP pairs or shared
// memory, ring_link.h).
#ifndef ZEROSHARD_WORKER_COMM_GLOO_RING_H_
#define ZEROSHARD_WORKER_COMM_GLOO_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/ring_link.h"
#include "worker/comm/ring_schedule.h"

namespace zeroshard::comm {

// What a ring borrows from the communicator that runs it. Everything pointed to must outlive the
// GlooRing.
struct GlooRingEnvironment {
  int rank = 0;
  int world_size = 1;
  // GlooCommunicatorOptions' segment_bytes and staging_segments.
  size_t segment_bytes = 0;
  int staging_segments = 1;
  // The transport the messages travel on.
  RingLink* link = nullptr;
  // Reduce-scatter staging (for a link that needs a landing), grown as needed and kept between
  // operations.
  std::vector<char>* staging = nullptr;
  // Running totals: a send's bytes count when it is posted, a receive's when it completes (read
  // concurrently by the communicator's stats()).
  std::atomic<int64_t>* bytes_sent = nullptr;
  std::atomic<int64_t>* bytes_received = nullptr;
};

// The ring algorithms of one operation over the environment's link, with the operation's message
// slots (MakeSlot with its tag and sequence). The algorithms are the ones GlooCommunicator's
// class comment describes, in that reduction order, whatever the link.
//
// Thread contract: not thread-safe; created, used and destroyed on the communication thread that
// runs the operation. Link errors (and Gloo's exceptions) pass through to the caller.
class GlooRing {
 public:
  // Every wait of the operation ends by `deadline`.
  GlooRing(GlooRingEnvironment environment, uint32_t tag, uint64_t sequence, absl::Time deadline);
  ~GlooRing();

  GlooRing(const GlooRing&) = delete;
  GlooRing& operator=(const GlooRing&) = delete;

  absl::Time deadline() const { return deadline_; }

  // Reduce-scatter ring over `pieces`. `input` holds this rank's contributions (whole-buffer
  // layout); partial sums that are forwarded again go to `work` (whole-buffer layout, may be
  // `input` itself when in place); the reduced piece `rank` goes to `output`. Units
  // [unit_base, unit_base + kUnitsPerPhase).
  absl::Status ReduceScatter(const Pieces& pieces, const char* input, char* work, char* output,
                             ElementType type, ReduceOp op, uint64_t unit_base);

  // All-gather ring, in place on `buffer` whose piece `rank` is filled. Units
  // [unit_base, unit_base + kUnitsPerPhase).
  absl::Status AllGather(const Pieces& pieces, char* buffer, size_t element_size,
                         uint64_t unit_base);

  // Pipelined chain root, root+1, ..., root-1 over the whole buffer.
  absl::Status Broadcast(char* buffer, size_t count, size_t element_size, int root);

  // Every rank sends one byte to, and receives one byte from, every other rank.
  absl::Status Barrier();

 private:
  uint64_t Slot(uint64_t unit) const { return MakeSlot(tag_, sequence_, unit); }
  void Send(int peer, uint64_t unit, const void* data, size_t bytes);
  // Receives message `unit` from `peer` into `landing` (copied there unless the link landed it
  // there already).
  absl::Status ReceiveInto(int peer, uint64_t unit, char* landing, size_t bytes);

  const GlooRingEnvironment environment_;
  const int rank_;
  const int world_size_;
  const int next_;
  const int previous_;
  const uint32_t tag_;
  const uint64_t sequence_;
  const absl::Time deadline_;
  RingLink& link_;
  // Barrier's one-byte messages; a member so it outlives the link's buffers over it.
  std::vector<char> barrier_bytes_;
};

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_GLOO_RING_H_

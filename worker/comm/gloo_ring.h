// GlooRing: the ring algorithms of one GlooCommunicator operation (pipelined reduce-scatter and
// all-gather, the broadcast chain, the barrier) over Gloo's unbound buffers.
#ifndef ZEROSHARD_WORKER_COMM_GLOO_RING_H_
#define ZEROSHARD_WORKER_COMM_GLOO_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/ring_schedule.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace zeroshard::comm {

// What a ring borrows from the communicator that runs it. Everything pointed to must outlive the
// GlooRing.
struct GlooRingEnvironment {
  int rank = 0;
  int world_size = 1;
  // GlooCommunicatorOptions' segment_bytes and staging_segments.
  size_t segment_bytes = 0;
  int staging_segments = 1;
  // The transport lanes: messages from rank s travel on (*lanes)[LaneOf(s, lanes->size())].
  const std::vector<std::shared_ptr<gloo::Context>>* lanes = nullptr;
  // Reduce-scatter staging, grown as needed and kept between operations.
  std::vector<char>* staging = nullptr;
  // Running totals: a send's bytes count when it is posted, a receive's when it completes (read
  // concurrently by the communicator's stats()).
  std::atomic<int64_t>* bytes_sent = nullptr;
  std::atomic<int64_t>* bytes_received = nullptr;
  // Blocks until `buffer`'s pending receive (`receive`) or send completes; an error status when
  // `deadline` passes or the communicator has failed or is aborted.
  std::function<absl::Status(gloo::transport::UnboundBuffer* buffer, bool receive,
                             absl::Time deadline)>
      wait;
};

// The per-operation view of the transport and the ring algorithms over it: unbound buffers, the
// operation's message slots (MakeSlot with its tag and sequence), and the sends still to wait for.
// The algorithms are the ones GlooCommunicator's class comment describes, in that reduction order.
//
// Thread contract: not thread-safe; created, used and destroyed on the communication thread that
// runs the operation. Gloo throws on transport errors; the caller catches. The unbound buffers
// live as long as the GlooRing, so after a failure the caller must close the connections before
// destroying it (Gloo may still write into a receive buffer until then).
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
  // An unbound buffer on `lane`'s context.
  gloo::transport::UnboundBuffer* Buffer(const void* data, size_t bytes, int lane);
  // A buffer this rank sends from: on this rank's lane.
  gloo::transport::UnboundBuffer* SendBuffer(const void* data, size_t bytes);
  // A buffer receiving from `peer`: on the sender's lane.
  gloo::transport::UnboundBuffer* RecvBuffer(void* data, size_t bytes, int peer);

  void Send(gloo::transport::UnboundBuffer* buffer, int peer, uint64_t unit);
  void Recv(gloo::transport::UnboundBuffer* buffer, int peer, uint64_t unit, size_t offset_bytes,
            size_t bytes);
  void Recv(gloo::transport::UnboundBuffer* buffer, int peer, uint64_t unit);

  absl::Status WaitRecv(gloo::transport::UnboundBuffer* buffer, size_t bytes);
  absl::Status WaitSends();

  const GlooRingEnvironment environment_;
  const int rank_;
  const int world_size_;
  const int next_;
  const int previous_;
  const uint32_t tag_;
  const uint64_t sequence_;
  const absl::Time deadline_;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> buffers_;
  // Barrier's one-byte messages; a member so it outlives the buffers over it.
  std::vector<char> barrier_bytes_;
  // One entry per send not yet waited for (a buffer sending twice appears twice).
  std::vector<gloo::transport::UnboundBuffer*> pending_sends_;
};

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_GLOO_RING_H_

// GlooCommunicator: the CPU Communicator. The collectives are our own pipelined rings (gloo_ring.h)
// over a link: Gloo's TCP pairs of the full mesh (connected by gloo_mesh.h, gloo_link.h), or
// shared memory between the ranks of one host (shm_link.h).
#ifndef ZEROSHARD_WORKER_COMM_GLOO_COMMUNICATOR_H_
#define ZEROSHARD_WORKER_COMM_GLOO_COMMUNICATOR_H_

#include <time.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/abort_signal.h"
#include "worker/comm/communicator.h"
#include "worker/comm/peer_watch.h"
#include "worker/comm/ring_schedule.h"
#include "worker/comm/store.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace zeroshard::comm {

class GlooRing;
class RingLink;
class ShmLink;
struct GlooRingEnvironment;

// What the ring messages travel on (the worker's --transport).
enum class Transport {
  // Gloo's TCP pairs.
  kTcp,
  // Shared memory; Create fails (FAILED_PRECONDITION) unless every rank is on one host.
  kShm,
  // Shared memory between the ranks of each host (shm_link.h says how that is proven), TCP
  // between hosts and for a rank alone on its host.
  kAuto,
};

// "tcp", "shm", "auto".
const char* TransportName(Transport transport);
// INVALID_ARGUMENT naming the accepted values for anything else.
absl::StatusOr<Transport> ParseTransport(absl::string_view name);

struct GlooCommunicatorOptions {
  int rank = 0;
  int world_size = 1;
  // The rendezvous store, used only inside Create (not needed when world_size is 1).
  Store* store = nullptr;
  // Store keys are "<store_prefix>/<gloo's key>"; communicators sharing a Store (and a
  // generation) need distinct prefixes.
  std::string store_prefix = "gloo";
  // The address this rank listens on and announces to its peers.
  std::string hostname = "127.0.0.1";
  // The link under the rings. The library defaults to TCP; the worker's --transport to auto.
  Transport transport = Transport::kTcp;
  // This rank's machine, for the shared-memory check (the worker's --host); empty: gethostname().
  std::string host;
  // Shared-memory rings between ring neighbours: shm_slots chunks of shm_slot_bytes (a multiple
  // of 64) per direction (ShmLinkOptions).
  size_t shm_slot_bytes = 256 * 1024;
  int shm_slots = 8;
  // Bound on Create: waiting for peers' addresses and connecting to them.
  absl::Duration rendezvous_timeout = absl::Seconds(60);
  // Optional; Create only. Aborting it ends a Create in progress at once with CANCELLED (the
  // communicator's own Abort() ends its collectives).
  AbortSignal* abort_signal = nullptr;
  // Pipeline unit: each ring step moves its piece in segments of at most this many bytes, so
  // the transfer of one segment overlaps the reduction of the previous one.
  size_t segment_bytes = 1024 * 1024;
  // Reduce-scatter receives into this many staging segments (the communicator's only scratch
  // for in-place collectives: staging_segments * segment_bytes).
  int staging_segments = 4;
  // Transport lanes, 1 to kMaxLanes (ring_schedule.h): Gloo contexts, each a full mesh with its
  // own event-loop thread; a message travels on its sender's lane.
  int lanes = kDefaultLanes;
  // CPUs the communication thread may run on (pthread_setaffinity_np); empty: those of the
  // thread calling Create. Gloo's event-loop threads are left where they are.
  std::vector<int> thread_cpus;
  // Nice value of the communication thread (setpriority on its thread id; one below the process's
  // needs CAP_SYS_NICE); unset: inherited. Nice weighs threads against others of the same
  // scheduling group only (with autogroup, those of the same session).
  std::optional<int> thread_nice;
};

// Algorithms (W = world size, r = this rank, pieces p = 0..W-1, next = r+1, prev = r-1 mod W):
// - ReduceScatter: a ring of W-1 steps; at step s rank r sends its partial sum of piece r-1-s and
//   receives piece r-2-s, to which it adds its own contribution. Piece p is therefore always
//   reduced in the order ((x[p+1] + x[p+2]) + ...) + x[p], whatever the timing. bf16/fp16 partial
//   sums are computed in fp32 and rounded to the element type at every step (each hop carries the
//   element type, so the bytes on the wire are the buffer's).
// - AllGather: a ring of W-1 steps forwarding the piece received in the previous step.
// - AllReduce: that reduce-scatter followed by that all-gather, in place (pieces of a count that
//   W does not divide differ by at most one element), so its bits equal ReduceScatter's.
// - Broadcast: a pipelined chain root, root+1, ..., root-1. Barrier: every rank exchanges one
//   byte with every other rank.
// Each rank sends and receives (W-1)/W of the buffer per reduce-scatter or all-gather.
//
// Thread contract: as Communicator's. Operations run on one communication thread owned by this
// object (Gloo adds an event-loop thread per transport lane: by default two full meshes of TCP
// connections, a message travelling on its sender's lane, so one thread reads a rank's ring input
// while another writes its output; none over shared memory, where the communication thread
// moves every byte itself; and a PeerWatch thread, peer_watch.h). Gloo throws; every exception is
// caught on the communication thread (or in Create) and becomes a Status there.
// stats().thread_cpu_ns is the communication thread's CPU time (not the event-loop threads').
class GlooCommunicator : public Communicator {
 public:
  // Connects the link (all ranks call this with the same world size, store prefix and
  // transport): under shm or auto first the shared-memory rendezvous (shm_link.h), then, unless
  // shared memory was chosen, the Gloo mesh (gloo_mesh.h); the peer watch in every case.
  // DEADLINE_EXCEEDED when peers do not show up within rendezvous_timeout; CANCELLED when
  // options.abort_signal is aborted first; FAILED_PRECONDITION under transport=shm when the ranks
  // do not share a host (auto falls back to TCP instead); UNAVAILABLE for other transport
  // failures; INVALID_ARGUMENT for bad options; the error of pinning the communication thread or
  // setting its nice value (thread_cpus, thread_nice).
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(
      const GlooCommunicatorOptions& options);

  // Operations still queued or running are aborted (their Work finishes with ABORTED); an idle
  // communicator that has not failed closes its connections gracefully and bids its peers
  // farewell (their PeerWatch does not report it lost).
  ~GlooCommunicator() override;

  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  std::unique_ptr<Work> ReduceScatter(const void* input, void* output, size_t piece_count,
                                      ElementType type, ReduceOp op,
                                      const CollectiveOptions& options = {}) override;
  std::unique_ptr<Work> ReduceScatterInPlace(void* buffer, size_t piece_count, ElementType type,
                                             ReduceOp op,
                                             const CollectiveOptions& options = {}) override;
  std::unique_ptr<Work> AllGather(const void* input, void* output, size_t piece_count,
                                  ElementType type, const CollectiveOptions& options = {}) override;
  std::unique_ptr<Work> AllGatherInPlace(void* buffer, size_t piece_count, ElementType type,
                                         const CollectiveOptions& options = {}) override;
  std::unique_ptr<Work> AllReduce(void* buffer, size_t count, ElementType type, ReduceOp op,
                                  const CollectiveOptions& options = {}) override;
  std::unique_ptr<Work> Broadcast(void* buffer, size_t count, ElementType type, int root,
                                  const CollectiveOptions& options = {}) override;
  std::unique_ptr<Work> Barrier(const CollectiveOptions& options = {}) override;
  void Abort() override;
  // The ranks this rank's PeerWatch saw die (peer_watch.h).
  std::vector<int> LostPeers() const override;
  CommunicatorStats stats() const override;
  // The link Create chose: kShm when shared memory carries every message, else kTcp (also at
  // world size 1, where nothing travels); SharedMemoryPeers says which ranks a group spanning
  // hosts reaches through shared memory.
  Transport transport() const;
  // The ranks this rank exchanges with through shared memory, ascending; the rest use TCP.
  std::vector<int> SharedMemoryPeers() const;

 private:
  struct Operation;
  class Completion;

  GlooCommunicator(const GlooCommunicatorOptions& options,
                   std::vector<std::shared_ptr<gloo::Context>> contexts,
                   std::unique_ptr<ShmLink> shm_link, std::unique_ptr<PeerWatch> peer_watch);

  // Queues `operation` for the communication thread, or returns ABORTED when the communicator
  // has failed.
  std::unique_ptr<Work> Enqueue(Operation operation);

  // The communication thread: applies thread_cpus and thread_nice, then runs queued operations
  // in order until destruction.
  void CommunicationLoop(std::vector<int> cpus, std::optional<int> nice);
  // Blocks until the communication thread has applied its CPUs and nice value; their error.
  absl::Status AwaitThreadSetup();
  bool HasThreadWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Communication thread only: the state an operation's GlooRing borrows from this object, with
  // `link` under it.
  GlooRingEnvironment RingEnvironment(RingLink* link);

  // Runs one operation on the communication thread. Gloo exceptions become Status here.
  absl::Status Execute(const Operation& operation, GlooRing& ring);
  absl::Status RunReduceScatter(const Operation& operation, GlooRing& ring);
  absl::Status RunAllGather(const Operation& operation, GlooRing& ring);
  absl::Status RunAllReduce(const Operation& operation, GlooRing& ring);
  absl::Status RunBroadcast(const Operation& operation, GlooRing& ring);
  absl::Status RunBarrier(GlooRing& ring);

  // Blocks the communication thread until `buffer`'s pending receive (or send) completes, the
  // deadline passes (DEADLINE_EXCEEDED, by Gloo's exception), or Abort() interrupts it (ABORTED).
  absl::Status WaitOnBuffer(gloo::transport::UnboundBuffer* buffer, bool receive,
                            absl::Time deadline);

  // After Gloo threw (not by a deadline): the failure the PeerWatch reports within a short grace
  // (it names the peer lost), or nullopt.
  std::optional<absl::Status> AwaitWatchedFailure();
  // Records the communicator's first failure; later operations fail with ABORTED.
  void MarkFailed(const absl::Status& cause);
  // Records `cause` as the failure (unless there is one) and interrupts the communication
  // thread's wait: Abort() with a reason (the PeerWatch thread's, for a lost peer).
  void Fail(absl::Status cause);
  // Communication thread only: hard-closes every connection (peers see a reset and fail fast),
  // after which Gloo no longer touches any buffer.
  void CloseConnections();

  const int rank_;
  const int world_size_;
  const size_t segment_bytes_;
  const int staging_segments_;

  // Owned by the communication thread (and by the destructor after it has joined): the transport
  // lanes (see ring_schedule.h; a message from rank s uses contexts_[LaneOf(s)]), empty at world
  // size 1 and when the shared-memory link carries the messages instead.
  std::vector<std::shared_ptr<gloo::Context>> contexts_;
  // The shared-memory link, when Create chose it (null otherwise). Used by the communication
  // thread; Fail() interrupts it from any thread (ShmLink's contract).
  std::unique_ptr<ShmLink> shm_link_;
  // Communication thread only: reduce-scatter staging and out-of-place scratch, kept between
  // operations so steady-state steps do not allocate.
  std::vector<char> staging_;
  std::vector<char> scratch_;

  mutable absl::Mutex mu_;
  // Issued, not yet started operations, in issue order.
  std::deque<Operation> queue_ ABSL_GUARDED_BY(mu_);
  // Sequence number of the next issued operation; identical on every rank because every rank
  // issues the same operations in the same order. Part of each message's slot.
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  // Set once, by Abort(), a lost peer or the first failed operation; never cleared.
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  // Whether Gloo's connections are still open (they close once after a failure).
  bool connections_open_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Whether the communication thread is running an operation.
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  // The buffer the communication thread is blocked on, so Abort() can interrupt the wait.
  gloo::transport::UnboundBuffer* waiting_on_ ABSL_GUARDED_BY(mu_) = nullptr;

  // Set once by the communication thread before it runs any operation.
  bool thread_set_up_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status thread_setup_ ABSL_GUARDED_BY(mu_);

  std::atomic<int64_t> operations_completed_{0};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
  // Bytes of staging_ and scratch_ (stats().scratch_bytes), stored by the communication thread.
  std::atomic<int64_t> scratch_bytes_{0};

  // Tells this rank at once when a peer's process ends (null at world size 1). Stopped (without
  // a farewell) by CloseConnections, with one by the destructor of a communicator that has not
  // failed.
  std::unique_ptr<PeerWatch> peer_watch_;

  std::thread thread_;
  // The communication thread's CPU-time clock (stats().thread_cpu_ns), set by the constructor
  // before anything else can call stats(); unreadable when pthread_getcpuclockid failed.
  clockid_t thread_clock_ = CLOCK_THREAD_CPUTIME_ID;
  bool thread_clock_readable_ = false;
};

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_GLOO_COMMUNICATOR_H_

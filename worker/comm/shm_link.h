// ShmLink: the RingLink between ranks on one host: every ordered pair of them has a ring of
// chunks in one shared-memory segment (a sealed memfd), so a ring message costs one copy in (the
// sender's) and is reduced or copied straight out of shared memory by the receiver, with no socket
// and no kernel copy on the data path.
#ifndef ZEROSHARD_WORKER_COMM_SHM_LINK_H_
#define ZEROSHARD_WORKER_COMM_SHM_LINK_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/abort_signal.h"
#include "worker/comm/ring_link.h"
#include "worker/comm/store.h"

namespace zeroshard::comm {

struct ShmLinkOptions {
  int rank = 0;
  int world_size = 2;
  Store* store = nullptr;
  // Store keys are "<store_prefix>/shm/...".
  std::string store_prefix = "gloo";
  // This rank's machine (the worker's --host). Ranks naming different hosts never share memory.
  std::string host;
  // Chunks of the ring between ring neighbours (r -> r+1): `slots` chunks of `slot_bytes` (a
  // multiple of 64). Other pairs (the barrier's messages) get two 64-byte chunks.
  size_t slot_bytes = 256 * 1024;
  int slots = 8;
  // Connecting (store waits included) ends by then.
  absl::Time deadline = absl::InfiniteFuture();
  // Optional. Aborting it ends Connect within one poll slice (100 ms) with CANCELLED.
  AbortSignal* abort_signal = nullptr;
  // True: every rank must announce this rank's host (FAILED_PRECONDITION naming one that does
  // not). False: the ranks that announce it are the link's members and the others are left to
  // another link (reaches() says which; the group's ring then mixes links, see RoutedLink).
  bool whole_group = true;
};

// Same host is decided by the hosts the ranks announce and then proven in shared memory: the
// lowest rank announcing a host (the host's leader) creates the segment as a memfd sealed against
// resizing, writes a random token into it and publishes "<pid> <fd> <token>" through the store;
// every other rank of that host reaches the leader's descriptor through /proc/<pid>/fd/<fd>,
// checks that it is a sealed memfd of ours, maps it and compares the token (a rank on another
// host, in another pid namespace or under another uid, or whose leader is not dumpable, cannot
// reach it, or finds another file).
// Nothing is named in /dev/shm, so nothing is ever unlinked or swept, and a record published by
// a rank that merely claims this host can fail the proof but never touch another object. The
// leader closes its descriptor once every member has answered, before any collective runs: from
// then on only the members' mappings hold the segment, and a killed rank leaves nothing behind.
// No process can resize the segment (the seals), so no mapping of it can fault. What a peer
// writes into it is never trusted for an address: a chunk's size is bounded by the chunk (else
// an error naming the peer), ring indices are counters taken modulo the ring's length, and a
// counter is otherwise only compared.
//
// Each ring is single-producer single-consumer: the sender copies a message into free chunks and
// publishes them by advancing `head`; the receiver consumes chunks in place and frees them by
// advancing `tail`. Nothing is ever locked, so a rank that dies holds nothing its peers wait on;
// the PeerWatch's TCP connections tell the survivors (shared memory gives no EOF), and the
// communicator's Interrupt ends their waits. Sends are queued and pushed into the ring whenever
// the link waits, so the ring algorithms' "post every send, then receive" never deadlocks on a
// full ring. When the link's members are not the whole group, the caller also waits on other
// links, where this one is not pushed; a pusher thread then moves the queued sends, so sends
// are as asynchronous as Gloo's.
//
// Waiting spins briefly, then sleeps on this rank's bell (a futex word in the segment) that a
// peer rings after it publishes chunks to this rank or frees chunks this rank sends into, and
// that Interrupt rings too. Sleeps are capped at 100 ms, so a missed wake-up only delays.
//
// Thread contract: Connect, Send, PostReceive, Receive and WaitSends on one thread at a time
// (the communication thread); Interrupt, reaches, reaches_all and ring_bytes from any thread.
// The queued sends are guarded by a mutex, shared with the pusher thread when there is one.
class ShmLink : public RingLink {
 public:
  // All ranks call this with the same world size, prefix, sizes and whole_group. It fails with
  // FAILED_PRECONDITION when this rank's host has no other rank, when whole_group and the hosts
  // differ, or when the proof fails (the leader's segment cannot be reached, is not a sealed
  // memfd of ours or holds another token) or the leader cannot create the segment (e.g. not
  // enough memory for the pages it reserves): the message says
  // which rank and why, and every rank of the host gets the same answer, so they may all fall
  // back to TCP together.
  // DEADLINE_EXCEEDED, CANCELLED (abort_signal), UNAVAILABLE (store) and INVALID_ARGUMENT
  // (options) otherwise.
  static absl::StatusOr<std::unique_ptr<ShmLink>> Connect(const ShmLinkOptions& options);

  // Stops the pusher thread, then unmaps the segment.
  ~ShmLink() override;
  ShmLink(const ShmLink&) = delete;
  ShmLink& operator=(const ShmLink&) = delete;

  // Ends every wait in progress and every later one with `why` (the first one given), and drops
  // the sends not yet pushed (their memory is the caller's, which an ended operation may free).
  // Sticky.
  void Interrupt(absl::Status why);

  // Whether `peer` shares this link (a member other than this rank), and whether every other
  // rank of the group does.
  bool reaches(int peer) const {
    return peer >= 0 && peer < world_size_ && peer != rank_ && local_index_[peer] >= 0;
  }
  bool reaches_all() const { return static_cast<int>(members_.size()) == world_size_; }

  // Bytes of the rings this rank sends into or receives from: the part of the segment it
  // touches, resident in its RSS as shared memory.
  int64_t ring_bytes() const { return ring_bytes_; }

  bool needs_landing(int peer) const override { return false; }
  void Send(int peer, uint64_t slot, const void* data, size_t bytes) override;
  void PostReceive(int peer, uint64_t slot, void* landing, size_t bytes) override {}
  absl::Status Receive(int peer, uint64_t slot, void* landing, size_t bytes, absl::Time deadline,
                       Consumer consume) override;
  absl::Status WaitSends(absl::Time deadline) override;

  // The shared layout (public for the .cc's helpers; nothing outside uses it).
  struct Bell;
  struct RingCounters;
  struct ChunkHeader;
  struct Ring {
    RingCounters* counters = nullptr;
    ChunkHeader* chunks = nullptr;
    char* data = nullptr;
    uint64_t count = 0;  // chunks
    size_t chunk_bytes = 0;
  };

 private:
  struct PendingSend {
    uint64_t slot;
    const char* data;
    size_t bytes;
    size_t sent;
  };

  ShmLink(int rank, int world_size, std::vector<int> members, void* base, size_t bytes,
          size_t slot_bytes, int slots);

  // Pushes queued sends into their rings as far as they have room; whether anything moved.
  bool PushSends() ABSL_LOCKS_EXCLUDED(send_mu_);
  bool PushSendsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(send_mu_);
  bool HasQueuedSendsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(send_mu_);
  // The pusher thread's loop (links that are not the whole group).
  void PushInBackground() ABSL_LOCKS_EXCLUDED(send_mu_);
  // This rank's bell, and `rank`'s (a member).
  Bell& BellOf(int rank);
  // Tells `rank` (its bell) that something it may wait for happened. Wakes only counted sleepers:
  // a thread that counts itself after the ring sees the change before it sleeps (its `seen`
  // sequence is stale, or it looks again at what changed).
  void RingBell(int rank);
  // Waits until `ready()` (pushing queued sends meanwhile); an error at the deadline or on an
  // interrupt.
  template <typename Ready>
  absl::Status WaitUntil(Ready ready, absl::Time deadline);
  absl::Status Interruption() const;

  const int rank_;
  const int world_size_;
  const std::vector<int> members_;  // the ranks sharing the segment, ascending
  std::vector<int> local_index_;    // [rank]: its place in members_, -1 for non-members
  void* const base_;
  const size_t bytes_;
  int64_t ring_bytes_ = 0;
  Bell* bells_ = nullptr;       // one per member, by local index
  std::vector<Ring> outgoing_;  // [peer]: this rank -> peer (members only)
  std::vector<Ring> incoming_;  // [peer]: peer -> this rank (members only)

  mutable absl::Mutex send_mu_;
  std::vector<std::deque<PendingSend>> outbox_ ABSL_GUARDED_BY(send_mu_);  // [peer], send order
  bool stopping_ ABSL_GUARDED_BY(send_mu_) = false;

  std::atomic<bool> interrupted_{false};
  mutable absl::Mutex mu_;
  absl::Status interruption_ ABSL_GUARDED_BY(mu_);

  // Last: started once everything above is set up, joined first by the destructor.
  std::thread pusher_;
};

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_SHM_LINK_H_

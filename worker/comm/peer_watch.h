// PeerWatch: one plain TCP connection from a rank to each of its peers, watched by a thread, so
// that a peer whose process ends is noticed at once, whatever the collectives are doing.
#ifndef ZEROSHARD_WORKER_COMM_PEER_WATCH_H_
#define ZEROSHARD_WORKER_COMM_PEER_WATCH_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/abort_signal.h"
#include "worker/comm/store.h"

namespace zeroshard::comm {

struct PeerWatchOptions {
  int rank = 0;
  int world_size = 2;
  Store* store = nullptr;
  // Rank r publishes "<store_prefix>/watch/<r>" = "<numeric host> <port>" of its listener.
  std::string store_prefix = "gloo";
  // The address this rank listens on and announces to its peers.
  std::string hostname = "127.0.0.1";
  // Connecting (store waits included) ends by then.
  absl::Time deadline = absl::InfiniteFuture();
  // Optional. Aborting it ends Connect within one poll slice (50 ms).
  AbortSignal* abort_signal = nullptr;
};

// Why: Debian's Gloo (2022) wakes the operations of a pair whose connection breaks only if they
// are queued; the receive whose message was partly read when the peer died is not (tcp::Pair::
// signalException skips the operation in rx_), so a rank whose peer was killed mid-message
// waited for its collective's whole timeout. These connections carry no data: a peer's
// connection ending (EOF or a socket error, e.g. the kernel closing a killed process's sockets)
// is the signal. A rank that stops watching says why first, in one byte: a farewell (its work is
// done; not reported) or "leaving" (its group failed or was aborted, but it lives on: reported,
// since the group is broken, but not as lost). A connection that ends without a word is a peer
// whose process died: reported, and listed in lost_ranks(), which the coordinator uses to know
// which members not to wait for. TCP keepalive (about 16 s) covers a peer whose machine vanished
// without closing anything.
//
// Rank i connects to every rank below it and tells it its rank (4 bytes); it accepts the
// connections of the ranks above it.
//
// Thread contract: Connect and Start are called once, by the owner. Stop may be called from any
// thread but the one running `on_lost`, and more than once; it returns once the watch thread
// has ended. ended() and lost_ranks() are thread-safe.
class PeerWatch {
 public:
  // Runs on the watch thread, at most once, for the first peer gone without a farewell; must
  // not call Stop.
  using PeerLost = std::function<void(absl::Status why)>;

  // What Stop tells the peers still connected before it closes the connections.
  enum class Parting {
    // This rank's work is done: peers see the connection end and report nothing.
    kFarewell,
    // This rank leaves a group that failed or was aborted, and its process lives on: peers
    // report that it left, not that it was lost.
    kLeaving,
    // Nothing, as when the process is killed: peers report this rank lost. Tests stand in for
    // a kill with it.
    kSilent,
  };

  // Connects to every peer. CANCELLED when aborted, DEADLINE_EXCEEDED when a peer does not show
  // up by the deadline, UNAVAILABLE for socket and store failures, INVALID_ARGUMENT for bad
  // options or a peer that sends a bad rank.
  static absl::StatusOr<std::unique_ptr<PeerWatch>> Connect(const PeerWatchOptions& options);

  // Stop(Parting::kLeaving).
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // Starts the watch thread: `on_lost` gets UNAVAILABLE naming the first peer whose connection
  // ends without a farewell ("lost peer rank R" when it said nothing, "peer rank R left" when it
  // said it was leaving).
  void Start(PeerLost on_lost);
  // Ends the watch thread, looks once more at each open connection (a peer that died just now
  // counts as lost), then tells each open connection `parting` and closes it. Idempotent.
  void Stop(Parting parting);

  // The peer connections that ended so far (as the watch thread, then Stop, saw them).
  struct Ended {
    int with_farewell = 0;
    int leaving = 0;  // said it was leaving
    int lost = 0;     // said nothing
  };
  Ended ended() const;

  // The ranks of the peers lost (their connections ended without a word), in the order seen.
  std::vector<int> lost_ranks() const;

 private:
  struct Peer {
    int rank = -1;
    int fd = -1;
    bool said_farewell = false;
    bool said_leaving = false;
  };

  PeerWatch(int rank, std::vector<Peer> peers, int wake_read, int wake_write);
  void WatchLoop(PeerLost on_lost);
  // Reads what `peer` said, without blocking. While its connection is open: nullopt. Once it has
  // ended: closes it, counts it (listing it as lost when it said nothing) and says how it ended.
  std::optional<std::string> ReadUntilEnd(Peer& peer);

  const int rank_;
  std::vector<Peer> peers_;  // the watch thread's while it runs; Stop's after
  const int wake_read_;      // a pipe: Stop writes a byte to end the watch thread
  const int wake_write_;
  std::thread thread_;

  absl::Mutex stop_mu_;  // held for the whole of Stop, so a second caller waits for the first
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;

  mutable absl::Mutex mu_;
  Ended ended_ ABSL_GUARDED_BY(mu_);
  std::vector<int> lost_ranks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_PEER_WATCH_H_

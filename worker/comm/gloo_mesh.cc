// ConnectGlooMeshes: Gloo TCP pairs created, published, fetched and connected by hand, with
// every pair closable from another thread (abort, deadline).
#include "worker/comm/gloo_mesh.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gloo/context.h"
#include "gloo/transport/context.h"
#include "gloo/transport/device.h"
#include "gloo/transport/pair.h"
#include "gloo/transport/tcp/device.h"

namespace zeroshard::comm {
namespace {

constexpr char kStopBeforeConnectingVariable[] = "ZEROSHARD_TESTONLY_STOP_BEFORE_CONNECTING";

// The longest one store wait runs before the rendezvous checks for an abort again: a Store
// cannot be interrupted in general (CoordinatorStore can, given the same AbortSignal).
constexpr absl::Duration kStorePollSlice = absl::Milliseconds(100);

std::chrono::milliseconds ToGlooTimeout(absl::Duration remaining) {
  constexpr int64_t kLongestWaitMs = int64_t{24} * 3600 * 1000;
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(remaining, absl::Milliseconds(1)));
  return std::chrono::milliseconds(std::clamp<int64_t>(ms, 1, kLongestWaitMs));
}

// A gloo::Context over a transport context connected here: what connectFullMesh leaves in a
// gloo::rendezvous::Context. Thread contract: gloo::Context's (used by one thread at a time).
class ConnectedContext : public gloo::Context {
 public:
  ConnectedContext(int rank, int size, std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::transport::Context> transport,
                   std::chrono::milliseconds timeout)
      : gloo::Context(rank, size) {
    device_ = std::move(device);
    transportContext_ = std::move(transport);
    setTimeout(timeout);
  }
};

// One lane's device (its event loop) and its pairs. The context goes first on destruction:
// its pairs unregister from the device's loop.
struct Lane {
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::transport::Context> context;
};

// The pairs of a rendezvous in progress and the first reason to close them.
//
// Thread contract: thread-safe. The rendezvous thread adds pairs and reads closed(); the abort
// signal's callback and the deadline watcher call Close from their threads.
class PairCloser {
 public:
  // A pair added after Close is closed at once.
  void Add(gloo::transport::Pair* pair) {
    absl::MutexLock lock(&mu_);
    pairs_.push_back(pair);
    if (!closed_.ok()) pair->close();
  }

  // Hard-closes every pair (a Pair::connect blocked on one returns) and records `why`.
  void Close(absl::Status why) {
    absl::MutexLock lock(&mu_);
    CloseLocked(std::move(why));
  }

  // OK until Close.
  absl::Status closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

  // Closes with DEADLINE_EXCEEDED when `deadline` passes before Finish().
  void CloseAtDeadline(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithDeadline(absl::Condition(&finished_), deadline)) return;
    CloseLocked(absl::DeadlineExceededError(
        "the peers did not all publish their addresses and connect within the rendezvous "
        "timeout"));
  }

  void Finish() {
    absl::MutexLock lock(&mu_);
    finished_ = true;
  }

 private:
  void CloseLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!closed_.ok()) return;
    closed_ = std::move(why);
    for (gloo::transport::Pair* pair : pairs_) {
      try {
        pair->close();
      } catch (const std::exception&) {
        // Closing is all that is left to do with this pair; the rendezvous fails either way.
      }
    }
  }

  mutable absl::Mutex mu_;
  std::vector<gloo::transport::Pair*> pairs_ ABSL_GUARDED_BY(mu_);
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// Enforces the deadline on a blocking Pair::connect, which only Gloo's own (much longer) timeout
// would end otherwise: a thread that closes the pairs at the deadline unless finished first.
// Thread contract: created and destroyed by the rendezvous thread; its own thread only calls the
// closer.
class DeadlineWatcher {
 public:
  DeadlineWatcher(PairCloser* closer, absl::Time deadline)
      : closer_(closer), thread_([closer, deadline] { closer->CloseAtDeadline(deadline); }) {}
  ~DeadlineWatcher() {
    closer_->Finish();
    thread_.join();
  }
  DeadlineWatcher(const DeadlineWatcher&) = delete;
  DeadlineWatcher& operator=(const DeadlineWatcher&) = delete;

 private:
  PairCloser* const closer_;
  std::thread thread_;
};

std::string AddressKey(const GlooMeshOptions& options, int rank) {
  return absl::StrCat(options.store_prefix, "/addresses/", rank);
}

// One rank's rendezvous: creates, publishes, fetches and connects.
// Thread contract: runs on the caller's thread; only the closer is shared with other threads.
class Rendezvous {
 public:
  Rendezvous(const GlooMeshOptions& options, std::vector<Lane>& lanes, PairCloser& closer)
      : options_(options), lanes_(lanes), closer_(closer), peers_(options.world_size - 1) {}

  // On failure, the error to return unless the closer has one.
  absl::Status Run() {
    if (absl::Status closed = closer_.closed(); !closed.ok()) return closed;
    std::string published;
    try {
      for (Lane& lane : lanes_) {
        gloo::transport::tcp::attr attr;
        attr.hostname = options_.hostname;
        lane.device = gloo::transport::tcp::CreateDevice(attr);
        lane.context = lane.device->createContext(options_.rank, options_.world_size);
        lane.context->setTimeout(ToGlooTimeout(options_.deadline - absl::Now()));
        for (int peer = 0; peer < options_.world_size; ++peer) {
          if (peer == options_.rank) continue;
          gloo::transport::Pair* pair = lane.context->createPair(peer).get();
          closer_.Add(pair);
          const std::vector<char> address = pair->address().bytes();
          published.append(address.data(), address.size());
        }
      }
    } catch (const std::exception& e) {
      return Failure(absl::StrCat("creating the pairs: ", e.what()));
    }
    address_bytes_ = published.size() / (lanes_.size() * peers_);
    if (absl::Status set = options_.store->Set(AddressKey(options_, options_.rank), published);
        !set.ok()) {
      return Failure(absl::StrCat("publishing the addresses: ", set.ToString()));
    }
    if (const char* stop = std::getenv(kStopBeforeConnectingVariable);
        stop != nullptr && std::string(stop) == "1") {
      std::raise(SIGSTOP);
    }
    std::vector<std::string> addresses(options_.world_size);
    for (int peer = 0; peer < options_.world_size; ++peer) {
      if (peer == options_.rank) continue;
      absl::StatusOr<std::string> value = WaitForAddresses(peer);
      if (!value.ok()) return value.status();
      addresses[peer] = *std::move(value);
    }
    for (size_t lane = 0; lane < lanes_.size(); ++lane) {
      for (int peer = 0; peer < options_.world_size; ++peer) {
        if (peer == options_.rank) continue;
        if (absl::Status closed = closer_.closed(); !closed.ok()) return closed;
        // The peer listed its pairs lane by lane, each lane's in rank order without itself.
        const size_t index =
            lane * peers_ + (options_.rank < peer ? options_.rank : options_.rank - 1);
        const std::vector<char> address(addresses[peer].begin() + index * address_bytes_,
                                        addresses[peer].begin() + (index + 1) * address_bytes_);
        try {
          // Returns early, without an error, when the closer closes the pair.
          lanes_[lane].context->getPair(peer)->connect(address);
        } catch (const std::exception& e) {
          return Failure(absl::StrCat("connecting lane ", lane, " to rank ", peer, ": ", e.what()));
        }
      }
    }
    return closer_.closed();
  }

 private:
  // The abort or the deadline, when either closed the pairs (the store or Gloo error is then
  // only their consequence); otherwise UNAVAILABLE with `what`.
  absl::Status Failure(absl::string_view what) {
    if (options_.abort_signal != nullptr && options_.abort_signal->aborted()) {
      return absl::CancelledError("rendezvous aborted");
    }
    if (absl::Status closed = closer_.closed(); !closed.ok()) return closed;
    return absl::UnavailableError(absl::StrCat("gloo rendezvous of rank ", options_.rank, "/",
                                               options_.world_size, ": ", what));
  }

  // Polls the store in short slices, so an abort is seen within one slice whatever the Store.
  absl::StatusOr<std::string> WaitForAddresses(int peer) {
    const std::string key = AddressKey(options_, peer);
    while (true) {
      if (absl::Status closed = closer_.closed(); !closed.ok()) return closed;
      const absl::Duration remaining = options_.deadline - absl::Now();
      if (remaining <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(absl::StrCat(
            "rank ", peer, " did not publish its addresses within the rendezvous timeout"));
      }
      absl::StatusOr<std::string> value =
          options_.store->Get(key, std::min(remaining, kStorePollSlice));
      if (value.ok()) {
        if (value->size() != lanes_.size() * peers_ * address_bytes_) {
          return absl::FailedPreconditionError(absl::StrCat(
              "rank ", peer, " published ", value->size(), " bytes of addresses, expected ",
              lanes_.size() * peers_ * address_bytes_, " (another world size or build?)"));
        }
        return value;
      }
      if (!absl::IsDeadlineExceeded(value.status())) {
        return Failure(
            absl::StrCat("waiting for rank ", peer, "'s addresses: ", value.status().ToString()));
      }
    }
  }

  const GlooMeshOptions& options_;
  std::vector<Lane>& lanes_;
  PairCloser& closer_;
  const size_t peers_;
  size_t address_bytes_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<std::shared_ptr<gloo::Context>>> ConnectGlooMeshes(
    const GlooMeshOptions& options) {
  if (options.world_size < 2 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("a mesh needs rank < world_size >= 2, got rank ",
                                                   options.rank, " of ", options.world_size));
  }
  if (options.lanes < 1 || options.store == nullptr) {
    return absl::InvalidArgumentError("a mesh needs lanes >= 1 and a store");
  }
  // Declared before the closer: its pairs outlive every thread that may close them.
  std::vector<Lane> lanes(options.lanes);
  PairCloser closer;
  absl::Status status;
  {
    std::optional<AbortSignal::Registration> on_abort;
    if (options.abort_signal != nullptr) {
      on_abort.emplace(options.abort_signal->OnAbort(
          [&closer] { closer.Close(absl::CancelledError("rendezvous aborted")); }));
    }
    DeadlineWatcher watcher(&closer, options.deadline);
    status = Rendezvous(options, lanes, closer).Run();
  }
  // Nothing closes pairs any more. A close that came after the last connect still wins: those
  // connections are gone.
  if (absl::Status closed = closer.closed(); !closed.ok()) return closed;
  if (!status.ok()) return status;
  std::vector<std::shared_ptr<gloo::Context>> contexts;
  for (Lane& lane : lanes) {
    const std::chrono::milliseconds timeout = lane.context->getTimeout();
    contexts.push_back(std::make_shared<ConnectedContext>(options.rank, options.world_size,
                                                          std::move(lane.device),
                                                          std::move(lane.context), timeout));
  }
  return contexts;
}

}  // namespace zeroshard::comm

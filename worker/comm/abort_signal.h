// AbortSignal: a one-way "stop now" shared by the owner of some work (a training run) and the
// blocking calls that work makes (a rendezvous, store RPCs), which register how to end early.
#ifndef ZEROSHARD_WORKER_COMM_ABORT_SIGNAL_H_
#define ZEROSHARD_WORKER_COMM_ABORT_SIGNAL_H_

#include <cstdint>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace zeroshard::comm {

// A blocking call that can be interrupted registers a callback for as long as it blocks (e.g.
// one that closes its sockets or cancels its RPC); Abort() runs the callbacks registered at that
// moment and every later registration's at once. Aborting cannot be undone.
//
// Thread contract: thread-safe. Callbacks run with the signal's lock held (so a Registration's
// destructor waits for its callback to finish, and what the callback touches may be destroyed
// right after it): they must be quick and must not call into the same AbortSignal.
class AbortSignal {
 public:
  // Keeps a callback registered until destroyed (or moved from).
  class Registration {
   public:
    Registration(Registration&& other) noexcept;
    Registration& operator=(Registration&&) = delete;
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;
    // Unregisters; if Abort() is running the callback at that moment, waits for it to return.
    ~Registration();

   private:
    friend class AbortSignal;
    Registration(AbortSignal* signal, uint64_t id) : signal_(signal), id_(id) {}

    AbortSignal* signal_;  // null once moved from, or when OnAbort ran the callback itself
    uint64_t id_;
  };

  AbortSignal() = default;
  AbortSignal(const AbortSignal&) = delete;
  AbortSignal& operator=(const AbortSignal&) = delete;
  // Every Registration must be gone by then.
  ~AbortSignal();

  // Marks the signal aborted and runs the registered callbacks, each once, on this thread.
  // Idempotent.
  void Abort();
  bool aborted() const;

  // Registers `on_abort`; when already aborted, runs it here before returning instead.
  [[nodiscard]] Registration OnAbort(std::function<void()> on_abort);

 private:
  void Unregister(uint64_t id);

  mutable absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_ABORT_SIGNAL_H_

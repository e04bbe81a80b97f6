// The coordinator's rendezvous store: a key-value store per (job, generation) with waiting Gets,
// atomic counters and bounded sizes, built for gRPC callback reactors (no thread per waiter).
#ifndef ZEROSHARD_COORDINATOR_RENDEZVOUS_STORE_H_
#define ZEROSHARD_COORDINATOR_RENDEZVOUS_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace zeroshard::coordinator {

struct RendezvousLimits {
  // A key is 1..max_key_bytes bytes.
  int64_t max_key_bytes = 512;
  // A value is 0..max_value_bytes bytes.
  int64_t max_value_bytes = 1 << 20;
  // Keys (set values, not waiters) one namespace may hold at once.
  int64_t max_keys_per_namespace = 4096;
  // Bytes of keys and values one namespace may hold at once (flag
  // --max_store_bytes_per_namespace): without it, max_keys_per_namespace full-size values are
  // about 4 GiB.
  int64_t max_bytes_per_namespace = 64 << 20;
  // Gets waiting at once, over all namespaces (flag --max_parked_store_gets); each holds a
  // gRPC call.
  int64_t max_parked_gets = 10000;
  // The longest a Get may wait.
  absl::Duration max_wait = absl::Minutes(10);
};

// Thread contract: every method is thread-safe. Callbacks given to Get run exactly once, on the
// calling thread (when the outcome is known at once), on a thread that calls Set / Add /
// OpenNamespace / DropNamespace / DropJob / CancelWait / ExpireDueWaiters, on the store's one
// timer thread, or in the destructor; never with the store's mutex held, so they may call back
// into the store. The destructor must not race with other calls.
//
// Each job has at most one live namespace: the newest generation opened for it. Opening a newer
// generation drops the older one. Calls naming an older generation get FAILED_PRECONDITION
// ("stale"), a newer one FAILED_PRECONDITION ("not started"), a dropped one FAILED_PRECONDITION
// ("ended"), and a job never opened (or dropped with DropJob) NOT_FOUND.
class RendezvousStore {
 public:
  // Identifies a pending Get; 0 means the Get completed before it returned.
  using WaiterId = uint64_t;
  using GetCallback = std::function<void(absl::StatusOr<std::string>)>;

  // `clock` must outlive the store. Starts the store's timer thread.
  explicit RendezvousStore(common::Clock* clock, RendezvousLimits limits = {});
  // Fails pending waiters with CANCELLED ("coordinator shutting down") and joins the timer thread.
  ~RendezvousStore();

  RendezvousStore(const RendezvousStore&) = delete;
  RendezvousStore& operator=(const RendezvousStore&) = delete;

  // Opens generation `generation` of `job_id` with an empty namespace when it is newer than every
  // generation opened for the job so far, dropping the job's older namespace (its waiters get
  // FAILED_PRECONDITION). Otherwise does nothing: an ended generation is never reopened.
  void OpenNamespace(const std::string& job_id, int64_t generation);
  // Ends generation `generation` of `job_id` (its waiters get FAILED_PRECONDITION). Does nothing
  // unless it is the job's live namespace. The job stays known, so later calls say "ended".
  void DropNamespace(const std::string& job_id, int64_t generation);
  // Forgets the job and its namespace (waiters get FAILED_PRECONDITION); later calls get NOT_FOUND.
  void DropJob(const std::string& job_id);

  // Stores `value` under `key`, waking every Get waiting for that key.
  absl::Status Set(const std::string& job_id, int64_t generation, const std::string& key,
                   std::string value);

  // Calls `done` exactly once: with the value as soon as `key` exists (inline, before Get returns,
  // when it exists already); with NOT_FOUND at once when it is absent and `timeout` is zero; with
  // DEADLINE_EXCEEDED when `timeout` passes first; with FAILED_PRECONDITION when the namespace is
  // dropped meanwhile; with CANCELLED on CancelWait or store shutdown; or inline with the
  // validation error. Returns the id of the pending wait, or 0 when `done` already ran. Another
  // thread may complete the wait before Get returns its id; a CancelWait with it is then a no-op.
  WaiterId Get(const std::string& job_id, int64_t generation, const std::string& key,
               absl::Duration timeout, GetCallback done);

  // Completes pending wait `waiter` with CANCELLED ("wait cancelled by the client"). Returns
  // false (and does nothing) when it is not pending: its outcome was already decided (its callback
  // has run or is about to run with that outcome), it was cancelled, or it was never issued.
  bool CancelWait(WaiterId waiter);

  // Adds `delta` to the decimal integer under `key` (a missing key counts as 0), stores the sum
  // as decimal text (waking its Gets) and returns it. A value that is not a decimal integer gets
  // FAILED_PRECONDITION; a sum beyond int64 gets OUT_OF_RANGE.
  absl::StatusOr<int64_t> Add(const std::string& job_id, int64_t generation, const std::string& key,
                              int64_t delta);

  // Removes `key`; returns whether it existed. Gets waiting for it keep waiting.
  absl::StatusOr<bool> Delete(const std::string& job_id, int64_t generation,
                              const std::string& key);

  // Completes every waiter whose deadline is at or before the clock's now with DEADLINE_EXCEEDED.
  // The timer thread calls it; tests call it to run expiry synchronously after FakeClock::Advance.
  void ExpireDueWaiters();

  // Gets currently waiting, over all namespaces.
  int64_t PendingWaiters() const;
  // Blocks until at least `count` Gets are waiting or `timeout` (real time) passes; returns
  // whether they are. Lets a test wait for calls it parks through gRPC without polling.
  bool AwaitPendingWaiters(int64_t count, absl::Duration timeout) const;
  // Jobs known to the store (with or without a live namespace).
  int64_t KnownJobs() const;

 private:
  struct Namespace {
    // Declared, not implicit: clang decides std::optional<Namespace> is not default-constructible
    // when the implicit constructor needs a member initializer of a class still being defined.
    Namespace();
    // Every value is non-null.
    absl::flat_hash_map<std::string, std::shared_ptr<const std::string>> values;
    // Bytes of the keys and values in `values`.
    int64_t bytes = 0;
    // Pending waiters per key; a key's set is never empty (removed with its last waiter).
    absl::flat_hash_map<std::string, absl::flat_hash_set<WaiterId>> waiters_by_key;
  };

  struct JobRecord {
    // The newest generation opened for the job.
    int64_t latest_generation = 0;
    // The namespace of `latest_generation`; empty once that generation has ended.
    std::optional<Namespace> live;
  };

  struct Waiter {
    std::string job_id;
    std::string key;
    absl::Time deadline;
    GetCallback done;
  };

  // A Get outcome decided under the lock and delivered after it is released: `value` is set
  // exactly when `status` is OK.
  struct Completion {
    GetCallback done;
    absl::Status status;
    std::shared_ptr<const std::string> value;
  };

  absl::Status ValidateKey(const std::string& key) const;
  // The live namespace of (job_id, generation), or the error that says why there is none.
  absl::StatusOr<Namespace*> FindNamespace(const std::string& job_id, int64_t generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores `value` under `key` and moves the key's waiters to `completions`.
  absl::Status StoreLocked(Namespace& ns, const std::string& key,
                           std::shared_ptr<const std::string> value,
                           std::vector<Completion>& completions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes pending waiter `id` from every index and appends its completion with `status`
  // (and `value` when `status` is OK). With `remove_from_namespace` false the caller removes it
  // from its namespace's waiters_by_key.
  // REQUIRES: `id` is pending.
  void CompleteWaiterLocked(WaiterId id, absl::Status status,
                            std::shared_ptr<const std::string> value, bool remove_from_namespace,
                            std::vector<Completion>& completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails every waiter of `ns` with `status` and empties its waiter index.
  void FailNamespaceWaitersLocked(Namespace& ns, const absl::Status& status,
                                  std::vector<Completion>& completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<Completion> TakeDueWaitersLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void RunCompletions(std::vector<Completion> completions);

  // The timer thread's body: sleeps on the clock until the earliest deadline, an earlier new
  // deadline, or shutdown, and expires due waiters.
  void TimerLoop();
  bool TimerShouldWake() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  common::Clock* const clock_;
  const RendezvousLimits limits_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  // Every pending waiter. Invariant: a waiter is in `waiters_` exactly when it is in
  // `deadlines_` and in the `waiters_by_key` of its job's live namespace.
  absl::flat_hash_map<WaiterId, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  // Pending waiters ordered by deadline (then id).
  std::set<std::pair<absl::Time, WaiterId>> deadlines_ ABSL_GUARDED_BY(mu_);
  // The id the next waiter gets; ids are never reused, so a stale CancelWait is harmless.
  WaiterId next_waiter_id_ ABSL_GUARDED_BY(mu_) = 1;
  // The deadline the timer thread sleeps until; it wakes early when an earlier one appears.
  absl::Time timer_sleep_until_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // Set once by the destructor; new Gets then fail with CANCELLED.
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;

  // Started last in the constructor, joined by the destructor.
  std::thread timer_thread_;
};

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_RENDEZVOUS_STORE_H_

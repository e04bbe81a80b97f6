// The rendezvous store: namespaces per (job, generation), waiters indexed by key and by deadline,
// and one timer thread that expires waiters on the injected clock.
#include "coordinator/rendezvous_store.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/dcheck.h"
#include "common/status_macros.h"

namespace zeroshard::coordinator {

RendezvousStore::Namespace::Namespace() = default;

RendezvousStore::RendezvousStore(common::Clock* clock, RendezvousLimits limits)
    : clock_(clock), limits_(limits) {
  timer_thread_ = std::thread([this] { TimerLoop(); });
}

RendezvousStore::~RendezvousStore() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  timer_thread_.join();
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    std::vector<WaiterId> pending;
    pending.reserve(waiters_.size());
    for (const auto& [id, waiter] : waiters_) pending.push_back(id);
    for (WaiterId id : pending) {
      CompleteWaiterLocked(id, absl::CancelledError("coordinator shutting down"), nullptr,
                           /*remove_from_namespace=*/true, completions);
    }
  }
  RunCompletions(std::move(completions));
}

void RendezvousStore::OpenNamespace(const std::string& job_id, int64_t generation) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = jobs_.try_emplace(job_id);
    JobRecord& job = it->second;
    if (!inserted && generation <= job.latest_generation) return;
    if (job.live.has_value()) {
      FailNamespaceWaitersLocked(
          *job.live,
          absl::FailedPreconditionError(absl::StrCat("generation: ", job.latest_generation,
                                                     " is stale (current is ", generation, ")")),
          completions);
    }
    job.latest_generation = generation;
    job.live.emplace();
  }
  RunCompletions(std::move(completions));
}

void RendezvousStore::DropNamespace(const std::string& job_id, int64_t generation) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return;
    JobRecord& job = it->second;
    if (job.latest_generation != generation || !job.live.has_value()) return;
    FailNamespaceWaitersLocked(*job.live,
                               absl::FailedPreconditionError(absl::StrCat(
                                   "generation: ", generation, " of job '", job_id, "' has ended")),
                               completions);
    job.live.reset();
  }
  RunCompletions(std::move(completions));
}

void RendezvousStore::DropJob(const std::string& job_id) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return;
    if (it->second.live.has_value()) {
      FailNamespaceWaitersLocked(
          *it->second.live,
          absl::FailedPreconditionError(absl::StrCat("job_id: job '", job_id, "' has ended")),
          completions);
    }
    jobs_.erase(it);
  }
  RunCompletions(std::move(completions));
}

absl::Status RendezvousStore::Set(const std::string& job_id, int64_t generation,
                                  const std::string& key, std::string value) {
  ZS_RETURN_IF_ERROR(ValidateKey(key));
  if (static_cast<int64_t>(value.size()) > limits_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("value: ", value.size(),
                                                   " bytes exceeds the maximum of ",
                                                   limits_.max_value_bytes, " bytes"));
  }
  auto shared_value = std::make_shared<const std::string>(std::move(value));
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    ZS_ASSIGN_OR_RETURN(Namespace * ns, FindNamespace(job_id, generation));
    ZS_RETURN_IF_ERROR(StoreLocked(*ns, key, std::move(shared_value), completions));
  }
  RunCompletions(std::move(completions));
  return absl::OkStatus();
}

RendezvousStore::WaiterId RendezvousStore::Get(const std::string& job_id, int64_t generation,
                                               const std::string& key, absl::Duration timeout,
                                               GetCallback done) {
  absl::Status invalid = ValidateKey(key);
  if (invalid.ok() && timeout < absl::ZeroDuration()) {
    invalid = absl::InvalidArgumentError(
        absl::StrCat("timeout_ms: must not be negative, got ", absl::ToInt64Milliseconds(timeout)));
  } else if (invalid.ok() && timeout > limits_.max_wait) {
    invalid = absl::InvalidArgumentError(
        absl::StrCat("timeout_ms: ", absl::ToInt64Milliseconds(timeout), " exceeds the maximum of ",
                     absl::ToInt64Milliseconds(limits_.max_wait)));
  }
  if (!invalid.ok()) {
    done(std::move(invalid));
    return 0;
  }

  absl::Status immediate_error;
  std::shared_ptr<const std::string> immediate_value;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Namespace*> ns = FindNamespace(job_id, generation);
    if (shutting_down_) {
      immediate_error = absl::CancelledError("coordinator shutting down");
    } else if (!ns.ok()) {
      immediate_error = ns.status();
    } else if (auto found = (*ns)->values.find(key); found != (*ns)->values.end()) {
      immediate_value = found->second;
    } else if (timeout == absl::ZeroDuration()) {
      immediate_error = absl::NotFoundError(absl::StrCat("key: '", key, "' is not set"));
    } else if (static_cast<int64_t>(waiters_.size()) >= limits_.max_parked_gets) {
      immediate_error = absl::ResourceExhaustedError(absl::StrCat(
          "max_parked_store_gets: ", waiters_.size(),
          " StoreGets are waiting, the most this coordinator parks at once; retry later"));
    } else {
      const WaiterId id = next_waiter_id_++;
      const absl::Time deadline = clock_->Now() + timeout;
      waiters_.emplace(id, Waiter{job_id, key, deadline, std::move(done)});
      deadlines_.emplace(deadline, id);
      (*ns)->waiters_by_key[key].insert(id);
      return id;
    }
  }
  if (immediate_value != nullptr) {
    done(*immediate_value);
  } else {
    done(std::move(immediate_error));
  }
  return 0;
}

bool RendezvousStore::CancelWait(WaiterId waiter) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    if (!waiters_.contains(waiter)) return false;
    CompleteWaiterLocked(waiter, absl::CancelledError("wait cancelled by the client"), nullptr,
                         /*remove_from_namespace=*/true, completions);
  }
  RunCompletions(std::move(completions));
  return true;
}

absl::StatusOr<int64_t> RendezvousStore::Add(const std::string& job_id, int64_t generation,
                                             const std::string& key, int64_t delta) {
  ZS_RETURN_IF_ERROR(ValidateKey(key));
  int64_t sum = 0;
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    ZS_ASSIGN_OR_RETURN(Namespace * ns, FindNamespace(job_id, generation));
    int64_t current = 0;
    if (auto found = ns->values.find(key); found != ns->values.end()) {
      if (!absl::SimpleAtoi(*found->second, &current)) {
        return absl::FailedPreconditionError(
            absl::StrCat("key: '", key, "' holds a value that is not a decimal integer"));
      }
    }
    if (__builtin_add_overflow(current, delta, &sum)) {
      return absl::OutOfRangeError(absl::StrCat("delta: adding ", delta, " to key '", key, "' (",
                                                current, ") overflows int64"));
    }
    ZS_RETURN_IF_ERROR(
        StoreLocked(*ns, key, std::make_shared<const std::string>(absl::StrCat(sum)), completions));
  }
  RunCompletions(std::move(completions));
  return sum;
}

absl::StatusOr<bool> RendezvousStore::Delete(const std::string& job_id, int64_t generation,
                                             const std::string& key) {
  ZS_RETURN_IF_ERROR(ValidateKey(key));
  absl::MutexLock lock(&mu_);
  ZS_ASSIGN_OR_RETURN(Namespace * ns, FindNamespace(job_id, generation));
  auto found = ns->values.find(key);
  if (found == ns->values.end()) return false;
  ns->bytes -= static_cast<int64_t>(key.size() + found->second->size());
  ns->values.erase(found);
  return true;
}

void RendezvousStore::ExpireDueWaiters() {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    completions = TakeDueWaitersLocked(clock_->Now());
  }
  RunCompletions(std::move(completions));
}

int64_t RendezvousStore::PendingWaiters() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(waiters_.size());
}

bool RendezvousStore::AwaitPendingWaiters(int64_t count, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int64_t>(waiters_.size()) >= count;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

int64_t RendezvousStore::KnownJobs() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(jobs_.size());
}

absl::Status RendezvousStore::ValidateKey(const std::string& key) const {
  if (key.empty()) return absl::InvalidArgumentError("key: must not be empty");
  if (static_cast<int64_t>(key.size()) > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key: ", key.size(), " bytes exceeds the maximum of ", limits_.max_key_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RendezvousStore::Namespace*> RendezvousStore::FindNamespace(
    const std::string& job_id, int64_t generation) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("job_id: no rendezvous namespace for job '", job_id, "'"));
  }
  JobRecord& job = it->second;
  if (generation < job.latest_generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generation: ", generation, " is stale (current is ", job.latest_generation, ")"));
  }
  if (generation > job.latest_generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generation: ", generation, " has not started (current is ", job.latest_generation, ")"));
  }
  if (!job.live.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("generation: ", generation, " of job '", job_id, "' has ended"));
  }
  return &*job.live;
}

absl::Status RendezvousStore::StoreLocked(Namespace& ns, const std::string& key,
                                          std::shared_ptr<const std::string> value,
                                          std::vector<Completion>& completions) {
  auto existing = ns.values.find(key);
  const int64_t replaced_bytes =
      existing == ns.values.end() ? 0 : static_cast<int64_t>(key.size() + existing->second->size());
  const int64_t new_bytes = static_cast<int64_t>(key.size() + value->size());
  if (ns.bytes - replaced_bytes + new_bytes > limits_.max_bytes_per_namespace) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_store_bytes_per_namespace: the namespace holds ", ns.bytes, " bytes; storing ",
        new_bytes, " more (key and value) would exceed its maximum of ",
        limits_.max_bytes_per_namespace, " bytes"));
  }
  if (existing != ns.values.end()) {
    existing->second = value;
  } else {
    if (static_cast<int64_t>(ns.values.size()) >= limits_.max_keys_per_namespace) {
      return absl::ResourceExhaustedError(absl::StrCat("key: namespace holds the maximum of ",
                                                       limits_.max_keys_per_namespace, " keys"));
    }
    ns.values.emplace(key, value);
  }
  ns.bytes += new_bytes - replaced_bytes;
  auto waiting = ns.waiters_by_key.find(key);
  if (waiting == ns.waiters_by_key.end()) return absl::OkStatus();
  for (WaiterId id : waiting->second) {
    CompleteWaiterLocked(id, absl::OkStatus(), value, /*remove_from_namespace=*/false, completions);
  }
  ns.waiters_by_key.erase(waiting);
  return absl::OkStatus();
}

void RendezvousStore::CompleteWaiterLocked(WaiterId id, absl::Status status,
                                           std::shared_ptr<const std::string> value,
                                           bool remove_from_namespace,
                                           std::vector<Completion>& completions) {
  auto it = waiters_.find(id);
  ZS_DCHECK(it != waiters_.end()) << "waiter " << id << " is not pending";
  Waiter& waiter = it->second;
  const size_t deadlines_erased = deadlines_.erase({waiter.deadline, id});
  ZS_DCHECK_EQ(deadlines_erased, 1u) << "waiter " << id;
  if (remove_from_namespace) {
    auto job = jobs_.find(waiter.job_id);
    ZS_DCHECK(job != jobs_.end() && job->second.live.has_value())
        << "waiter " << id << " of job '" << waiter.job_id << "' has no live namespace";
    Namespace& live = *job->second.live;
    auto waiting = live.waiters_by_key.find(waiter.key);
    ZS_DCHECK(waiting != live.waiters_by_key.end() && waiting->second.contains(id))
        << "waiter " << id << " is not indexed under key '" << waiter.key << "'";
    waiting->second.erase(id);
    if (waiting->second.empty()) live.waiters_by_key.erase(waiting);
  }
  completions.push_back(Completion{std::move(waiter.done), std::move(status), std::move(value)});
  waiters_.erase(it);
  ZS_DCHECK_EQ(waiters_.size(), deadlines_.size());
}

void RendezvousStore::FailNamespaceWaitersLocked(Namespace& ns, const absl::Status& status,
                                                 std::vector<Completion>& completions) {
  for (const auto& [key, ids] : ns.waiters_by_key) {
    for (WaiterId id : ids) {
      CompleteWaiterLocked(id, status, nullptr, /*remove_from_namespace=*/false, completions);
    }
  }
  ns.waiters_by_key.clear();
}

std::vector<RendezvousStore::Completion> RendezvousStore::TakeDueWaitersLocked(absl::Time now) {
  std::vector<Completion> completions;
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const WaiterId id = deadlines_.begin()->second;
    const std::string& key = waiters_.find(id)->second.key;
    absl::Status expired = absl::DeadlineExceededError(
        absl::StrCat("timeout_ms: key '", key, "' was not set before the deadline"));
    CompleteWaiterLocked(id, std::move(expired), nullptr, /*remove_from_namespace=*/true,
                         completions);
  }
  return completions;
}

void RendezvousStore::RunCompletions(std::vector<Completion> completions) {
  for (Completion& completion : completions) {
    if (completion.status.ok()) {
      completion.done(*completion.value);
    } else {
      completion.done(std::move(completion.status));
    }
    completion.value.reset();
  }
}

bool RendezvousStore::TimerShouldWake() const {
  return shutting_down_ || (!deadlines_.empty() && deadlines_.begin()->first < timer_sleep_until_);
}

void RendezvousStore::TimerLoop() {
  mu_.Lock();
  while (!shutting_down_) {
    timer_sleep_until_ = deadlines_.empty() ? absl::InfiniteFuture() : deadlines_.begin()->first;
    clock_->AwaitWithDeadline(&mu_, absl::Condition(this, &RendezvousStore::TimerShouldWake),
                              timer_sleep_until_);
    if (shutting_down_) break;
    std::vector<Completion> completions = TakeDueWaitersLocked(clock_->Now());
    if (completions.empty()) continue;
    mu_.Unlock();
    RunCompletions(std::move(completions));
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace zeroshard::coordinator

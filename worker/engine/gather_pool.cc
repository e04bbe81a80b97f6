// zero3's gather pool (gather_pool.h).
#include "worker/engine/gather_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/dcheck.h"
#include "common/status_macros.h"
#include "worker/engine/element_convert.h"

namespace zeroshard::engine {

GatherPool::GatherPool(const sharding::ShardPlan& plan, int64_t rank,
                       sharding::GatherWindows geometry, const Options& options,
                       OwnedPieceOf owned_piece, DeviceOps* device,
                       comm::Communicator* communicator, StepTimer* timer, FirstFailure* failure)
    : plan_(plan),
      rank_(rank),
      geometry_(std::move(geometry)),
      options_(options),
      owned_piece_(std::move(owned_piece)),
      device_(device),
      communicator_(communicator),
      timer_(timer),
      failure_(failure),
      param_size_(numerics::DTypeSize(options.param_dtype)),
      placed_(geometry_.modules.size()),
      tensor_held_(static_cast<size_t>(plan.num_tensors()), 0) {
  ZS_DCHECK(options.windows >= 1) << options.windows;
}

GatherPool::~GatherPool() {
  // The communicator may still write into the arena until its gather is done.
  for (std::shared_ptr<comm::Work>& work : evicted_) work->Wait().IgnoreError();
  for (Placed& placed : placed_) {
    for (std::shared_ptr<comm::Work>& work : placed.gathers) {
      if (work != nullptr) work->Wait().IgnoreError();
    }
  }
}

absl::Status GatherPool::Allocate(CountingAllocator& allocator) {
  window_bytes_ = geometry_.window_elems * param_size_;
  arena_elems_ = geometry_.window_elems * options_.windows;
  ZS_ASSIGN_OR_RETURN(
      arena_, allocator.TryAllocate(MemoryCategory::kGatherPool, arena_elems_ * param_size_));
  return absl::OkStatus();
}

bool GatherPool::CanCoexist(int64_t module, int64_t offset, int64_t other) const {
  const sharding::ModuleRange& range = geometry_.modules[module];
  const sharding::ModuleRange& theirs = geometry_.modules[other];
  const Placed& placed = placed_[other];
  const int64_t begin = offset;
  const int64_t end = offset + range.span_elems();
  if (placed.offset >= end || placed.offset + theirs.span_elems() <= begin) return true;
  if (offset - range.flat_begin != placed.offset - theirs.flat_begin) return false;
  // The same shift: the overlap holds the same elements; each of their buckets in it must be
  // whole.
  for (int64_t b = theirs.first_bucket; b <= theirs.last_bucket; ++b) {
    const sharding::BucketLayout& layout = plan_.buckets()[b];
    const int64_t at = ArenaOffset(other, layout.flat_begin);
    if (at >= end || at + layout.padded_elems <= begin) continue;
    if (!placed.whole[b - theirs.first_bucket]) return false;
  }
  return true;
}

std::optional<int64_t> GatherPool::Place(int64_t module,
                                         const std::vector<char>& protected_modules) const {
  const sharding::ModuleRange& range = geometry_.modules[module];
  // Candidates, best first: the shift of a resident neighbour sharing a bucket (most recently
  // used first), then the fixed places.
  std::vector<std::pair<int64_t, int64_t>> neighbours;  // (last_use, offset)
  for (int64_t other = 0; other < static_cast<int64_t>(placed_.size()); ++other) {
    const Placed& placed = placed_[other];
    const sharding::ModuleRange& theirs = geometry_.modules[other];
    if (!placed.resident || other == module || theirs.last_bucket < range.first_bucket ||
        theirs.first_bucket > range.last_bucket) {
      continue;
    }
    neighbours.emplace_back(placed.last_use, placed.offset - theirs.flat_begin + range.flat_begin);
  }
  std::sort(neighbours.begin(), neighbours.end(), std::greater<>());
  std::vector<int64_t> candidates;
  for (const auto& [last_use, offset] : neighbours) candidates.push_back(offset);
  // Then the arena's end when the walk goes down the flat layout (the module placed last lies
  // above this one: the next ones slide down from there), else its start; then the fixed places.
  const bool walking_down =
      last_placed_ >= 0 && geometry_.modules[last_placed_].flat_begin > range.flat_begin;
  const int64_t start = 0;
  const int64_t end = arena_elems_ - range.span_elems();
  candidates.push_back(walking_down ? end : start);
  candidates.push_back(walking_down ? start : end);
  for (int64_t w = 0; w < options_.windows; ++w) candidates.push_back(w * geometry_.window_elems);
  // The first candidate that evicts nothing, else the one whose evictions were used least
  // recently.
  std::optional<int64_t> best;
  int64_t best_cost = 0;
  for (const int64_t offset : candidates) {
    if (offset < 0 || offset + range.span_elems() > arena_elems_) continue;
    int64_t cost = 0;
    bool possible = true;
    for (int64_t other = 0; other < static_cast<int64_t>(placed_.size()) && possible; ++other) {
      const Placed& placed = placed_[other];
      if (!placed.resident || other == module || CanCoexist(module, offset, other)) continue;
      if (placed.holds > 0 || protected_modules[other]) possible = false;
      cost = std::max(cost, placed.last_use + 1);
    }
    if (!possible) continue;
    if (cost == 0) return offset;
    if (!best.has_value() || cost < best_cost) {
      best = offset;
      best_cost = cost;
    }
  }
  return best;
}

absl::Status GatherPool::Fill(int64_t module, int64_t offset) {
  const sharding::ModuleRange& range = geometry_.modules[module];
  // What the module cannot coexist with leaves: what it was receiving comes first (a host
  // backend waits here, a device orders its stream). Its memory outside the new module's region
  // stays intact, so it can still be copied from below.
  std::vector<int64_t> evicted;
  for (int64_t other = 0; other < static_cast<int64_t>(placed_.size()); ++other) {
    if (!placed_[other].resident || other == module || CanCoexist(module, offset, other)) {
      continue;
    }
    const sharding::ModuleRange& theirs = geometry_.modules[other];
    ZS_RETURN_IF_ERROR(
        AwaitModule(other, theirs.first_bucket, theirs.last_bucket, /*on_host=*/false));
    // On a device the stream is ordered after them but they may still run: their outcome is
    // checked once the step ends (EndStep), as every gather's is.
    for (std::shared_ptr<comm::Work>& work : placed_[other].gathers) {
      if (work != nullptr) evicted_.push_back(std::move(work));
    }
    placed_[other].resident = false;
    evicted.push_back(other);
  }
  last_placed_ = module;
  Placed& placed = placed_[module];
  placed.resident = true;
  placed.offset = offset;
  placed.holds = 0;
  placed.gathers.assign(range.span_buckets(), nullptr);
  placed.ordered.assign(range.span_buckets(), 0);
  placed.whole.assign(range.span_buckets(), 0);
  if (!gathers_since_timings_) {
    timer_->GathersIssued();
    gathers_since_timings_ = true;
  }
  comm::CollectiveOptions collective;
  collective.timeout = options_.collective_timeout;
  const comm::ElementType type = ToElementType(options_.param_dtype);
  char* const arena = arena_.as<char>();
  const int64_t region_end = offset + range.span_elems();
  for (int64_t b = range.first_bucket; b <= range.last_bucket; ++b) {
    const int64_t i = b - range.first_bucket;
    const sharding::BucketLayout& layout = plan_.buckets()[b];
    const int64_t at = ArenaOffset(module, layout.flat_begin);
    // A bucket a resident neighbour holds whole at the same place: the same memory already.
    bool shared = false;
    for (int64_t other = 0; other < static_cast<int64_t>(placed_.size()) && !shared; ++other) {
      const Placed& theirs = placed_[other];
      const sharding::ModuleRange& their_range = geometry_.modules[other];
      if (!theirs.resident || other == module || b < their_range.first_bucket ||
          b > their_range.last_bucket || !theirs.whole[b - their_range.first_bucket] ||
          ArenaOffset(other, layout.flat_begin) != at) {
        continue;
      }
      placed.gathers[i] = theirs.gathers[b - their_range.first_bucket];
      placed.whole[i] = 1;
      shared = true;
    }
    if (shared) {
      ++buckets_shared_;
      continue;
    }
    // One held whole elsewhere (resident, or just evicted but outside this region) is copied,
    // only the part this module's tensors cover, rather than gathered again.
    int64_t source = -1;
    for (int64_t other = 0; other < static_cast<int64_t>(placed_.size()) && source < 0; ++other) {
      const Placed& theirs = placed_[other];
      const sharding::ModuleRange& their_range = geometry_.modules[other];
      const bool just_evicted = absl::c_linear_search(evicted, other);
      if ((!theirs.resident && !just_evicted) || other == module || b < their_range.first_bucket ||
          b > their_range.last_bucket || !theirs.whole[b - their_range.first_bucket]) {
        continue;
      }
      const int64_t from = ArenaOffset(other, layout.flat_begin);
      if (from < region_end && from + layout.padded_elems > offset) continue;
      source = other;
    }
    if (source >= 0) {
      const int64_t begin = std::max(layout.flat_begin, range.tensors_begin);
      const int64_t end = std::min(layout.flat_end(), range.tensors_end);
      if (placed_[source].resident) {
        ZS_RETURN_IF_ERROR(AwaitModule(source, b, b, /*on_host=*/false));
      }
      ZS_RETURN_IF_ERROR(failure_->Record(device_->ConvertElements(
          arena + ArenaOffset(source, begin) * param_size_, options_.param_dtype,
          arena + ArenaOffset(module, begin) * param_size_, options_.param_dtype, end - begin)));
      ++buckets_copied_;
      continue;
    }
    // This rank's piece goes in place; the all-gather brings the others'.
    char* const bucket = arena + at * param_size_;
    ZS_RETURN_IF_ERROR(failure_->Record(device_->ConvertElements(
        owned_piece_(b), options_.param_dtype, bucket + rank_ * layout.piece_elems * param_size_,
        options_.param_dtype, layout.piece_elems)));
    placed.gathers[i] =
        communicator_->AllGatherInPlace(bucket, layout.piece_elems, type, collective);
    placed.whole[i] = 1;
    ++buckets_gathered_;
  }
  for (const int64_t other : evicted) {
    placed_[other].gathers.clear();
    placed_[other].ordered.clear();
    placed_[other].whole.clear();
  }
  return absl::OkStatus();
}

void GatherPool::Retire(std::shared_ptr<comm::Work>& work) {
  if (work.use_count() == 1) timer_->GatherFinished(work->RunTime());
  work.reset();
}

absl::Status GatherPool::AwaitModule(int64_t module, int64_t first_bucket, int64_t last_bucket,
                                     bool on_host) {
  Placed& placed = placed_[module];
  const int64_t module_first = geometry_.modules[module].first_bucket;
  absl::Status first_failure;
  for (int64_t b = first_bucket; b <= last_bucket; ++b) {
    std::shared_ptr<comm::Work>& work = placed.gathers[b - module_first];
    char& ordered = placed.ordered[b - module_first];
    if (work == nullptr || (!on_host && ordered)) continue;
    const absl::Time wait_start = absl::Now();
    absl::Status status;
    if (on_host) {
      status = work->Wait();
    } else {
      status = work->WaitOnComputeStream();
      ordered = 1;
    }
    // A host backend has waited for it; a device backend's is retired once seen done.
    if (on_host || (status.ok() && work->Done())) {
      if (!on_host) status = work->Wait();
      Retire(work);
      ordered = 0;
    }
    timer_->GatherWaited(absl::Now() - wait_start);
    if (!status.ok() && first_failure.ok()) first_failure = status;
    // After a failure only the host waits go on: the arena must be left alone by then.
    if (!first_failure.ok() && !on_host) break;
  }
  return failure_->Record(first_failure);
}

absl::StatusOr<const char*> GatherPool::Acquire(int64_t tensor) {
  ZS_RETURN_IF_ERROR(failure_->status());
  const int64_t module = geometry_.tensor_module[tensor];
  // The order record: a module acquired right after itself is the same position.
  bool follows_record = false;
  size_t position = this_step_.size();
  if (this_step_.empty() || this_step_.back() != module) {
    this_step_.push_back(module);
    if (!recorded_.empty() && !this_step_departed_) {
      follows_record = position < recorded_.size() && recorded_[position] == module;
      if (!follows_record) this_step_departed_ = true;
    }
  }
  Placed& placed = placed_[module];
  if (!placed.resident) {
    const std::optional<int64_t> offset =
        Place(module, std::vector<char>(geometry_.modules.size(), 0));
    if (!offset.has_value()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "gather pool: its ", options_.windows, " windows hold modules whose tensors are in use; ",
          "tensor ", plan_.tensors()[tensor].name, " (module ", geometry_.modules[module].name,
          ") needs one (release tensors after use, or raise gather_pool_buckets)"));
    }
    ZS_RETURN_IF_ERROR(Fill(module, *offset));
  }
  placed.last_use = ++use_clock_;
  if (!tensor_held_[tensor]) {
    tensor_held_[tensor] = 1;
    ++placed.holds;
  }
  // The next modules' gathers are queued before this one is waited for, so they run while the
  // caller computes.
  if (follows_record) Prefetch(position + 1);
  const sharding::TensorPlacement& placement = plan_.placement(tensor);
  ZS_RETURN_IF_ERROR(AwaitModule(module, placement.first_bucket,
                                 placement.first_bucket + placement.num_buckets - 1,
                                 /*on_host=*/false));
  return arena_.as<char>() + ArenaOffset(module, placement.flat_offset) * param_size_;
}

absl::StatusOr<char*> GatherPool::HeldValues(int64_t tensor) {
  ZS_RETURN_IF_ERROR(failure_->status());
  if (!tensor_held_[tensor]) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor ", plan_.tensors()[tensor].name, " is not held (gather it first)"));
  }
  const int64_t module = geometry_.tensor_module[tensor];
  const sharding::TensorPlacement& placement = plan_.placement(tensor);
  ZS_RETURN_IF_ERROR(AwaitModule(module, placement.first_bucket,
                                 placement.first_bucket + placement.num_buckets - 1,
                                 /*on_host=*/true));
  return arena_.as<char>() + ArenaOffset(module, placement.flat_offset) * param_size_;
}

absl::Status GatherPool::Release(int64_t tensor) {
  if (!tensor_held_[tensor]) {
    return absl::FailedPreconditionError(
        absl::StrCat("ReleaseParameters: tensor ", plan_.tensors()[tensor].name, " is not held"));
  }
  tensor_held_[tensor] = 0;
  Placed& placed = placed_[geometry_.tensor_module[tensor]];
  ZS_DCHECK(placed.resident && placed.holds > 0) << "tensor " << tensor;
  --placed.holds;
  return absl::OkStatus();
}

void GatherPool::Prefetch(size_t position) {
  // Modules needed sooner are never evicted for later ones; the walk ends when one has no place.
  std::vector<char> protected_modules(geometry_.modules.size(), 0);
  for (size_t k = position; k < recorded_.size(); ++k) {
    const int64_t module = recorded_[k];
    if (protected_modules[module]) continue;
    protected_modules[module] = 1;
    if (placed_[module].resident) continue;
    const std::optional<int64_t> offset = Place(module, protected_modules);
    if (!offset.has_value()) return;
    // A failure is recorded in failure_; the next Acquire or Step reports it.
    if (!Fill(module, *offset).ok()) return;
  }
}

absl::Status GatherPool::AwaitAll(bool on_host) {
  absl::Status first_failure;
  if (on_host) {
    for (std::shared_ptr<comm::Work>& work : evicted_) {
      const absl::Status status = work->Wait();
      Retire(work);
      if (!status.ok() && first_failure.ok()) first_failure = failure_->Record(status);
    }
    evicted_.clear();
  }
  for (int64_t module = 0; module < static_cast<int64_t>(placed_.size()); ++module) {
    if (!placed_[module].resident) continue;
    const sharding::ModuleRange& range = geometry_.modules[module];
    absl::Status status = AwaitModule(module, range.first_bucket, range.last_bucket, on_host);
    if (!status.ok() && first_failure.ok()) first_failure = status;
  }
  return first_failure;
}

absl::Status GatherPool::EndStep() {
  ZS_RETURN_IF_ERROR(AwaitAll(/*on_host=*/true));
  for (Placed& placed : placed_) placed = Placed{};
  last_placed_ = -1;
  std::fill(tensor_held_.begin(), tensor_held_.end(), 0);
  if (!this_step_.empty()) {
    const bool changed = this_step_departed_ || this_step_.size() != recorded_.size();
    if (changed && !recorded_.empty()) ++order_changes_;
    if (changed) recorded_ = this_step_;
  }
  this_step_.clear();
  this_step_departed_ = false;
  gathers_since_timings_ = false;
  return absl::OkStatus();
}

void GatherPool::StartStep() {
  if (failure_->status().ok()) Prefetch(0);
}

}  // namespace zeroshard::engine

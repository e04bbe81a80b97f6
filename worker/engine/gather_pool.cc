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
      windows_(static_cast<size_t>(options.windows)),
      module_window_(geometry_.modules.size(), -1),
      tensor_held_(static_cast<size_t>(plan.num_tensors()), 0) {
  ZS_DCHECK(options.windows >= 1) << options.windows;
}

GatherPool::~GatherPool() {
  // The communicator may still write into a window until its gather is done.
  for (std::unique_ptr<comm::Work>& work : evicted_) work->Wait().IgnoreError();
  for (Window& window : windows_) {
    for (std::unique_ptr<comm::Work>& work : window.gathers) {
      if (work != nullptr) work->Wait().IgnoreError();
    }
  }
}

absl::Status GatherPool::Allocate(CountingAllocator& allocator) {
  window_bytes_ = geometry_.window_elems * param_size_;
  for (Window& window : windows_) {
    ZS_ASSIGN_OR_RETURN(window.buffer,
                        allocator.TryAllocate(MemoryCategory::kGatherPool, window_bytes_));
  }
  return absl::OkStatus();
}

int GatherPool::PickWindow(const std::vector<char>& protected_modules) const {
  int best = -1;
  for (int w = 0; w < static_cast<int>(windows_.size()); ++w) {
    const Window& window = windows_[w];
    if (window.module < 0) return w;
    if (window.holds > 0 || protected_modules[window.module]) continue;
    if (best < 0 || window.last_use < windows_[best].last_use) best = w;
  }
  return best;
}

absl::Status GatherPool::Fill(int w, int64_t module) {
  Window& window = windows_[w];
  if (window.module >= 0) {
    // The previous module's gathers may still be writing into the window: what is copied into
    // it next must come after them (a host backend waits here, a device orders its stream).
    const sharding::ModuleRange& old = geometry_.modules[window.module];
    ZS_RETURN_IF_ERROR(AwaitWindow(w, old.first_bucket, old.last_bucket, /*on_host=*/false));
    module_window_[window.module] = -1;
    // On a device the stream is ordered after them but they may still run: their outcome is
    // checked once the step ends (EndStep), as every gather's is.
    for (std::unique_ptr<comm::Work>& work : window.gathers) {
      if (work != nullptr) evicted_.push_back(std::move(work));
    }
  }
  const sharding::ModuleRange& range = geometry_.modules[module];
  window.module = module;
  window.holds = 0;
  module_window_[module] = w;
  window.gathers.clear();
  window.gathers.resize(range.span_buckets());
  window.ordered.assign(range.span_buckets(), 0);
  window.whole.assign(range.span_buckets(), 0);
  if (!gathers_since_timings_) {
    timer_->GathersIssued();
    gathers_since_timings_ = true;
  }
  comm::CollectiveOptions collective;
  collective.timeout = options_.collective_timeout;
  const comm::ElementType type = ToElementType(options_.param_dtype);
  for (int64_t b = range.first_bucket; b <= range.last_bucket; ++b) {
    const sharding::BucketLayout& layout = plan_.buckets()[b];
    char* const bucket =
        window.buffer.as<char>() + (layout.flat_begin - range.flat_begin) * param_size_;
    // A bucket two modules share (their boundary) is copied from the neighbour's window when
    // that one holds it, rather than gathered twice; only the part this module's tensors cover.
    const int source = WindowHolding(b, w);
    if (source >= 0) {
      const sharding::ModuleRange& neighbour = geometry_.modules[windows_[source].module];
      const int64_t begin = std::max(layout.flat_begin, range.tensors_begin);
      const int64_t end = std::min(layout.flat_end(), range.tensors_end);
      ZS_RETURN_IF_ERROR(AwaitWindow(source, b, b, /*on_host=*/false));
      ZS_RETURN_IF_ERROR(failure_->Record(device_->ConvertElements(
          windows_[source].buffer.as<char>() + (begin - neighbour.flat_begin) * param_size_,
          options_.param_dtype, window.buffer.as<char>() + (begin - range.flat_begin) * param_size_,
          options_.param_dtype, end - begin)));
      ++buckets_copied_;
      continue;
    }
    // This rank's piece goes in place; the all-gather brings the others'.
    ZS_RETURN_IF_ERROR(failure_->Record(device_->ConvertElements(
        owned_piece_(b), options_.param_dtype, bucket + rank_ * layout.piece_elems * param_size_,
        options_.param_dtype, layout.piece_elems)));
    window.gathers[b - range.first_bucket] =
        communicator_->AllGatherInPlace(bucket, layout.piece_elems, type, collective);
    window.whole[b - range.first_bucket] = 1;
    ++buckets_gathered_;
  }
  return absl::OkStatus();
}

int GatherPool::WindowHolding(int64_t bucket, int except) const {
  for (int w = 0; w < static_cast<int>(windows_.size()); ++w) {
    if (w == except || windows_[w].module < 0) continue;
    const sharding::ModuleRange& range = geometry_.modules[windows_[w].module];
    if (bucket >= range.first_bucket && bucket <= range.last_bucket &&
        windows_[w].whole[bucket - range.first_bucket]) {
      return w;
    }
  }
  return -1;
}

absl::Status GatherPool::AwaitWindow(int w, int64_t first_bucket, int64_t last_bucket,
                                     bool on_host) {
  Window& window = windows_[w];
  const int64_t module_first = geometry_.modules[window.module].first_bucket;
  absl::Status first_failure;
  for (int64_t b = first_bucket; b <= last_bucket; ++b) {
    std::unique_ptr<comm::Work>& work = window.gathers[b - module_first];
    char& ordered = window.ordered[b - module_first];
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
      timer_->GatherFinished(work->RunTime());
      work.reset();
      ordered = 0;
    }
    timer_->GatherWaited(absl::Now() - wait_start);
    if (!status.ok() && first_failure.ok()) first_failure = status;
    // After a failure only the host waits go on: the windows must be left alone by then.
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
  int w = WindowOf(module);
  if (w < 0) {
    w = PickWindow(std::vector<char>(geometry_.modules.size(), 0));
    if (w < 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "gather pool: all ", windows_.size(), " windows hold modules whose tensors are in use; ",
          "tensor ", plan_.tensors()[tensor].name, " (module ", geometry_.modules[module].name,
          ") needs one (release tensors after use, or raise gather_pool_buckets)"));
    }
    ZS_RETURN_IF_ERROR(Fill(w, module));
  }
  Window& window = windows_[w];
  window.last_use = ++use_clock_;
  if (!tensor_held_[tensor]) {
    tensor_held_[tensor] = 1;
    ++window.holds;
  }
  // The next modules' gathers are queued before this one is waited for, so they run while the
  // caller computes.
  if (follows_record) Prefetch(position + 1);
  const sharding::TensorPlacement& placement = plan_.placement(tensor);
  ZS_RETURN_IF_ERROR(AwaitWindow(w, placement.first_bucket,
                                 placement.first_bucket + placement.num_buckets - 1,
                                 /*on_host=*/false));
  return window.buffer.as<char>() +
         (placement.flat_offset - geometry_.modules[module].flat_begin) * param_size_;
}

absl::Status GatherPool::Release(int64_t tensor) {
  if (!tensor_held_[tensor]) {
    return absl::FailedPreconditionError(
        absl::StrCat("ReleaseParameters: tensor ", plan_.tensors()[tensor].name, " is not held"));
  }
  tensor_held_[tensor] = 0;
  const int w = WindowOf(geometry_.tensor_module[tensor]);
  ZS_DCHECK(w >= 0 && windows_[w].holds > 0) << "tensor " << tensor;
  --windows_[w].holds;
  return absl::OkStatus();
}

void GatherPool::Prefetch(size_t position) {
  // Modules needed sooner are never evicted for later ones; the walk ends when no window is left.
  std::vector<char> protected_modules(geometry_.modules.size(), 0);
  for (size_t k = position; k < recorded_.size(); ++k) {
    const int64_t module = recorded_[k];
    if (protected_modules[module]) continue;
    protected_modules[module] = 1;
    if (WindowOf(module) >= 0) continue;
    const int w = PickWindow(protected_modules);
    if (w < 0) return;
    // A failure is recorded in failure_; the next Acquire or Step reports it.
    if (!Fill(w, module).ok()) return;
  }
}

absl::Status GatherPool::AwaitAll(bool on_host) {
  absl::Status first_failure;
  if (on_host) {
    for (std::unique_ptr<comm::Work>& work : evicted_) {
      const absl::Status status = work->Wait();
      timer_->GatherFinished(work->RunTime());
      if (!status.ok() && first_failure.ok()) first_failure = failure_->Record(status);
    }
    evicted_.clear();
  }
  for (int w = 0; w < static_cast<int>(windows_.size()); ++w) {
    if (windows_[w].module < 0) continue;
    const sharding::ModuleRange& range = geometry_.modules[windows_[w].module];
    absl::Status status = AwaitWindow(w, range.first_bucket, range.last_bucket, on_host);
    if (!status.ok() && first_failure.ok()) first_failure = status;
  }
  return first_failure;
}

absl::Status GatherPool::EndStep() {
  ZS_RETURN_IF_ERROR(AwaitAll(/*on_host=*/true));
  for (Window& window : windows_) {
    window.module = -1;
    window.holds = 0;
    window.gathers.clear();
    window.ordered.clear();
    window.whole.clear();
  }
  std::fill(module_window_.begin(), module_window_.end(), -1);
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

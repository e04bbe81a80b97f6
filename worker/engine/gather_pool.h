// zero3's parameter gathers: a bounded pool of windows, each holding the full values of one
// module's buckets (sharding/gather_windows.h) from the module's first use until its window is
// needed for another, with prefetch of the next module in the order recorded on a previous step.
#ifndef ZEROSHARD_WORKER_ENGINE_GATHER_POOL_H_
#define ZEROSHARD_WORKER_ENGINE_GATHER_POOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dcheck.h"
#include "numerics/dtype.h"
#include "sharding/gather_windows.h"
#include "sharding/shard_planner.h"
#include "worker/comm/communicator.h"
#include "worker/engine/bucket_pipeline.h"
#include "worker/engine/counting_allocator.h"
#include "worker/engine/device_ops.h"
#include "worker/engine/step_timings.h"

namespace zeroshard::engine {

// The gather pool of one zero3 rank: one arena of `windows` x the largest module's span.
//
// Acquire(tensor) makes the tensor's module resident in the arena (gathering each of its buckets:
// this rank's owned piece is copied into place and the bucket all-gathered in place), holds it
// until Release(tensor), and returns where the tensor's full values are, ordered after their
// gathers (Work::WaitOnComputeStream). A module lies in the arena as in the flat layout, so its
// tensors are contiguous. A module no tensor holds stays resident until its place is needed
// (least recently used first), so a backward that follows its forward at once finds it there.
//
// Sliding placement: a module goes, where it fits, at the same shift (arena offset minus flat
// offset) as a resident neighbour it shares a bucket with, so that the shared bucket is one
// piece of memory for both (gathered once, neither copied nor gathered again: buckets_shared).
// Where it does not fit (the arena's end), it goes to one of `windows` fixed places and the
// shared bucket is copied from the neighbour (buckets_copied). Layers that cross bucket
// boundaries, as most do, so cost one copy every few layers instead of one per layer.
//
// Prefetch: the modules acquired in one step, in order, are recorded; on later steps, each time
// the order reaches a new module, the next modules in the recorded order are gathered into
// places no held module occupies (never evicting a module needed sooner), and StartStep()
// gathers the first ones as soon as a step ends. When a step's order departs from the record,
// prefetch stops for that step and the step's order is recorded instead. Prefetch is only a
// hint: Acquire always gathers what it lacks.
//
// Every decision (what to gather, where, what to evict) depends only on the sequence of
// Acquire/Release/StartStep calls and never on timing, so ranks that make the same calls issue
// the same collectives in the same order, as they must.
//
// Thread contract: not thread-safe; the engine's owner thread calls everything. The communicator
// writes into the arena until each gather is waited for; the destructor waits for those still
// outstanding.
class GatherPool {
 public:
  struct Options {
    numerics::DType param_dtype = numerics::DType::kFloat32;
    int64_t windows = 2;  // >= 1
    absl::Duration collective_timeout = absl::Minutes(5);
  };
  // Where this rank's owned piece of `bucket` lives (param_dtype, the bucket's piece_elems).
  using OwnedPieceOf = std::function<const char*(int64_t bucket)>;

  // `plan`, `device`, `communicator`, `timer` and `failure` must outlive the pool.
  GatherPool(const sharding::ShardPlan& plan, int64_t rank, sharding::GatherWindows geometry,
             const Options& options, OwnedPieceOf owned_piece, DeviceOps* device,
             comm::Communicator* communicator, StepTimer* timer, FirstFailure* failure);
  ~GatherPool();
  GatherPool(const GatherPool&) = delete;
  GatherPool& operator=(const GatherPool&) = delete;

  // The arena (MemoryCategory::kGatherPool). Call once, before anything else.
  absl::Status Allocate(CountingAllocator& allocator);

  // The tensor's full values in param_dtype, held until Release(tensor) (acquiring a held tensor
  // again changes nothing). ResourceExhausted when no place in the arena is free of modules some
  // tensor still holds; a failed gather's error (then the engine is unusable).
  absl::StatusOr<const char*> Acquire(int64_t tensor);
  // FailedPrecondition when the tensor is not held.
  absl::Status Release(int64_t tensor);
  // Where a held tensor's full values are, its gathers waited for on the host; neither recorded
  // in the order nor counted as a use. FailedPrecondition when the tensor is not held.
  absl::StatusOr<char*> HeldValues(int64_t tensor);
  bool held(int64_t tensor) const { return tensor_held_[tensor] != 0; }

  // Waits for every gather still in flight: on the host (`on_host`; their outcome is then known)
  // or ordering the device after them. Fails with the first failure.
  absl::Status AwaitAll(bool on_host);
  // The owned pieces are about to change (an update, a restore): forgets every window's contents
  // and every hold, after waiting on the host for the gathers in flight, and ends the step's
  // order record (recording it when it is new or changed).
  absl::Status EndStep();
  // Gathers the first modules of the recorded order into the empty arena (the next forward's
  // first layers), without waiting. Nothing before the first step was recorded.
  void StartStep();

  // The first window_bytes() of the arena, for staging while no module is resident (between
  // EndStep and the next Acquire or StartStep): initial values go through it instead of
  // uncounted memory.
  absl::Span<char> IdleWindow() {
    ZS_DCHECK(absl::c_none_of(placed_, [](const Placed& p) { return p.resident; }));
    return absl::MakeSpan(arena_.as<char>(), window_bytes_);
  }
  // The arena: windows() x window_bytes() bytes from here.
  const char* arena() const { return arena_.as<char>(); }

  // How many steps' orders departed from the record (each was recorded anew).
  int64_t order_changes() const { return order_changes_; }
  // Buckets gathered since the pool was made (prefetched or not); buckets two modules share that
  // a module found in place at its neighbour's shift (neither gathered nor copied); and those
  // copied from a neighbour at another shift.
  int64_t buckets_gathered() const { return buckets_gathered_; }
  int64_t buckets_shared() const { return buckets_shared_; }
  int64_t buckets_copied() const { return buckets_copied_; }
  int64_t windows() const { return options_.windows; }
  int64_t window_bytes() const { return window_bytes_; }

 private:
  // Where a module lies in the arena, per module (index: module).
  struct Placed {
    bool resident = false;
    int64_t offset = 0;  // the arena element where the module's flat_begin lies
    int holds = 0;       // tensors of the module held
    int64_t last_use = 0;
    // The gather of each of the module's buckets (index: bucket - first_bucket), until waited;
    // shared with a neighbour whose bucket it is too (the same memory).
    std::vector<std::shared_ptr<comm::Work>> gathers;
    std::vector<char> ordered;  // whether the device was ordered after gathers[i]
    // Whether bucket i is whole here (gathered or shared), or only the part the module's tensors
    // cover (copied): only whole buckets are shared or copied on.
    std::vector<char> whole;
  };

  // The arena offset of flat element `flat` in resident module `module`.
  int64_t ArenaOffset(int64_t module, int64_t flat) const {
    return placed_[module].offset + (flat - geometry_.modules[module].flat_begin);
  }
  // Whether resident `other` can stay where it is while `module` is placed at `offset`: their
  // regions are apart, or they overlap only in whole buckets at the same shift (the same memory
  // holds the same elements).
  bool CanCoexist(int64_t module, int64_t offset, int64_t other) const;
  // Where `module` goes (its offset), evicting only modules no tensor holds and not in
  // `protected_modules`, least recently used first; nullopt when nowhere.
  std::optional<int64_t> Place(int64_t module, const std::vector<char>& protected_modules) const;
  // Makes `module` resident at `offset`: evicts what it cannot coexist with (waiting for what
  // they were receiving), then shares, copies or gathers each of its buckets.
  absl::Status Fill(int64_t module, int64_t offset);
  // Waits for module's gathers of buckets [first, last] (on the host, or ordering the device),
  // retiring those seen done.
  absl::Status AwaitModule(int64_t module, int64_t first_bucket, int64_t last_bucket, bool on_host);
  // Drops one holder of a finished gather; the last one reports its run time.
  void Retire(std::shared_ptr<comm::Work>& work);
  // Prefetches the modules that follow position `position` of the recorded order.
  void Prefetch(size_t position);

  const sharding::ShardPlan& plan_;
  const int64_t rank_;
  const sharding::GatherWindows geometry_;
  const Options options_;
  const OwnedPieceOf owned_piece_;
  DeviceOps* const device_;
  comm::Communicator* const communicator_;
  StepTimer* const timer_;
  FirstFailure* const failure_;
  const int param_size_;
  int64_t window_bytes_ = 0;
  int64_t arena_elems_ = 0;
  CountedBuffer arena_;

  std::vector<Placed> placed_;  // per module
  // Gathers of modules evicted before the host saw their outcome (a device backend), until
  // AwaitAll waits for them on the host.
  std::vector<std::shared_ptr<comm::Work>> evicted_;
  std::vector<char> tensor_held_;  // per tensor: held (Acquire without Release)
  int64_t use_clock_ = 0;          // counts Acquire calls: the modules' last_use
  int64_t last_placed_ = -1;       // the module placed last this step (the walk's direction)
  // The order record: modules in order of first acquisition within a step (a module acquired
  // again after another is listed again). `recorded_` is the last recorded step's.
  std::vector<int64_t> recorded_;
  std::vector<int64_t> this_step_;
  bool this_step_departed_ = false;
  int64_t order_changes_ = 0;
  int64_t buckets_gathered_ = 0;
  int64_t buckets_shared_ = 0;
  int64_t buckets_copied_ = 0;
  bool gathers_since_timings_ = false;
};

}  // namespace zeroshard::engine

#endif  // ZEROSHARD_WORKER_ENGINE_GATHER_POOL_H_

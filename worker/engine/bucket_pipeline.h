// The engine's gradient buckets between backward and the update: which bucket buffers (pool
// slots) hold which bucket, the queue of reductions in flight, their launch when a bucket's last
// gradient arrives, their retirement (the move of the reduced owned piece into the gradient
// storage, its statistics summed on the way) and the host's check of their outcome.
#ifndef ZEROSHARD_WORKER_ENGINE_BUCKET_PIPELINE_H_
#define ZEROSHARD_WORKER_ENGINE_BUCKET_PIPELINE_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "numerics/dtype.h"
#include "sharding/shard_planner.h"
#include "worker/comm/communicator.h"
#include "worker/engine/counting_allocator.h"
#include "worker/engine/device_ops.h"
#include "worker/engine/step_timings.h"

namespace zeroshard::engine {

// The first failure of a collective or of the device, after which the engine is unusable; later
// failures do not replace the cause. Thread contract: the engine's owner thread, as the engine.
class FirstFailure {
 public:
  // Keeps `status` if it is the first failure; returns it unchanged (OK records nothing).
  absl::Status Record(absl::Status status) {
    if (!status.ok() && failure_.ok()) failure_ = status;
    return status;
  }
  const absl::Status& status() const { return failure_; }

 private:
  absl::Status failure_;
};

// One rank's bucket reductions of one step, in launch order, which is the communicator's
// completion order.
//
// Thread contract: not thread-safe; the engine's owner thread calls everything. The
// communicator writes into the bucket buffers and the gradient storage until a reduction is
// checked; the destructor waits for those still outstanding.
class BucketPipeline {
 public:
  // What the pipeline reads from the engine's configuration.
  struct Options {
    bool ddp = false;    // all-reduce, and every rank keeps every reduced piece
    bool zero2 = false;  // the gradient storage holds only the owned pieces (owned layout)
    numerics::DType grad_dtype = numerics::DType::kFloat32;
    numerics::DType reduce_dtype = numerics::DType::kFloat32;
    int bucket_pool_size = 2;
    absl::Duration collective_timeout = absl::Minutes(5);
  };
  // The engine's buffers the pipeline writes and reads. They are the engine's members (declared
  // before the pipeline, so they outlive it), filled after the pipeline is made: the references
  // are taken now, the contents read when a bucket launches or retires.
  struct Storage {
    // ddp/zero1: the full-size gradient buffer in plan layout; zero2: the owned pieces.
    const CountedBuffer& grads;
    // owned_offsets[b]: element offset of bucket b's owned piece in the owned layout.
    const std::vector<int64_t>& owned_offsets;
    // The statistics' chunk table and partials, bucket b's [chunk_begin[b], chunk_begin[b + 1]).
    const CountedBuffer& stats_chunks;
    const CountedBuffer& stats_partials;
    const std::vector<int64_t>& stats_chunk_begin;
  };

  // `plan`, `device`, `communicator`, `timer` and `failure` must outlive the pipeline.
  BucketPipeline(const sharding::ShardPlan& plan, int64_t rank, const Options& options,
                 Storage storage, DeviceOps* device, comm::Communicator* communicator,
                 StepTimer* timer, FirstFailure* failure);
  ~BucketPipeline();
  BucketPipeline(const BucketPipeline&) = delete;
  BucketPipeline& operator=(const BucketPipeline&) = delete;

  // Whether reductions go through pool buffers (zero2, and a grad_dtype that is not the
  // reduce_dtype) rather than the full gradient buffer in place.
  bool uses_pool() const { return uses_pool_; }
  // Allocates the pool: min(bucket_pool_size, buckets) buffers of `buffer_bytes`. Call once,
  // before the first step. ResourceExhausted when the device is out of memory.
  absl::Status AllocatePool(CountingAllocator& allocator, int64_t buffer_bytes);

  // zero2: the pool buffer of `bucket`, taken from the free ones when the bucket holds none.
  // With every buffer in flight, `wait` retires the oldest reduction; without it the
  // reductions already done are retired and, if none freed a buffer, the result is null.
  // REQUIRES: uses_pool().
  absl::StatusOr<char*> BucketBuffer(int64_t bucket, bool wait);
  // `count` more tensor elements of `bucket` were written this step; the last ones launch its
  // reduction (ZeroGaps, then all-reduce in ddp, reduce-scatter otherwise), without waiting.
  absl::Status ElementsWritten(int64_t bucket, int64_t count);
  // Retires, oldest first, the in-flight reductions already done (Work::Done), so that their
  // moves and statistics run during backward; waits for none.
  absl::Status RetireFinished();
  // Retires every reduction in flight and waits on the host for all of them (their outcome is
  // then known): the reduced owned pieces are in the gradient storage, their statistics in the
  // partials.
  absl::Status RetireAll();

  // zero2 micro-batches: the reduced pieces in the gradient storage are kept, and the next
  // retirements add to them instead of overwriting (until EndStep()).
  void StartAccumulating() { accumulating_ = true; }
  bool accumulating() const { return accumulating_; }
  // A new hand-over of every tensor begins (the next micro-batch, or the next step).
  // REQUIRES: no reduction is in flight.
  void ResetArrivals();
  // The step is over: arrivals reset and accumulation ends. REQUIRES: no reduction in flight.
  void EndStep();
  // Between steps: no bucket is in flight or holds a slot, and every pool slot is free.
  // O(buckets); for ZS_DCHECK.
  bool Idle() const;

 private:
  // Per-bucket progress within the current step.
  struct BucketState {
    int64_t elems_arrived = 0;  // tensor elements of the bucket written this step
    int slot = -1;  // pool slot holding the bucket's reduce buffer, or -1 (none / in place)
    std::unique_ptr<comm::Work> reduction;  // set from launch until checked
  };

  // A first-in first-out queue of bucket indices that never allocates after construction: a
  // bucket enters it at most once per step, and it is empty between steps.
  class BucketQueue {
   public:
    explicit BucketQueue(int64_t capacity) { buckets_.reserve(capacity); }
    bool empty() const { return head_ == buckets_.size(); }
    size_t size() const { return buckets_.size() - head_; }
    int64_t front() const { return buckets_[head_]; }
    // REQUIRES: fewer than `capacity` pushes since the queue was last empty.
    void push_back(int64_t bucket);
    // REQUIRES: !empty().
    void pop_front();

   private:
    std::vector<int64_t> buckets_;
    size_t head_ = 0;
  };

  char* GradsAt(int64_t flat) const;
  char* SlotData(int slot) const { return pool_[slot].as<char>(); }
  // Takes a free pool slot for `bucket`, retiring the oldest reduction if none is free.
  // REQUIRES: uses_pool(), and `bucket` holds no slot.
  absl::Status AcquireSlot(int64_t bucket);
  // Zeroes the bucket's padding and alignment gaps in its reduce buffer and starts its
  // reduction. REQUIRES: every tensor element of the bucket was written this step; the bucket
  // is not in flight; in zero2 it holds a slot.
  absl::Status LaunchBucket(int64_t bucket);
  // Orders the device after the oldest in-flight reduction (Work::WaitOnComputeStream: the host
  // waits only with a host backend), queues the move of its reduced values into the gradient
  // storage the update reads with the statistics of its owned fragments summed on the way (the
  // statistics alone for a bucket reduced in place), frees its slot (what uses the slot next is
  // queued after the move), and leaves it to CheckReductions().
  // REQUIRES: a reduction is in flight.
  absl::Status RetireOldest();
  // Waits on the host for every retired reduction and fails the engine with the first failure.
  absl::Status CheckReductions();

  const sharding::ShardPlan& plan_;
  const int64_t rank_;
  const Options options_;
  const Storage storage_;
  const int grad_size_;  // bytes per element
  const int reduce_size_;
  const bool uses_pool_;
  DeviceOps* const device_;
  comm::Communicator* const communicator_;
  StepTimer* const timer_;
  FirstFailure* const failure_;

  // Flat ranges of each bucket not covered by a tensor (alignment gaps and tail padding):
  // gaps_[gap_begin_[b] .. gap_begin_[b + 1]) belong to bucket b. Fixed after construction.
  std::vector<std::pair<int64_t, int64_t>> gaps_;
  std::vector<int64_t> gap_begin_;
  std::vector<CountedBuffer> pool_;  // reduce-dtype buffers of the largest bucket's size

  // Invariants: a bucket's reduction is set iff the bucket is in in_flight_ (launched) or in
  // awaiting_check_ (retired, its outcome not yet seen on the host); both are in launch order.
  // With the pool, each pool slot is either in free_slots_ or held by one bucket (every
  // in-flight bucket holds one; in zero2 so does a bucket still receiving gradients).
  std::vector<BucketState> buckets_;
  BucketQueue in_flight_;
  BucketQueue awaiting_check_;
  std::vector<int> free_slots_;
  // zero2: an EndMicroBatch() of this step left reduced gradients in the gradient storage, which
  // the next retirements add to instead of overwriting.
  bool accumulating_ = false;
};

}  // namespace zeroshard::engine

#endif  // ZEROSHARD_WORKER_ENGINE_BUCKET_PIPELINE_H_

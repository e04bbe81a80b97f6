// The engine's bucket reductions (bucket_pipeline.h).
#include "worker/engine/bucket_pipeline.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "common/dcheck.h"
#include "common/status_macros.h"
#include "worker/engine/element_convert.h"

namespace zeroshard::engine {

BucketPipeline::BucketPipeline(const sharding::ShardPlan& plan, int64_t rank,
                               const Options& options, Storage storage, DeviceOps* device,
                               comm::Communicator* communicator, StepTimer* timer,
                               FirstFailure* failure)
    : plan_(plan),
      rank_(rank),
      options_(options),
      storage_(storage),
      grad_size_(numerics::DTypeSize(options.grad_dtype)),
      reduce_size_(numerics::DTypeSize(options.reduce_dtype)),
      uses_pool_(options.zero2 || options.grad_dtype != options.reduce_dtype),
      device_(device),
      communicator_(communicator),
      timer_(timer),
      failure_(failure),
      buckets_(plan.num_buckets()),
      in_flight_(plan.num_buckets()),
      awaiting_check_(plan.num_buckets()) {
  gap_begin_.reserve(plan_.num_buckets() + 1);
  for (const sharding::BucketLayout& bucket : plan_.buckets()) {
    gap_begin_.push_back(static_cast<int64_t>(gaps_.size()));
    int64_t covered_to = bucket.flat_begin;
    for (int64_t t = bucket.first_tensor; t < bucket.first_tensor + bucket.num_tensors; ++t) {
      const sharding::TensorPlacement& placement = plan_.placement(t);
      // A tensor may start before the bucket or go on after it (buckets span tensors).
      const int64_t begin = std::max(placement.flat_offset, bucket.flat_begin);
      if (begin > covered_to) gaps_.push_back({covered_to, begin});
      covered_to = std::min(placement.flat_end(), bucket.flat_end());
    }
    if (bucket.flat_end() > covered_to) gaps_.push_back({covered_to, bucket.flat_end()});
  }
  gap_begin_.push_back(static_cast<int64_t>(gaps_.size()));
}

BucketPipeline::~BucketPipeline() {
  // The communicator may still write into the buffers until each reduction is done.
  for (BucketState& bucket : buckets_) {
    if (bucket.reduction != nullptr) bucket.reduction->Wait().IgnoreError();
  }
}

void BucketPipeline::BucketQueue::push_back(int64_t bucket) {
  ZS_DCHECK_LT(buckets_.size(), buckets_.capacity()) << "a bucket entered the queue twice";
  buckets_.push_back(bucket);
}

void BucketPipeline::BucketQueue::pop_front() {
  ZS_DCHECK(!empty());
  // Emptied: start over at the front, so the reserved room is enough for the next step.
  if (++head_ == buckets_.size()) {
    buckets_.clear();
    head_ = 0;
  }
}

absl::Status BucketPipeline::AllocatePool(CountingAllocator& allocator, int64_t buffer_bytes) {
  ZS_DCHECK(pool_.empty());
  // Buckets are fixed ranges of bucket_elems (the last one shorter), so the pool is bounded by
  // the bucket size whatever the tensor sizes.
  const int slots =
      static_cast<int>(std::min<int64_t>(options_.bucket_pool_size, plan_.num_buckets()));
  for (int slot = 0; slot < slots; ++slot) {
    ZS_ASSIGN_OR_RETURN(CountedBuffer buffer,
                        allocator.TryAllocate(MemoryCategory::kBuckets, buffer_bytes));
    pool_.push_back(std::move(buffer));
    free_slots_.push_back(slots - 1 - slot);  // slot 0 is taken first
  }
  return absl::OkStatus();
}

char* BucketPipeline::GradsAt(int64_t flat) const {
  return storage_.grads.as<char>() + flat * grad_size_;
}

absl::StatusOr<char*> BucketPipeline::BucketBuffer(int64_t bucket_index, bool wait) {
  ZS_DCHECK(uses_pool_);
  BucketState& bucket = buckets_[bucket_index];
  if (bucket.slot < 0 && !wait) {
    ZS_RETURN_IF_ERROR(RetireFinished());
    // AcquireSlot would wait for the oldest reduction (with none in flight it fails instead).
    if (free_slots_.empty() && !in_flight_.empty()) return nullptr;
  }
  if (bucket.slot < 0) ZS_RETURN_IF_ERROR(AcquireSlot(bucket_index));
  return SlotData(bucket.slot);
}

absl::Status BucketPipeline::ElementsWritten(int64_t bucket_index, int64_t count) {
  BucketState& bucket = buckets_[bucket_index];
  bucket.elems_arrived += count;
  ZS_DCHECK_LE(bucket.elems_arrived, plan_.buckets()[bucket_index].tensor_elems);
  if (bucket.elems_arrived == plan_.buckets()[bucket_index].tensor_elems) {
    return LaunchBucket(bucket_index);
  }
  return absl::OkStatus();
}

absl::Status BucketPipeline::AcquireSlot(int64_t bucket) {
  ZS_DCHECK(uses_pool_);
  ZS_DCHECK_LT(buckets_[bucket].slot, 0) << "bucket " << bucket << " already holds a slot";
  if (free_slots_.empty()) {
    if (in_flight_.empty()) {
      return absl::FailedPreconditionError(
          "every bucket buffer holds an incomplete bucket: gradients must arrive in "
          "tensor-list order");
    }
    ZS_RETURN_IF_ERROR(RetireOldest());
    // Every in-flight bucket holds a slot, so retiring one frees one.
    ZS_DCHECK(!free_slots_.empty());
  }
  buckets_[bucket].slot = free_slots_.back();
  free_slots_.pop_back();
  return absl::OkStatus();
}

absl::Status BucketPipeline::LaunchBucket(int64_t bucket_index) {
  BucketState& bucket = buckets_[bucket_index];
  const sharding::BucketLayout& layout = plan_.buckets()[bucket_index];
  ZS_DCHECK_EQ(bucket.elems_arrived, layout.tensor_elems) << "bucket " << bucket_index;
  ZS_DCHECK(bucket.reduction == nullptr) << "bucket " << bucket_index << " is already in flight";
  ZS_DCHECK(!options_.zero2 || bucket.slot >= 0)
      << "zero2 bucket " << bucket_index << " has no reduce buffer";
  char* reduce_buffer;
  if (options_.zero2) {
    reduce_buffer = SlotData(bucket.slot);
  } else if (uses_pool_) {
    ZS_RETURN_IF_ERROR(AcquireSlot(bucket_index));
    reduce_buffer = SlotData(bucket.slot);
    ZS_RETURN_IF_ERROR(failure_->Record(
        device_->ConvertElements(GradsAt(layout.flat_begin), options_.grad_dtype, reduce_buffer,
                                 options_.reduce_dtype, layout.padded_elems)));
  } else {
    reduce_buffer = GradsAt(layout.flat_begin);  // reduced in place
  }
  for (int64_t g = gap_begin_[bucket_index]; g < gap_begin_[bucket_index + 1]; ++g) {
    ZS_RETURN_IF_ERROR(failure_->Record(
        device_->ZeroElements(reduce_buffer + (gaps_[g].first - layout.flat_begin) * reduce_size_,
                              options_.reduce_dtype, gaps_[g].second - gaps_[g].first)));
  }
  comm::CollectiveOptions collective;
  collective.timeout = options_.collective_timeout;
  const comm::ElementType type = ToElementType(options_.reduce_dtype);
  timer_->ReductionLaunched();
  bucket.reduction =
      options_.ddp ? communicator_->AllReduce(reduce_buffer, layout.padded_elems, type,
                                              comm::ReduceOp::kSum, collective)
                   : communicator_->ReduceScatterInPlace(reduce_buffer, layout.piece_elems, type,
                                                         comm::ReduceOp::kSum, collective);
  in_flight_.push_back(bucket_index);
  ZS_DCHECK(bucket.reduction != nullptr);
  ZS_DCHECK(!uses_pool_ || in_flight_.size() + free_slots_.size() <= pool_.size())
      << in_flight_.size() << " buckets in flight and " << free_slots_.size() << " free slots of "
      << pool_.size();
  return absl::OkStatus();
}

absl::Status BucketPipeline::RetireOldest() {
  ZS_DCHECK(!in_flight_.empty());
  const int64_t bucket_index = in_flight_.front();
  in_flight_.pop_front();
  BucketState& bucket = buckets_[bucket_index];
  ZS_DCHECK(bucket.reduction != nullptr)
      << "bucket " << bucket_index << " is in flight without a reduction";
  ZS_DCHECK_EQ(bucket.slot >= 0, uses_pool_) << "bucket " << bucket_index;
  // The conversion below and the slot's next gradients need the reduced values only on the
  // device: a device backend makes the compute stream wait (the host goes on queueing backward),
  // a host backend waits here. CheckReductions() learns the outcome before the host uses it.
  const absl::Time wait_start = absl::Now();
  const absl::Status ordered = bucket.reduction->WaitOnComputeStream();
  timer_->ReductionWaited(bucket_index, absl::Now() - wait_start);
  awaiting_check_.push_back(bucket_index);
  if (!ordered.ok()) return failure_->Record(ordered);
  // Move the owned fragments' reduced values into the gradient storage the update reads, in
  // grad_dtype, summing their statistics on the way. Reduced in place in the gradient buffer
  // (slot < 0), they are already there: the same call only sums. Alignment gaps are not moved:
  // nothing reads them from the gradient storage.
  const sharding::BucketLayout& layout = plan_.buckets()[bucket_index];
  const int64_t owned_begin = rank_ * layout.piece_elems;
  const char* reduced = bucket.slot >= 0 ? SlotData(bucket.slot) : GradsAt(layout.flat_begin);
  char* owned_grads =
      options_.zero2 ? storage_.grads.as<char>() + storage_.owned_offsets[bucket_index] * grad_size_
                     : GradsAt(layout.flat_begin + owned_begin);
  const int64_t first_chunk = storage_.stats_chunk_begin[bucket_index];
  const kernels::GradStatsChunk* chunks =
      storage_.stats_chunks.as<kernels::GradStatsChunk>() + first_chunk;
  const int64_t num_chunks = storage_.stats_chunk_begin[bucket_index + 1] - first_chunk;
  double* partials = storage_.stats_partials.as<double>() + first_chunk;
  const numerics::DType grad_dtype = options_.grad_dtype;
  const numerics::DType reduce_dtype = options_.reduce_dtype;
  absl::Status moved;
  if (accumulating_) {
    // A later micro-batch (zero2): added to the earlier ones' sum, whose statistics replace the
    // bucket's partials (the last micro-batch's retirement leaves the step's).
    moved = device_->AddElements(reduced + owned_begin * reduce_size_, reduce_dtype, owned_grads,
                                 grad_dtype, layout.piece_elems);
    if (moved.ok()) {
      moved = device_->ConvertWithGradStats(owned_grads, grad_dtype, owned_grads, grad_dtype,
                                            chunks, num_chunks, partials);
    }
  } else {
    moved = device_->ConvertWithGradStats(reduced + owned_begin * reduce_size_, reduce_dtype,
                                          owned_grads, grad_dtype, chunks, num_chunks, partials);
  }
  if (moved.ok() && options_.ddp && bucket.slot >= 0) {
    // ddp updates every piece: the other ranks' pieces of the bucket move too, without statistics.
    const int64_t owned_end = owned_begin + layout.piece_elems;
    moved = device_->ConvertElements(reduced, reduce_dtype, GradsAt(layout.flat_begin), grad_dtype,
                                     owned_begin);
    if (moved.ok()) {
      moved = device_->ConvertElements(reduced + owned_end * reduce_size_, reduce_dtype,
                                       GradsAt(layout.flat_begin + owned_end), grad_dtype,
                                       layout.padded_elems - owned_end);
    }
  }
  if (!moved.ok()) return failure_->Record(moved);
  if (bucket.slot < 0) return absl::OkStatus();
  free_slots_.push_back(bucket.slot);
  bucket.slot = -1;
  return absl::OkStatus();
}

absl::Status BucketPipeline::RetireFinished() {
  while (!in_flight_.empty() && buckets_[in_flight_.front()].reduction->Done()) {
    ZS_RETURN_IF_ERROR(RetireOldest());
  }
  return absl::OkStatus();
}

absl::Status BucketPipeline::RetireAll() {
  while (!in_flight_.empty()) ZS_RETURN_IF_ERROR(RetireOldest());
  return CheckReductions();
}

absl::Status BucketPipeline::CheckReductions() {
  while (!awaiting_check_.empty()) {
    const int64_t bucket_index = awaiting_check_.front();
    BucketState& bucket = buckets_[bucket_index];
    awaiting_check_.pop_front();
    const absl::Time wait_start = absl::Now();
    const absl::Status status = bucket.reduction->Wait();
    const absl::Time reduced = absl::Now();
    timer_->ReductionWaited(bucket_index, reduced - wait_start);
    timer_->ReductionFinished(reduced, bucket.reduction->RunTime());
    bucket.reduction.reset();
    if (!status.ok()) return failure_->Record(status);
  }
  return absl::OkStatus();
}

void BucketPipeline::ResetArrivals() {
  ZS_DCHECK(in_flight_.empty());
  for (BucketState& bucket : buckets_) bucket.elems_arrived = 0;
}

void BucketPipeline::EndStep() {
  ResetArrivals();
  accumulating_ = false;
}

bool BucketPipeline::Idle() const {
  if (!in_flight_.empty() || !awaiting_check_.empty() || free_slots_.size() != pool_.size()) {
    return false;
  }
  for (const BucketState& bucket : buckets_) {
    if (bucket.reduction != nullptr || bucket.slot >= 0) return false;
  }
  return true;
}

}  // namespace zeroshard::engine

// The shard planner: a pure, deterministic function of (tensor list, world size, options) that
// lays tensors out in one flat space, cuts that space into fixed-size buckets (a tensor may span
// several) and cuts each bucket into one equal piece per rank (docs/design.md, "Shard plan").
#ifndef ZEROSHARD_SHARDING_SHARD_PLANNER_H_
#define ZEROSHARD_SHARDING_SHARD_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dcheck.h"
#include "sharding/tensor_spec.h"

namespace zeroshard::sharding {

inline constexpr int64_t kDefaultBucketElems = int64_t{1} << 22;  // 4,194,304 elements
inline constexpr int64_t kMinBucketElems = 1024;
inline constexpr int64_t kMaxBucketElems = int64_t{1} << 30;
inline constexpr int64_t kMinWorldSize = 1;
inline constexpr int64_t kMaxWorldSize = 65536;
inline constexpr int64_t kMaxPlanTensors = 1 << 24;
// Every tensor starts at a multiple of this many elements in the flat space.
inline constexpr int64_t kTensorAlignElems = 64;
// Every bucket is padded to a multiple of lcm(world_size, kBucketAlignElems) elements.
inline constexpr int64_t kBucketAlignElems = 128;
// Upper bound on the padded flat size (about 1.1e15 elements), far from int64 overflow.
inline constexpr int64_t kMaxFlatElems = int64_t{1} << 50;

struct ShardPlanOptions {
  // The size of every bucket but the last, rounded down to a multiple of
  // lcm(world_size, kBucketAlignElems) (and at least one such multiple): see
  // EffectiveBucketElems. Buckets are fixed ranges of the flat space, whatever the tensor sizes.
  int64_t bucket_elems = kDefaultBucketElems;
};

// The bucket size a plan uses for `bucket_elems` at a bucket alignment of lcm(W, 128):
// bucket_elems rounded down to a multiple of the alignment, and at least the alignment.
int64_t EffectiveBucketElems(int64_t bucket_elems, int64_t bucket_alignment);

// Where one tensor lives in the flat space: [flat_offset, flat_offset + num_elements), which
// overlaps buckets [first_bucket, first_bucket + num_buckets) (a large tensor spans several).
struct TensorPlacement {
  int64_t flat_offset = 0;  // a multiple of kTensorAlignElems
  int64_t num_elements = 0;
  int64_t first_bucket = 0;
  int64_t num_buckets = 0;  // >= 1
  int64_t flat_end() const { return flat_offset + num_elements; }
};

// One bucket: [flat_begin, flat_begin + padded_elems), overlapping tensors
// [first_tensor, first_tensor + num_tensors) with tensor_elems of their elements (the rest is
// alignment gaps and, in the last bucket, tail padding). Rank r owns
// [flat_begin + r * piece_elems, flat_begin + (r + 1) * piece_elems).
// Invariants: padded_elems == piece_elems * world_size; every bucket but the last has
// padded_elems == the plan's bucket_elems(); every padded_elems is a multiple of
// lcm(world_size, kBucketAlignElems); bucket b + 1 starts at bucket b's flat_end().
struct BucketLayout {
  int64_t flat_begin = 0;
  int64_t padded_elems = 0;
  int64_t piece_elems = 0;
  int64_t first_tensor = 0;
  int64_t num_tensors = 0;
  int64_t tensor_elems = 0;
  int64_t flat_end() const { return flat_begin + padded_elems; }
};

// Elements [tensor_begin, tensor_end) of tensor `tensor` (tensor-local, row-major), which sit
// at flat offsets [flat_begin, flat_begin + size()). These (tensor, begin, end) coordinates do
// not depend on the world size or the bucket size, so checkpoints store them.
struct TensorFragment {
  int64_t tensor = 0;
  int64_t tensor_begin = 0;
  int64_t tensor_end = 0;
  int64_t flat_begin = 0;
  int64_t size() const { return tensor_end - tensor_begin; }
  int64_t flat_end() const { return flat_begin + size(); }
  friend bool operator==(const TensorFragment& a, const TensorFragment& b) {
    return a.tensor == b.tensor && a.tensor_begin == b.tensor_begin &&
           a.tensor_end == b.tensor_end && a.flat_begin == b.flat_begin;
  }
};

// The piece of one bucket that a rank owns, with its fragments
// fragments[first_fragment, first_fragment + num_fragments) in flat order. Elements of the
// piece that no fragment covers are padding.
struct OwnedPiece {
  int64_t bucket = 0;
  int64_t flat_begin = 0;
  int64_t flat_end = 0;
  int64_t first_fragment = 0;
  int64_t num_fragments = 0;
  int64_t size() const { return flat_end - flat_begin; }
};

// What one rank owns: one piece per bucket, in bucket order. An immutable value: safe to
// share between threads once built.
class RankView {
 public:
  RankView(int64_t rank, int64_t world_size, std::vector<OwnedPiece> pieces,
           std::vector<TensorFragment> fragments);

  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }
  absl::Span<const OwnedPiece> pieces() const { return pieces_; }
  // All fragments of all pieces, in flat order.
  absl::Span<const TensorFragment> fragments() const { return fragments_; }
  // REQUIRES: `piece` is one of pieces().
  absl::Span<const TensorFragment> FragmentsOf(const OwnedPiece& piece) const;
  // Elements this rank owns, padding included (the same for every rank).
  int64_t owned_elems() const { return owned_elems_; }
  // Elements of tensors this rank owns (owned_elems() minus padding).
  int64_t owned_tensor_elems() const { return owned_tensor_elems_; }

 private:
  int64_t rank_;
  int64_t world_size_;
  std::vector<OwnedPiece> pieces_;
  std::vector<TensorFragment> fragments_;
  int64_t owned_elems_ = 0;
  int64_t owned_tensor_elems_ = 0;
};

// The global part of a plan: O(tensors + buckets). Rank views are computed on demand, so a
// plan for many ranks is never materialised whole. Immutable after Create(): all methods are
// const and safe to call from any number of threads.
class ShardPlan {
 public:
  // Validates and plans. Errors are InvalidArgument naming the field: "tensors: empty",
  // "tensors[i].<field>: ..." (empty or duplicate name, num_elements < 1 or not the product of
  // the shape, lr_scale not finite or negative), "world_size: ..." outside
  // [kMinWorldSize, kMaxWorldSize], "bucket_elems: ..." outside [kMinBucketElems,
  // kMaxBucketElems], or a layout larger than kMaxFlatElems.
  static absl::StatusOr<ShardPlan> Create(std::vector<TensorSpec> tensors, int64_t world_size,
                                          const ShardPlanOptions& options = {});

  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  int64_t num_tensors() const { return static_cast<int64_t>(tensors_.size()); }
  int64_t world_size() const { return world_size_; }
  // The effective bucket size (ShardPlanOptions::bucket_elems, rounded; see there).
  int64_t bucket_elems() const { return bucket_elems_; }
  // lcm(world_size, kBucketAlignElems): every bucket's padded size is a multiple of it.
  int64_t bucket_alignment() const { return bucket_alignment_; }

  // Per tensor, in list order.
  absl::Span<const TensorPlacement> placements() const { return placements_; }
  // REQUIRES: 0 <= tensor < num_tensors().
  const TensorPlacement& placement(int64_t tensor) const {
    ZS_DCHECK(tensor >= 0 && tensor < num_tensors()) << "tensor " << tensor;
    return placements_[tensor];
  }
  absl::Span<const BucketLayout> buckets() const { return buckets_; }
  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }

  // Sum of the tensors' elements.
  int64_t tensor_elems() const { return tensor_elems_; }
  // Size of the flat space: the end of the last bucket, padding included.
  int64_t padded_elems() const { return padded_elems_; }
  // Elements each rank owns (padded_elems() / world_size()).
  int64_t elems_per_rank() const { return padded_elems_ / world_size_; }

  // 64-bit FNV-1a over the inputs and the resulting layout. The same in every process and
  // build; workers refuse a plan whose hash differs from the one they compute. Byte stream
  // (integers as 8 little-endian bytes, strings as length then bytes, bools as one byte,
  // floats as their IEEE bits widened to 8 bytes, doubles as their IEEE bits):
  // "zeroshard.shard_plan.v2", world size, effective bucket_elems, tensor count; per tensor
  // name, dim count, dims, num_elements, weight_decay, lr_scale; per tensor flat_offset,
  // first_bucket, num_buckets; bucket count; per bucket flat_begin, padded_elems, piece_elems,
  // first_tensor, num_tensors, tensor_elems; padded_elems().
  uint64_t layout_hash() const { return layout_hash_; }
  // FNV-1a 64 of the model alone, the same at every world size and bucket size, so checkpoints
  // can tell a model from another: "zeroshard.model.v1", tensor count; per tensor name, dim
  // count, dims, num_elements (encoded as for layout_hash()).
  uint64_t model_hash() const { return model_hash_; }

  // The pieces and fragments of one rank: O(buckets + its fragments). InvalidArgument naming
  // `rank` when it is outside [0, world_size).
  absl::StatusOr<RankView> ViewForRank(int64_t rank) const;

  // The rank that owns flat element `flat_offset`, or -1 outside [0, padded_elems()).
  int64_t OwnerOf(int64_t flat_offset) const;

  // The tensor fragments overlapping flat range [flat_begin, flat_end), clipped to it, in flat
  // order; padding yields nothing. The range is clipped to [0, padded_elems()).
  // O(log tensors + fragments).
  std::vector<TensorFragment> FragmentsInRange(int64_t flat_begin, int64_t flat_end) const;
  // The same, appended to *out (no allocation when *out has room).
  void AppendFragmentsInRange(int64_t flat_begin, int64_t flat_end,
                              std::vector<TensorFragment>* out) const;

  // A few lines for people: counts, piece sizes, and bytes per rank at
  // `bytes_per_element` bytes per element.
  std::string Describe(int64_t bytes_per_element = 4) const;

 private:
  ShardPlan() = default;
  void ComputeLayoutHash();

  std::vector<TensorSpec> tensors_;
  int64_t world_size_ = 1;
  int64_t bucket_elems_ = kDefaultBucketElems;
  int64_t bucket_alignment_ = kBucketAlignElems;
  // placements_[i] describes tensors_[i]; flat offsets increase with i.
  std::vector<TensorPlacement> placements_;
  // Buckets tile [0, padded_elems_) in order, with no gaps.
  std::vector<BucketLayout> buckets_;
  int64_t tensor_elems_ = 0;
  int64_t padded_elems_ = 0;
  uint64_t layout_hash_ = 0;
  uint64_t model_hash_ = 0;
};

}  // namespace zeroshard::sharding

#endif  // ZEROSHARD_SHARDING_SHARD_PLANNER_H_

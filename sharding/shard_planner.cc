// The shard planner: validation, the bucketed flat layout, rank views and the layout hash.
#include "sharding/shard_planner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/dcheck.h"
#include "common/status_macros.h"

namespace zeroshard::sharding {
namespace {

int64_t AlignUp(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace

int64_t EffectiveBucketElems(int64_t bucket_elems, int64_t bucket_alignment) {
  return std::max(bucket_alignment, bucket_elems / bucket_alignment * bucket_alignment);
}

namespace {

absl::Status ValidateTensor(const TensorSpec& tensor, size_t index) {
  const std::string field = absl::StrCat("tensors[", index, "]");
  if (tensor.name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".name: empty"));
  }
  if (tensor.num_elements < 1 || tensor.num_elements > kMaxFlatElems) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".num_elements: ", tensor.num_elements,
                                                   " is out of range [1, ", kMaxFlatElems, "]"));
  }
  int64_t product = 1;
  for (size_t d = 0; d < tensor.shape.size(); ++d) {
    const int64_t dim = tensor.shape[d];
    if (dim < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shape[", d, "]: ", dim, " must be positive"));
    }
    // Once the product passes num_elements it cannot come back, so stop before overflow.
    if (product > tensor.num_elements / dim) {
      product = -1;
      break;
    }
    product *= dim;
  }
  if (product != tensor.num_elements) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".shape: its product differs from num_elements ", tensor.num_elements));
  }
  if (!std::isfinite(tensor.weight_decay) || tensor.weight_decay < 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".weight_decay: ", tensor.weight_decay, " must be finite and >= 0"));
  }
  if (!std::isfinite(tensor.lr_scale) || tensor.lr_scale < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".lr_scale: ", tensor.lr_scale, " must be finite and >= 0"));
  }
  return absl::OkStatus();
}

absl::Status ValidateInputs(const std::vector<TensorSpec>& tensors, int64_t world_size,
                            const ShardPlanOptions& options) {
  if (world_size < kMinWorldSize || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world_size: ", world_size, " is out of range [",
                                                   kMinWorldSize, ", ", kMaxWorldSize, "]"));
  }
  if (options.bucket_elems < kMinBucketElems || options.bucket_elems > kMaxBucketElems) {
    return absl::InvalidArgumentError(absl::StrCat("bucket_elems: ", options.bucket_elems,
                                                   " is out of range [", kMinBucketElems, ", ",
                                                   kMaxBucketElems, "]"));
  }
  if (tensors.empty()) return absl::InvalidArgumentError("tensors: empty");
  if (static_cast<int64_t>(tensors.size()) > kMaxPlanTensors) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensors: ", tensors.size(), " tensors is more than the limit of ", kMaxPlanTensors));
  }
  absl::flat_hash_set<absl::string_view> names;
  names.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    ZS_RETURN_IF_ERROR(ValidateTensor(tensors[i], i));
    if (!names.insert(tensors[i].name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensors[", i, "].name: duplicate name '", tensors[i].name, "'"));
    }
  }
  return absl::OkStatus();
}

// 64-bit FNV-1a. Integers are fed as 8 little-endian bytes and floats as their IEEE bit
// patterns, so the value does not depend on the host or the build.
class Fnv1a64 {
 public:
  void AddByte(uint8_t byte) {
    state_ ^= byte;
    state_ *= kPrime;
  }
  void AddU64(uint64_t value) {
    for (int i = 0; i < 8; ++i) AddByte(static_cast<uint8_t>(value >> (8 * i)));
  }
  void AddI64(int64_t value) { AddU64(static_cast<uint64_t>(value)); }
  void AddDouble(double value) {
    uint64_t bits;
    static_assert(sizeof(bits) == sizeof(value), "double is not 64 bits");
    std::memcpy(&bits, &value, sizeof(bits));
    AddU64(bits);
  }
  void AddFloat(float value) {
    uint32_t bits;
    static_assert(sizeof(bits) == sizeof(value), "float is not 32 bits");
    std::memcpy(&bits, &value, sizeof(bits));
    AddU64(bits);
  }
  // Length first, so ("ab", "c") and ("a", "bc") differ.
  void AddString(absl::string_view text) {
    AddU64(text.size());
    for (char c : text) AddByte(static_cast<uint8_t>(c));
  }
  uint64_t value() const { return state_; }

 private:
  static constexpr uint64_t kOffsetBasis = 0xcbf29ce484222325ULL;
  static constexpr uint64_t kPrime = 0x100000001b3ULL;
  uint64_t state_ = kOffsetBasis;
};

}  // namespace

RankView::RankView(int64_t rank, int64_t world_size, std::vector<OwnedPiece> pieces,
                   std::vector<TensorFragment> fragments)
    : rank_(rank),
      world_size_(world_size),
      pieces_(std::move(pieces)),
      fragments_(std::move(fragments)) {
  for (const OwnedPiece& piece : pieces_) owned_elems_ += piece.size();
  for (const TensorFragment& fragment : fragments_) owned_tensor_elems_ += fragment.size();
}

absl::Span<const TensorFragment> RankView::FragmentsOf(const OwnedPiece& piece) const {
  ZS_DCHECK(piece.bucket >= 0 && piece.bucket < static_cast<int64_t>(pieces_.size()) &&
            pieces_[piece.bucket].first_fragment == piece.first_fragment &&
            pieces_[piece.bucket].num_fragments == piece.num_fragments)
      << "the piece of bucket " << piece.bucket << " is not this view's";
  return absl::MakeConstSpan(fragments_).subspan(piece.first_fragment, piece.num_fragments);
}

absl::StatusOr<ShardPlan> ShardPlan::Create(std::vector<TensorSpec> tensors, int64_t world_size,
                                            const ShardPlanOptions& options) {
  ZS_RETURN_IF_ERROR(ValidateInputs(tensors, world_size, options));

  ShardPlan plan;
  plan.world_size_ = world_size;
  plan.bucket_alignment_ = std::lcm(world_size, kBucketAlignElems);
  const int64_t num_tensors = static_cast<int64_t>(tensors.size());
  plan.placements_.resize(num_tensors);

  // Tensors sit at aligned offsets in list order; the buckets then cut the padded flat space
  // into fixed ranges, so a tensor may span several buckets and no bucket is sized by a tensor.
  int64_t content_end = 0;  // end of the last tensor placed
  for (int64_t i = 0; i < num_tensors; ++i) {
    const int64_t count = tensors[i].num_elements;
    const int64_t start = AlignUp(content_end, kTensorAlignElems);
    ZS_DCHECK_EQ(start % kTensorAlignElems, 0) << "tensor " << i;
    plan.placements_[i] = TensorPlacement{start, count, 0, 0};
    content_end = start + count;
    plan.tensor_elems_ += count;
    // content_end and count are each at most kMaxFlatElems (+ small padding): no overflow.
    if (content_end > kMaxFlatElems) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensors: the layout needs more than the limit of ", kMaxFlatElems, " elements"));
    }
  }
  plan.padded_elems_ = AlignUp(content_end, plan.bucket_alignment_);
  if (plan.padded_elems_ > kMaxFlatElems) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensors: the layout needs more than the limit of ", kMaxFlatElems, " elements"));
  }
  plan.bucket_elems_ = EffectiveBucketElems(options.bucket_elems, plan.bucket_alignment_);
  int64_t next_tensor = 0;  // the first tensor that may overlap the next bucket
  for (int64_t begin = 0; begin < plan.padded_elems_; begin += plan.bucket_elems_) {
    const int64_t end = std::min(begin + plan.bucket_elems_, plan.padded_elems_);
    const int64_t index = static_cast<int64_t>(plan.buckets_.size());
    BucketLayout bucket{begin, end - begin, (end - begin) / world_size, next_tensor, 0, 0};
    // Tensors overlapping [begin, end) are consecutive; the last one may go on into the next
    // bucket, so the scan for the next bucket restarts at it.
    int64_t t = next_tensor;
    for (; t < num_tensors && plan.placements_[t].flat_offset < end; ++t) {
      TensorPlacement& placement = plan.placements_[t];
      const int64_t overlap =
          std::min(placement.flat_end(), end) - std::max(placement.flat_offset, begin);
      ZS_DCHECK_GT(overlap, 0) << "tensor " << t << " bucket " << index;
      if (placement.num_buckets == 0) placement.first_bucket = index;
      ++placement.num_buckets;
      ++bucket.num_tensors;
      bucket.tensor_elems += overlap;
    }
    next_tensor = (t > bucket.first_tensor && plan.placements_[t - 1].flat_end() > end) ? t - 1 : t;
    // BucketLayout's invariants: buckets tile the flat space, padded to the alignment, cut into
    // equal pieces, and hold some tensor elements.
    ZS_DCHECK(plan.buckets_.empty() || plan.buckets_.back().flat_end() == begin);
    ZS_DCHECK_EQ(bucket.padded_elems % plan.bucket_alignment_, 0);
    ZS_DCHECK_EQ(bucket.piece_elems * world_size, bucket.padded_elems);
    ZS_DCHECK_GT(bucket.tensor_elems, 0) << "bucket " << index;
    plan.buckets_.push_back(bucket);
  }
  plan.tensors_ = std::move(tensors);
  plan.ComputeLayoutHash();
  return plan;
}

void ShardPlan::ComputeLayoutHash() {
  Fnv1a64 hash;
  hash.AddString("zeroshard.shard_plan.v2");
  hash.AddI64(world_size_);
  hash.AddI64(bucket_elems_);
  hash.AddI64(num_tensors());
  for (const TensorSpec& tensor : tensors_) {
    hash.AddString(tensor.name);
    hash.AddI64(static_cast<int64_t>(tensor.shape.size()));
    for (int64_t dim : tensor.shape) hash.AddI64(dim);
    hash.AddI64(tensor.num_elements);
    hash.AddDouble(tensor.weight_decay);
    hash.AddFloat(tensor.lr_scale);
  }
  for (const TensorPlacement& placement : placements_) {
    hash.AddI64(placement.flat_offset);
    hash.AddI64(placement.first_bucket);
    hash.AddI64(placement.num_buckets);
  }
  hash.AddI64(num_buckets());
  for (const BucketLayout& bucket : buckets_) {
    hash.AddI64(bucket.flat_begin);
    hash.AddI64(bucket.padded_elems);
    hash.AddI64(bucket.piece_elems);
    hash.AddI64(bucket.first_tensor);
    hash.AddI64(bucket.num_tensors);
    hash.AddI64(bucket.tensor_elems);
  }
  hash.AddI64(padded_elems_);
  layout_hash_ = hash.value();

  Fnv1a64 model;
  model.AddString("zeroshard.model.v1");
  model.AddI64(num_tensors());
  for (const TensorSpec& tensor : tensors_) {
    model.AddString(tensor.name);
    model.AddI64(static_cast<int64_t>(tensor.shape.size()));
    for (int64_t dim : tensor.shape) model.AddI64(dim);
    model.AddI64(tensor.num_elements);
  }
  model_hash_ = model.value();
}

absl::StatusOr<RankView> ShardPlan::ViewForRank(int64_t rank) const {
  if (rank < 0 || rank >= world_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", rank, " is out of range [0, ", world_size_, ")"));
  }
  std::vector<OwnedPiece> pieces;
  pieces.reserve(buckets_.size());
  std::vector<TensorFragment> fragments;
  // A piece holds parts of at most its bucket's tensors; most pieces hold one or two.
  fragments.reserve(buckets_.size() + buckets_.size() / 2 + 8);
  for (int64_t b = 0; b < num_buckets(); ++b) {
    const BucketLayout& bucket = buckets_[b];
    OwnedPiece piece;
    piece.bucket = b;
    piece.flat_begin = bucket.flat_begin + rank * bucket.piece_elems;
    piece.flat_end = piece.flat_begin + bucket.piece_elems;
    piece.first_fragment = static_cast<int64_t>(fragments.size());
    AppendFragmentsInRange(piece.flat_begin, piece.flat_end, &fragments);
    piece.num_fragments = static_cast<int64_t>(fragments.size()) - piece.first_fragment;
    pieces.push_back(piece);
  }
  RankView view(rank, world_size_, std::move(pieces), std::move(fragments));
  // Every rank owns the same number of elements: one piece of every bucket.
  ZS_DCHECK_EQ(view.owned_elems(), elems_per_rank()) << "rank " << rank;
  return view;
}

int64_t ShardPlan::OwnerOf(int64_t flat_offset) const {
  if (flat_offset < 0 || flat_offset >= padded_elems_) return -1;
  const auto bucket =
      std::partition_point(buckets_.begin(), buckets_.end(),
                           [&](const BucketLayout& b) { return b.flat_end() <= flat_offset; });
  // Buckets tile [0, padded_elems_), so some bucket holds every offset in range.
  ZS_DCHECK(bucket != buckets_.end() && bucket->flat_begin <= flat_offset);
  return (flat_offset - bucket->flat_begin) / bucket->piece_elems;
}

std::vector<TensorFragment> ShardPlan::FragmentsInRange(int64_t flat_begin,
                                                        int64_t flat_end) const {
  std::vector<TensorFragment> fragments;
  AppendFragmentsInRange(flat_begin, flat_end, &fragments);
  return fragments;
}

void ShardPlan::AppendFragmentsInRange(int64_t flat_begin, int64_t flat_end,
                                       std::vector<TensorFragment>* out) const {
  flat_begin = std::max<int64_t>(flat_begin, 0);
  flat_end = std::min(flat_end, padded_elems_);
  if (flat_begin >= flat_end) return;
  // Placements are sorted by offset and do not overlap, so their ends are sorted too.
  auto it = std::partition_point(
      placements_.begin(), placements_.end(),
      [&](const TensorPlacement& placement) { return placement.flat_end() <= flat_begin; });
  for (; it != placements_.end() && it->flat_offset < flat_end; ++it) {
    const int64_t begin = std::max(it->flat_offset, flat_begin);
    const int64_t end = std::min(it->flat_end(), flat_end);
    out->push_back(TensorFragment{static_cast<int64_t>(it - placements_.begin()),
                                  begin - it->flat_offset, end - it->flat_offset, begin});
  }
}

std::string ShardPlan::Describe(int64_t bytes_per_element) const {
  int64_t min_piece = buckets_.front().piece_elems;
  int64_t max_piece = min_piece;
  for (const BucketLayout& bucket : buckets_) {
    min_piece = std::min(min_piece, bucket.piece_elems);
    max_piece = std::max(max_piece, bucket.piece_elems);
  }
  const int64_t padding = padded_elems_ - tensor_elems_;
  return absl::StrFormat(
      "shard plan: %d tensors, %d elements, world size %d, bucket_elems %d\n"
      "buckets: %d, padded to multiples of %d; flat size %d elements (%d padding, %.2f%%)\n"
      "pieces: %d..%d elements; per rank %d elements = %d bytes at %d bytes/element\n"
      "layout hash: %016x\n",
      num_tensors(), tensor_elems_, world_size_, bucket_elems_, num_buckets(), bucket_alignment_,
      padded_elems_, padding, 100.0 * padding / padded_elems_, min_piece, max_piece,
      elems_per_rank(), elems_per_rank() * bytes_per_element, bytes_per_element, layout_hash_);
}

}  // namespace zeroshard::sharding

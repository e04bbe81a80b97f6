// Reading a committed checkpoint at any world size: which fragments of which files hold a range
// (FragmentIndex), and a reader that checks a checkpoint's files and reads verified ranges.
#ifndef ZEROSHARD_CHECKPOINT_CHECKPOINT_READER_H_
#define ZEROSHARD_CHECKPOINT_CHECKPOINT_READER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/manifest.h"
#include "checkpoint/shard_file.h"
#include "zeroshard/v1/checkpoint.pb.h"

namespace zeroshard::checkpoint {

// The part of one stored fragment that a request needs.
struct FragmentOverlap {
  size_t file = 0;      // index into FragmentIndex::files()
  size_t fragment = 0;  // index into that file's fragments (ShardReader::fragments())
  // The overlap, in the tensor's element coordinates: within both the request and the fragment.
  int64_t begin = 0;
  int64_t end = 0;
};

// Every fragment of a checkpoint's files, indexed by (state, tensor) and element range.
// Immutable after Create(): safe to query from any number of threads.
class FragmentIndex {
 public:
  struct File {
    std::string path;
    int32_t rank = 0;
    std::vector<v1::ShardFragment> fragments;
  };

  // DATA_LOSS naming both files and fragments when two fragments of one state and tensor
  // overlap or have different dtypes.
  static absl::StatusOr<FragmentIndex> Create(std::vector<File> files);

  const std::vector<File>& files() const { return files_; }

  // The fragments holding elements [begin, end) of (state, tensor), in element order, each with
  // the part of it inside the range; together they cover the range exactly. Only fragments that
  // overlap the range are named, so a rank at another world size reads only what its new pieces
  // need. NOT_FOUND naming the state, tensor and the first range no fragment holds;
  // INVALID_ARGUMENT unless 0 <= begin < end. O(log fragments + answer).
  absl::StatusOr<std::vector<FragmentOverlap>> FindFragments(absl::string_view state,
                                                             absl::string_view tensor,
                                                             int64_t begin, int64_t end) const;

  // Checks that every state of `header.states` of every tensor of `header.tensors` is held
  // whole. DATA_LOSS naming the first missing range.
  absl::Status CheckComplete(const v1::ShardHeader& header) const;

 private:
  struct Entry {
    int64_t begin;
    int64_t end;
    size_t file;
    size_t fragment;
  };
  using Key = std::pair<std::string, std::string>;  // (state, tensor)

  FragmentIndex() = default;

  std::vector<File> files_;
  // Sorted by begin; no two overlap.
  absl::flat_hash_map<Key, std::vector<Entry>> entries_;
};

// A committed checkpoint opened for reading at any world size.
// Thread contract: immutable after Open(); any number of threads may read at once.
class CheckpointReader {
 public:
  // Opens every rank file the manifest lists (headers and fragment tables only: no data is
  // read), relative to checkpoint.step_dir (a link is refused: FAILED_PRECONDITION naming it;
  // INVALID_ARGUMENT when step_dir is null). DATA_LOSS naming the file and the field when a file's
  // size differs from the manifest's, its header disagrees with the manifest (job_id, step,
  // generation, world_size, layout_hash, rank) or with rank 0's header (any field but rank),
  // fragments overlap, or some state of some tensor is not held whole
  // (FragmentIndex::CheckComplete); INVALID_ARGUMENT for a manifest ValidateManifest refuses;
  // ShardReader::Open's errors otherwise.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(CommittedCheckpoint checkpoint);

  const CommittedCheckpoint& checkpoint() const { return checkpoint_; }
  // Rank 0's header: what every file agrees on (its `rank` is 0).
  const v1::ShardHeader& header() const { return files_.front()->header(); }
  const FragmentIndex& index() const { return index_; }
  // The files in rank order (FragmentOverlap::file indexes them).
  const ShardReader& file(size_t index) const { return *files_[index]; }

  // FragmentIndex::FindFragments.
  absl::StatusOr<std::vector<FragmentOverlap>> FindFragments(absl::string_view state,
                                                             absl::string_view tensor,
                                                             int64_t begin, int64_t end) const {
    return index_.FindFragments(state, tensor, begin, end);
  }

  // Reads elements [begin, end) of (state, tensor) into `out` (out_bytes == (end - begin) x the
  // stored dtype's size): every overlapping fragment is read whole and its CRC32C verified
  // (ShardReader::ReadFragmentRange), so DATA_LOSS names a corrupt fragment and its file.
  absl::Status Read(absl::string_view state, absl::string_view tensor, int64_t begin, int64_t end,
                    void* out, size_t out_bytes) const;

 private:
  CheckpointReader(CommittedCheckpoint checkpoint, std::vector<std::unique_ptr<ShardReader>> files,
                   FragmentIndex index)
      : checkpoint_(std::move(checkpoint)), files_(std::move(files)), index_(std::move(index)) {}

  CommittedCheckpoint checkpoint_;
  std::vector<std::unique_ptr<ShardReader>> files_;
  FragmentIndex index_;
};

}  // namespace zeroshard::checkpoint

#endif  // ZEROSHARD_CHECKPOINT_CHECKPOINT_READER_H_

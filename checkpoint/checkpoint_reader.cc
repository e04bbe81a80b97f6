// A checkpoint's fragments indexed by (state, tensor) and range; the cross-checks that make the
// files of one committed checkpoint a consistent whole.
#include "checkpoint/checkpoint_reader.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"

namespace zeroshard::checkpoint {
namespace {

std::string Quoted(absl::string_view text) {
  return absl::StrCat("\"", absl::CHexEscape(text), "\"");
}

}  // namespace

absl::StatusOr<FragmentIndex> FragmentIndex::Create(std::vector<File> files) {
  FragmentIndex index;
  index.files_ = std::move(files);
  for (size_t f = 0; f < index.files_.size(); ++f) {
    const std::vector<v1::ShardFragment>& fragments = index.files_[f].fragments;
    for (size_t i = 0; i < fragments.size(); ++i) {
      index.entries_[{fragments[i].state(), fragments[i].tensor()}].push_back(
          {fragments[i].begin(), fragments[i].end(), f, i});
    }
  }
  for (auto& [key, entries] : index.entries_) {
    std::sort(entries.begin(), entries.end(),
              [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
    for (size_t k = 1; k < entries.size(); ++k) {
      const Entry& previous = entries[k - 1];
      const Entry& entry = entries[k];
      const v1::ShardFragment& a = index.files_[previous.file].fragments[previous.fragment];
      const v1::ShardFragment& b = index.files_[entry.file].fragments[entry.fragment];
      auto where = [&](const Entry& e, const v1::ShardFragment& fragment) {
        return absl::StrCat("fragment ", Quoted(FragmentKey(fragment)), " of ",
                            index.files_[e.file].path);
      };
      if (entry.begin < previous.end) {
        return absl::DataLossError(absl::StrCat(where(entry, b), " overlaps ", where(previous, a)));
      }
      if (a.dtype() != b.dtype()) {
        return absl::DataLossError(absl::StrCat(where(entry, b), " is ", v1::DType_Name(b.dtype()),
                                                " but ", where(previous, a), " is ",
                                                v1::DType_Name(a.dtype())));
      }
    }
  }
  return index;
}

absl::StatusOr<std::vector<FragmentOverlap>> FragmentIndex::FindFragments(absl::string_view state,
                                                                          absl::string_view tensor,
                                                                          int64_t begin,
                                                                          int64_t end) const {
  if (begin < 0 || begin >= end) {
    return absl::InvalidArgumentError(absl::StrCat("elements [", begin, ", ", end, ") of ", state,
                                                   "/", tensor, " are not a non-empty range"));
  }
  auto missing = [&](int64_t from, int64_t to) {
    return absl::NotFoundError(absl::StrCat("no fragment holds elements [", from, ", ", to,
                                            ") of state ", Quoted(state), " of tensor ",
                                            Quoted(tensor)));
  };
  const auto found = entries_.find(Key(state, tensor));
  if (found == entries_.end()) return missing(begin, end);
  const std::vector<Entry>& entries = found->second;
  // The first fragment ending after `begin`: the one before the first starting after it, when
  // that one reaches `begin`.
  auto it = std::upper_bound(entries.begin(), entries.end(), begin,
                             [](int64_t value, const Entry& e) { return value < e.begin; });
  if (it != entries.begin() && std::prev(it)->end > begin) --it;
  std::vector<FragmentOverlap> overlaps;
  int64_t covered = begin;
  for (; it != entries.end() && it->begin < end; ++it) {
    if (it->begin > covered) return missing(covered, it->begin);
    const int64_t overlap_end = std::min(end, it->end);
    overlaps.push_back({it->file, it->fragment, covered, overlap_end});
    covered = overlap_end;
  }
  if (covered < end) return missing(covered, end);
  return overlaps;
}

absl::Status FragmentIndex::CheckComplete(const v1::ShardHeader& header) const {
  for (const v1::CheckpointTensor& tensor : header.tensors()) {
    int64_t elements = 1;
    for (int64_t dim : tensor.shape()) elements *= dim;
    if (elements == 0) continue;
    for (const std::string& state : header.states()) {
      absl::Status found = FindFragments(state, tensor.name(), 0, elements).status();
      if (!found.ok()) return absl::DataLossError(found.message());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    CommittedCheckpoint checkpoint) {
  const v1::CheckpointManifest& manifest = checkpoint.manifest;
  absl::Status valid = ValidateManifest(manifest);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest of ", checkpoint.directory, ": ", valid.message()));
  }
  // One file per rank (ValidateManifest), in rank order.
  if (checkpoint.step_dir == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", checkpoint.directory,
        ": not opened (ListCheckpoints and OpenCommittedCheckpoint open checkpoints)"));
  }
  std::vector<const v1::CheckpointFile*> by_rank(manifest.world_size());
  for (const v1::CheckpointFile& file : manifest.files()) by_rank[file.rank()] = &file;
  std::vector<std::unique_ptr<ShardReader>> files;
  std::vector<FragmentIndex::File> tables;
  for (const v1::CheckpointFile* entry : by_rank) {
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<ShardReader> file,
                        ShardReader::Open(*checkpoint.step_dir, entry->path()));
    const std::string& path = file->path();
    auto mismatch = [&](absl::string_view field, const auto& in_file, const auto& in_manifest) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": ", field, " ", in_file,
                                              ", but the manifest says ", in_manifest));
    };
    const v1::ShardHeader& header = file->header();
    if (static_cast<int64_t>(file->file_size()) != entry->bytes()) {
      return mismatch("size", file->file_size(), entry->bytes());
    }
    if (header.job_id() != manifest.job_id()) {
      return mismatch("job_id", header.job_id(), manifest.job_id());
    }
    if (header.step() != manifest.step()) return mismatch("step", header.step(), manifest.step());
    if (header.generation() != manifest.generation()) {
      return mismatch("generation", header.generation(), manifest.generation());
    }
    if (header.world_size() != manifest.world_size()) {
      return mismatch("world_size", header.world_size(), manifest.world_size());
    }
    if (header.layout_hash() != manifest.layout_hash()) {
      return mismatch("layout_hash", header.layout_hash(), manifest.layout_hash());
    }
    if (header.rank() != entry->rank()) return mismatch("rank", header.rank(), entry->rank());
    if (!files.empty()) {
      v1::ShardHeader as_rank0 = header;
      as_rank0.set_rank(0);
      std::string difference;
      google::protobuf::util::MessageDifferencer differencer;
      differencer.ReportDifferencesToString(&difference);
      if (!differencer.Compare(files.front()->header(), as_rank0)) {
        return absl::DataLossError(
            absl::StrCat("checkpoint file ", path, ": header differs from rank 0's: ", difference));
      }
    }
    tables.push_back({path, entry->rank(), file->fragments()});
    files.push_back(std::move(file));
  }
  ZS_ASSIGN_OR_RETURN(FragmentIndex index, FragmentIndex::Create(std::move(tables)));
  absl::Status complete = index.CheckComplete(files.front()->header());
  if (!complete.ok()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", checkpoint.directory, ": ", complete.message()));
  }
  return std::unique_ptr<CheckpointReader>(
      new CheckpointReader(std::move(checkpoint), std::move(files), std::move(index)));
}

absl::Status CheckpointReader::Read(absl::string_view state, absl::string_view tensor,
                                    int64_t begin, int64_t end, void* out, size_t out_bytes) const {
  ZS_ASSIGN_OR_RETURN(const std::vector<FragmentOverlap> overlaps,
                      index_.FindFragments(state, tensor, begin, end));
  const v1::ShardFragment& first =
      files_[overlaps.front().file]->fragments()[overlaps.front().fragment];
  const size_t element_bytes = FragmentDTypeSize(first.dtype());
  if (out_bytes != static_cast<size_t>(end - begin) * element_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("elements [", begin, ", ", end, ") of ", state, "/", tensor, " are ",
                     static_cast<size_t>(end - begin) * element_bytes, " bytes of ",
                     v1::DType_Name(first.dtype()), ", not ", out_bytes));
  }
  char* bytes = static_cast<char*>(out);
  for (const FragmentOverlap& overlap : overlaps) {
    ZS_RETURN_IF_ERROR(files_[overlap.file]->ReadFragmentRange(
        overlap.fragment, overlap.begin, overlap.end,
        bytes + static_cast<size_t>(overlap.begin - begin) * element_bytes,
        static_cast<size_t>(overlap.end - overlap.begin) * element_bytes));
  }
  return absl::OkStatus();
}

}  // namespace zeroshard::checkpoint

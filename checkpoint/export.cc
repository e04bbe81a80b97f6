// Export: plans the consolidated file from a checkpoint's header and fragment index, then reads
// one fragment at a time, widening it to fp32 a piece at a time.
#include "checkpoint/export.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/file_io.h"
#include "common/status_macros.h"
#include "numerics/dtype.h"

namespace zeroshard::checkpoint {
namespace {

// Stored fragments are little-endian; they are reinterpreted in place.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint data is little-endian");

bool WidensExactly(v1::DType dtype) {
  return dtype == v1::FLOAT32 || dtype == v1::BFLOAT16 || dtype == v1::FLOAT16;
}

float Widen(v1::DType dtype, const char* element) {
  uint16_t bits;
  std::memcpy(&bits, element, sizeof(bits));
  return dtype == v1::BFLOAT16 ? numerics::BFloat16ToFloat(bits) : numerics::HalfToFloat(bits);
}

bool HasState(const v1::ShardHeader& header, absl::string_view state) {
  return std::find(header.states().begin(), header.states().end(), state) != header.states().end();
}

// Passes `n` bytes to `sink` in pieces of at most `chunk_bytes`.
absl::Status SinkInPieces(const char* data, size_t n, size_t chunk_bytes, const ByteSink& sink) {
  for (size_t at = 0; at < n; at += chunk_bytes) {
    ZS_RETURN_IF_ERROR(sink(data + at, std::min(chunk_bytes, n - at)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckpointExport> CheckpointExport::Create(const CheckpointReader* reader,
                                                          bool is_final, const Aliases& aliases) {
  const v1::ShardHeader& header = reader->header();
  std::string state;
  if (HasState(header, kMasterState)) {
    state = kMasterState;
  } else if (HasState(header, kParamState)) {
    state = kParamState;
  } else {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", reader->checkpoint().directory, " holds neither \"", kMasterState,
        "\" nor \"", kParamState, "\" (its states: ", absl::StrJoin(header.states(), ", "), ")"));
  }
  for (const FragmentIndex::File& file : reader->index().files()) {
    for (const v1::ShardFragment& fragment : file.fragments) {
      if (fragment.state() == state && !WidensExactly(fragment.dtype())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "fragment \"", absl::CHexEscape(FragmentKey(fragment)), "\" of ", file.path, " is ",
            v1::DType_Name(fragment.dtype()), ", which does not convert to fp32 exactly"));
      }
    }
  }
  std::vector<TensorDecl> tensors;
  std::vector<std::string> sources;
  tensors.reserve(header.tensors_size());
  size_t aliased = 0;
  for (const v1::CheckpointTensor& tensor : header.tensors()) {
    std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
    tensors.push_back({tensor.name(), SafetensorsDType::kF32, shape});
    sources.push_back(tensor.name());
    const auto found = aliases.find(tensor.name());
    if (found == aliases.end()) continue;
    ++aliased;
    for (const std::string& alias : found->second) {
      tensors.push_back({alias, SafetensorsDType::kF32, shape});
      sources.push_back(tensor.name());
    }
  }
  if (aliased != aliases.size()) {
    for (const auto& [name, unused] : aliases) {
      if (std::find(sources.begin(), sources.end(), name) == sources.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("aliases: checkpoint ", reader->checkpoint().directory,
                         " holds no tensor \"", absl::CHexEscape(name), "\" to export them of"));
      }
    }
  }
  SafetensorsMetadata metadata = {
      {kExportFormatKey, kExportFormat},
      {kExportJobIdKey, header.job_id()},
      {kExportStepKey, absl::StrCat(header.step())},
      {kExportSourceKey, is_final ? "final" : absl::StrCat("step ", header.step())},
  };
  ZS_ASSIGN_OR_RETURN(SafetensorsHead head, EncodeSafetensorsHead(tensors, metadata));
  return CheckpointExport(reader, std::move(state), std::move(tensors), std::move(sources),
                          std::move(metadata), std::move(head));
}

absl::Status CheckpointExport::Stream(const ByteSink& sink, size_t chunk_bytes) const {
  if (chunk_bytes == 0) return absl::InvalidArgumentError("chunk_bytes: must be > 0");
  ZS_RETURN_IF_ERROR(SinkInPieces(head_.bytes.data(), head_.bytes.size(), chunk_bytes, sink));
  for (size_t i = 0; i < tensors_.size(); ++i) {
    ZS_RETURN_IF_ERROR(StreamTensor(tensors_[i], sources_[i], sink, chunk_bytes));
  }
  return absl::OkStatus();
}

absl::Status CheckpointExport::StreamTensor(const TensorDecl& tensor, const std::string& source,
                                            const ByteSink& sink, size_t chunk_bytes) const {
  int64_t elements = 1;
  for (int64_t dim : tensor.shape) elements *= dim;
  if (elements == 0) return absl::OkStatus();
  ZS_ASSIGN_OR_RETURN(const std::vector<FragmentOverlap> overlaps,
                      reader_->FindFragments(source_state_, source, 0, elements));
  // The whole tensor is asked for, so each overlap is one whole fragment.
  std::string stored;
  const size_t widen_elements = std::max<size_t>(1, chunk_bytes / sizeof(float));
  std::unique_ptr<float[]> widened;
  for (const FragmentOverlap& overlap : overlaps) {
    const ShardReader& file = reader_->file(overlap.file);
    const v1::DType dtype = file.fragments()[overlap.fragment].dtype();
    const size_t element_bytes = FragmentDTypeSize(dtype);
    const size_t count = static_cast<size_t>(overlap.end - overlap.begin);
    stored.resize(count * element_bytes);
    ZS_RETURN_IF_ERROR(file.ReadFragmentRange(overlap.fragment, overlap.begin, overlap.end,
                                              stored.data(), stored.size()));
    if (dtype == v1::FLOAT32) {
      ZS_RETURN_IF_ERROR(SinkInPieces(stored.data(), stored.size(), chunk_bytes, sink));
      continue;
    }
    if (widened == nullptr) widened = std::make_unique<float[]>(widen_elements);
    for (size_t at = 0; at < count; at += widen_elements) {
      const size_t n = std::min(widen_elements, count - at);
      for (size_t i = 0; i < n; ++i) {
        widened[i] = Widen(dtype, stored.data() + (at + i) * element_bytes);
      }
      ZS_RETURN_IF_ERROR(SinkInPieces(reinterpret_cast<const char*>(widened.get()),
                                      n * sizeof(float), chunk_bytes, sink));
    }
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<WrittenFile> StreamInto(const CheckpointExport& plan,
                                       std::unique_ptr<DurableFile> file) {
  uint32_t crc = 0;
  ZS_RETURN_IF_ERROR(plan.Stream([&](const void* data, size_t n) {
    crc = Crc32cExtend(crc, data, n);
    return file->Append(data, n);
  }));
  ZS_RETURN_IF_ERROR(file->Commit());
  WrittenFile written;
  written.path = file->final_path();
  written.bytes = file->size();
  written.crc32c = crc;
  return written;
}

}  // namespace

absl::StatusOr<WrittenFile> WriteExportFile(const CheckpointExport& plan,
                                            const Directory& directory, std::string name) {
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<DurableFile> file,
                      DurableFile::Create(directory, std::move(name)));
  return StreamInto(plan, std::move(file));
}

absl::StatusOr<WrittenFile> WriteExportFile(const CheckpointExport& plan, const std::string& path) {
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<DurableFile> file, DurableFile::Create(path));
  return StreamInto(plan, std::move(file));
}

}  // namespace zeroshard::checkpoint

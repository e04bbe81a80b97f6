// One rank's shard file: validation shared by the writer and the reader, the fragment table in
// __metadata__ (written with placeholder checksums, rewritten at Finish), CRC-checked reads.
#include "checkpoint/shard_file.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/proto_json.h"
#include "common/status_macros.h"

namespace zeroshard::checkpoint {
namespace {

// Reads of a fragment go through a scratch buffer of at most this size (the part a caller asks
// for goes straight to its buffer).
constexpr size_t kReadChunkBytes = size_t{4} << 20;

// The widest uint32: the placeholder checksum, so that the real table is never longer.
constexpr uint32_t kPlaceholderCrc = 0xFFFFFFFFu;

SafetensorsDType ToSafetensorsDType(v1::DType dtype) {
  switch (dtype) {
    case v1::BFLOAT16:
      return SafetensorsDType::kBF16;
    case v1::FLOAT16:
      return SafetensorsDType::kF16;
    case v1::FLOAT64:
      return SafetensorsDType::kF64;
    default:
      return SafetensorsDType::kF32;
  }
}

std::string Quoted(absl::string_view text) {
  return absl::StrCat("\"", absl::CHexEscape(text), "\"");
}

absl::Status ValidateHeader(const v1::ShardHeader& header) {
  if (header.job_id().empty()) return absl::InvalidArgumentError("header.job_id: empty");
  if (header.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("header.step: ", header.step(), " < 0"));
  }
  if (header.generation() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.generation: ", header.generation(), " < 0"));
  }
  if (header.world_size() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.world_size: ", header.world_size(), " < 1"));
  }
  if (header.rank() < 0 || header.rank() >= header.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.rank: ", header.rank(), " outside [0, ", header.world_size(), ")"));
  }
  if (header.optimizer_step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.optimizer_step: ", header.optimizer_step(), " < 0"));
  }
  if (!std::isfinite(header.loss_scale()) || header.loss_scale() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.loss_scale: ", header.loss_scale(), " is not finite and > 0"));
  }
  if (header.loss_scale_good_steps() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.loss_scale_good_steps: ", header.loss_scale_good_steps(), " < 0"));
  }
  if (FragmentDTypeSize(header.param_dtype()) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header.param_dtype: ", v1::DType_Name(header.param_dtype()), " is not a tensor dtype"));
  }
  if (header.tensors().empty()) return absl::InvalidArgumentError("header.tensors: empty");
  absl::flat_hash_set<absl::string_view> names;
  for (int i = 0; i < header.tensors_size(); ++i) {
    const v1::CheckpointTensor& tensor = header.tensors(i);
    if (tensor.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("header.tensors[", i, "].name: empty"));
    }
    if (!names.insert(tensor.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("header.tensors[", i, "].name: duplicate ", Quoted(tensor.name())));
    }
    for (int64_t dim : tensor.shape()) {
      if (dim < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "header.tensors[", i, "] ", Quoted(tensor.name()), ": negative dimension ", dim));
      }
    }
  }
  if (header.tensor_steps_size() != 0 && header.tensor_steps_size() != header.tensors_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.tensor_steps: ", header.tensor_steps_size(), " entries for ",
                     header.tensors_size(), " tensors"));
  }
  for (int i = 0; i < header.tensor_steps_size(); ++i) {
    if (header.tensor_steps(i) < 0 || header.tensor_steps(i) > header.optimizer_step()) {
      return absl::InvalidArgumentError(
          absl::StrCat("header.tensor_steps[", i, "]: ", header.tensor_steps(i),
                       " outside [0, optimizer_step ", header.optimizer_step(), "]"));
    }
  }
  absl::flat_hash_set<absl::string_view> states;
  for (int i = 0; i < header.states_size(); ++i) {
    absl::Status valid = ValidateStateName(header.states(i));
    if (!valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("header.states[", i, "]: ", valid.message()));
    }
    if (!states.insert(header.states(i)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("header.states[", i, "]: duplicate ", Quoted(header.states(i))));
    }
  }
  return absl::OkStatus();
}

// Checks fragments (ShardFragment, or anything with its accessors) against a valid header.
template <typename Fragment>
absl::Status ValidateFragments(const v1::ShardHeader& header,
                               const std::vector<Fragment>& fragments) {
  absl::flat_hash_map<absl::string_view, int64_t> elements;
  for (const v1::CheckpointTensor& tensor : header.tensors()) {
    int64_t n = 1;
    for (int64_t dim : tensor.shape()) {
      if (__builtin_mul_overflow(n, dim, &n)) {
        return absl::InvalidArgumentError(
            absl::StrCat("header.tensors ", Quoted(tensor.name()), ": shape overflows int64"));
      }
    }
    elements.emplace(tensor.name(), n);
  }
  const absl::flat_hash_set<absl::string_view> states(header.states().begin(),
                                                      header.states().end());
  // Per (state, tensor): (begin, end, index), to find overlaps.
  absl::flat_hash_map<std::pair<absl::string_view, absl::string_view>,
                      std::vector<std::tuple<int64_t, int64_t, size_t>>>
      ranges;
  for (size_t i = 0; i < fragments.size(); ++i) {
    const Fragment& f = fragments[i];
    const std::string where = absl::StrCat(
        "fragments[", i, "] ", Quoted(FragmentKey(f.state(), f.tensor(), f.begin(), f.end())));
    if (!states.contains(f.state())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": state ", Quoted(f.state()), " is not in header.states"));
    }
    const auto tensor = elements.find(f.tensor());
    if (tensor == elements.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor ", Quoted(f.tensor()), " is not in header.tensors"));
    }
    if (f.begin() < 0 || f.begin() >= f.end() || f.end() > tensor->second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": elements [", f.begin(), ", ",
                                                     f.end(), ") are not a non-empty part of [0, ",
                                                     tensor->second, ")"));
    }
    if (FragmentDTypeSize(f.dtype()) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": dtype ", v1::DType_Name(f.dtype()), " is not a tensor dtype"));
    }
    ranges[{f.state(), f.tensor()}].emplace_back(f.begin(), f.end(), i);
  }
  for (auto& [state_and_tensor, list] : ranges) {
    std::sort(list.begin(), list.end());
    for (size_t k = 1; k < list.size(); ++k) {
      const auto& [begin, end, index] = list[k];
      const auto& [previous_begin, previous_end, previous_index] = list[k - 1];
      if (begin < previous_end) {
        return absl::InvalidArgumentError(absl::StrCat(
            "fragments[", index, "] ",
            Quoted(FragmentKey(state_and_tensor.first, state_and_tensor.second, begin, end)),
            " overlaps fragments[", previous_index, "] ",
            Quoted(FragmentKey(state_and_tensor.first, state_and_tensor.second, previous_begin,
                               previous_end))));
      }
    }
  }
  return absl::OkStatus();
}

// Accessors with the proto's names, so that ValidateFragments serves both representations.
struct SpecView {
  const FragmentSpec* spec;
  const std::string& state() const { return spec->state; }
  const std::string& tensor() const { return spec->tensor; }
  int64_t begin() const { return spec->begin; }
  int64_t end() const { return spec->end; }
  v1::DType dtype() const { return spec->dtype; }
};

v1::ShardFragmentTable MakeTable(const std::vector<FragmentSpec>& fragments) {
  v1::ShardFragmentTable table;
  for (const FragmentSpec& spec : fragments) {
    v1::ShardFragment* fragment = table.add_fragments();
    fragment->set_state(spec.state);
    fragment->set_tensor(spec.tensor);
    fragment->set_begin(spec.begin);
    fragment->set_end(spec.end);
    fragment->set_dtype(spec.dtype);
    fragment->set_crc32c(kPlaceholderCrc);
  }
  return table;
}

}  // namespace

std::string FragmentKey(absl::string_view state, absl::string_view tensor, int64_t begin,
                        int64_t end) {
  return absl::StrCat(state, "/", tensor, "/", begin, "-", end);
}

std::string FragmentKey(const v1::ShardFragment& fragment) {
  return FragmentKey(fragment.state(), fragment.tensor(), fragment.begin(), fragment.end());
}

absl::Status ValidateStateName(absl::string_view state) {
  if (state.empty() || state.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("state name ", Quoted(state), " is not 1 to 64 characters"));
  }
  for (char c : state) {
    const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                         (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (!allowed) {
      return absl::InvalidArgumentError(
          absl::StrCat("state name ", Quoted(state), " has a character outside [A-Za-z0-9_.-]"));
    }
  }
  return absl::OkStatus();
}

int FragmentDTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return 4;
    case v1::BFLOAT16:
    case v1::FLOAT16:
      return 2;
    case v1::FLOAT64:
      return 8;
    default:
      return 0;
  }
}

// ---- ShardWriter ----

absl::StatusOr<std::unique_ptr<ShardWriter>> ShardWriter::Create(
    const Directory& directory, std::string name, v1::ShardHeader header,
    std::vector<FragmentSpec> fragments) {
  return Create(std::move(header), std::move(fragments),
                [&](std::vector<TensorDecl> tensors, SafetensorsMetadata metadata) {
                  return SafetensorsWriter::Create(directory, std::move(name), std::move(tensors),
                                                   std::move(metadata));
                });
}

absl::StatusOr<std::unique_ptr<ShardWriter>> ShardWriter::Create(
    std::string path, v1::ShardHeader header, std::vector<FragmentSpec> fragments) {
  return Create(std::move(header), std::move(fragments),
                [&](std::vector<TensorDecl> tensors, SafetensorsMetadata metadata) {
                  return SafetensorsWriter::Create(std::move(path), std::move(tensors),
                                                   std::move(metadata));
                });
}

absl::StatusOr<std::unique_ptr<ShardWriter>> ShardWriter::Create(
    v1::ShardHeader header, std::vector<FragmentSpec> fragments,
    absl::FunctionRef<absl::StatusOr<std::unique_ptr<SafetensorsWriter>>(std::vector<TensorDecl>,
                                                                         SafetensorsMetadata)>
        open) {
  header.set_format_version(kShardFormatVersion);
  ZS_RETURN_IF_ERROR(ValidateHeader(header));
  std::vector<SpecView> views;
  views.reserve(fragments.size());
  for (const FragmentSpec& spec : fragments) views.push_back({&spec});
  ZS_RETURN_IF_ERROR(ValidateFragments(header, views));

  std::vector<TensorDecl> tensors;
  tensors.reserve(fragments.size());
  for (const FragmentSpec& spec : fragments) {
    tensors.push_back({FragmentKey(spec.state, spec.tensor, spec.begin, spec.end),
                       ToSafetensorsDType(spec.dtype),
                       {spec.num_elements()}});
  }
  SafetensorsMetadata metadata = {{kShardHeaderMetadataKey, ToJson(header)},
                                  {kFragmentTableMetadataKey, ToJson(MakeTable(fragments))}};
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> file,
                      open(std::move(tensors), std::move(metadata)));
  return std::unique_ptr<ShardWriter>(
      new ShardWriter(std::move(file), std::move(header), std::move(fragments)));
}

ShardWriter::ShardWriter(std::unique_ptr<SafetensorsWriter> file, v1::ShardHeader header,
                         std::vector<FragmentSpec> fragments)
    : file_(std::move(file)), header_(std::move(header)), fragments_(std::move(fragments)) {}

absl::Status ShardWriter::Append(const void* data, size_t n) { return file_->Append(data, n); }

absl::StatusOr<WrittenFile> ShardWriter::Finish() {
  if (file_->data_written() != file_->data_bytes()) return file_->Finish().status();
  v1::ShardFragmentTable table = MakeTable(fragments_);
  for (int i = 0; i < table.fragments_size(); ++i) {
    table.mutable_fragments(i)->set_crc32c(file_->tensor_crc32c(i));
  }
  ZS_RETURN_IF_ERROR(file_->SetMetadata(
      {{kShardHeaderMetadataKey, ToJson(header_)}, {kFragmentTableMetadataKey, ToJson(table)}}));
  return file_->Finish();
}

absl::StatusOr<WrittenFile> WriteShardFile(std::string path, v1::ShardHeader header,
                                           std::vector<FragmentSpec> fragments,
                                           const FragmentProducer& produce) {
  ZS_ASSIGN_OR_RETURN(
      std::unique_ptr<ShardWriter> writer,
      ShardWriter::Create(std::move(path), std::move(header), std::move(fragments)));
  for (size_t i = 0; i < writer->fragments().size(); ++i) {
    const FragmentSpec& spec = writer->fragments()[i];
    const uint64_t expected =
        static_cast<uint64_t>(spec.num_elements()) * FragmentDTypeSize(spec.dtype);
    uint64_t produced = 0;
    auto wrong_size = [&](uint64_t bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fragments[", i, "] ", Quoted(FragmentKey(spec.state, spec.tensor, spec.begin, spec.end)),
          ": ", bytes, " bytes produced for ", expected));
    };
    const ByteSink sink = [&](const void* data, size_t n) -> absl::Status {
      // Checked per chunk: a chunk past the fragment's end would become the next one's bytes.
      if (n > expected - produced) return wrong_size(produced + n);
      produced += n;
      return writer->Append(data, n);
    };
    ZS_RETURN_IF_ERROR(produce(i, sink));
    if (produced != expected) return wrong_size(produced);
  }
  return writer->Finish();
}

absl::StatusOr<WrittenFile> WriteShardFile(std::string path, v1::ShardHeader header,
                                           absl::Span<const FragmentBytes> fragments) {
  std::vector<FragmentSpec> specs;
  specs.reserve(fragments.size());
  for (const FragmentBytes& fragment : fragments) specs.push_back(fragment.spec);
  return WriteShardFile(std::move(path), std::move(header), std::move(specs),
                        [&](size_t index, const ByteSink& sink) {
                          return sink(fragments[index].bytes.data(), fragments[index].bytes.size());
                        });
}

// ---- ShardReader ----

absl::StatusOr<std::unique_ptr<ShardReader>> ShardReader::Open(const std::string& path) {
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> file, SafetensorsReader::Open(path));
  return Open(std::move(file));
}

absl::StatusOr<std::unique_ptr<ShardReader>> ShardReader::Open(const Directory& directory,
                                                               absl::string_view name) {
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> file,
                      SafetensorsReader::Open(directory, name));
  return Open(std::move(file));
}

absl::StatusOr<std::unique_ptr<ShardReader>> ShardReader::Open(
    std::unique_ptr<SafetensorsReader> file) {
  const std::string path = file->path();
  auto corrupt = [&path](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": ", what));
  };
  const SafetensorsMetadata& metadata = file->metadata();
  const auto header_json = metadata.find(kShardHeaderMetadataKey);
  const auto table_json = metadata.find(kFragmentTableMetadataKey);
  if (header_json == metadata.end()) {
    return corrupt(absl::StrCat("__metadata__ has no \"", kShardHeaderMetadataKey, "\""));
  }
  if (table_json == metadata.end()) {
    return corrupt(absl::StrCat("__metadata__ has no \"", kFragmentTableMetadataKey, "\""));
  }
  v1::ShardHeader header;
  absl::Status parsed = FromJson(header_json->second, kShardHeaderMetadataKey, &header);
  if (!parsed.ok()) return corrupt(parsed.message());
  if (header.format_version() != kShardFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint file ", path, ": format_version ", header.format_version(),
                     " is not the version this reader knows (", kShardFormatVersion, ")"));
  }
  absl::Status valid = ValidateHeader(header);
  if (!valid.ok()) return corrupt(valid.message());
  v1::ShardFragmentTable table;
  parsed = FromJson(table_json->second, kFragmentTableMetadataKey, &table);
  if (!parsed.ok()) return corrupt(parsed.message());
  std::vector<v1::ShardFragment> fragments(table.fragments().begin(), table.fragments().end());
  valid = ValidateFragments(header, fragments);
  if (!valid.ok()) return corrupt(valid.message());

  std::vector<const TensorInfo*> tensors;
  tensors.reserve(fragments.size());
  for (size_t i = 0; i < fragments.size(); ++i) {
    const v1::ShardFragment& fragment = fragments[i];
    const std::string key = FragmentKey(fragment);
    const TensorInfo* tensor = file->Find(key);
    if (tensor == nullptr) {
      return corrupt(absl::StrCat("fragment ", Quoted(key), " has no safetensors tensor"));
    }
    if (tensor->dtype != ToSafetensorsDType(fragment.dtype()) ||
        tensor->shape != std::vector<int64_t>{fragment.end() - fragment.begin()}) {
      return corrupt(absl::StrCat("fragment ", Quoted(key), " (", v1::DType_Name(fragment.dtype()),
                                  ", ", fragment.end() - fragment.begin(),
                                  " elements) is stored as ", SafetensorsDTypeName(tensor->dtype),
                                  " [", absl::StrJoin(tensor->shape, ","), "]"));
    }
    tensors.push_back(tensor);
  }
  // Names are unique on both sides, so equal counts mean every tensor is a fragment.
  if (file->tensors().size() != fragments.size()) {
    for (const TensorInfo& tensor : file->tensors()) {
      if (std::find(tensors.begin(), tensors.end(), &tensor) == tensors.end()) {
        return corrupt(
            absl::StrCat("safetensors tensor ", Quoted(tensor.name), " is in no fragment"));
      }
    }
  }
  return std::unique_ptr<ShardReader>(new ShardReader(std::move(file), std::move(header),
                                                      std::move(fragments), std::move(tensors)));
}

ShardReader::ShardReader(std::unique_ptr<SafetensorsReader> file, v1::ShardHeader header,
                         std::vector<v1::ShardFragment> fragments,
                         std::vector<const TensorInfo*> tensors)
    : file_(std::move(file)),
      header_(std::move(header)),
      fragments_(std::move(fragments)),
      tensors_(std::move(tensors)) {}

absl::Status ShardReader::ReadFragmentRange(size_t index, int64_t begin, int64_t end, void* out,
                                            size_t out_bytes) const {
  if (index >= fragments_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint file ", path(), ": fragment index ",
                                                   index, " of ", fragments_.size()));
  }
  const v1::ShardFragment& fragment = fragments_[index];
  const std::string key = FragmentKey(fragment);
  if (begin < fragment.begin() || begin >= end || end > fragment.end()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint file ", path(), ": elements [",
                                                   begin, ", ", end, ") are not within fragment ",
                                                   Quoted(key)));
  }
  const uint64_t element_bytes = FragmentDTypeSize(fragment.dtype());
  const uint64_t want_begin = static_cast<uint64_t>(begin - fragment.begin()) * element_bytes;
  const uint64_t want_end = static_cast<uint64_t>(end - fragment.begin()) * element_bytes;
  if (out_bytes != want_end - want_begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint file ", path(), ": fragment ", Quoted(key), " elements [", begin,
                     ", ", end, ") are ", want_end - want_begin, " bytes, not ", out_bytes));
  }
  const TensorInfo& tensor = *tensors_[index];
  const uint64_t total = tensor.num_bytes();
  std::vector<char> scratch(std::min<uint64_t>(kReadChunkBytes, total - (want_end - want_begin)));
  uint32_t crc = 0;
  // Three spans: before the wanted part (scratch), the wanted part (out), after it (scratch).
  auto read_through_scratch = [&](uint64_t from, uint64_t to) -> absl::Status {
    while (from < to) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(to - from, scratch.size()));
      ZS_RETURN_IF_ERROR(file_->ReadTensorBytes(tensor, from, scratch.data(), n));
      crc = Crc32cExtend(crc, scratch.data(), n);
      from += n;
    }
    return absl::OkStatus();
  };
  ZS_RETURN_IF_ERROR(read_through_scratch(0, want_begin));
  ZS_RETURN_IF_ERROR(file_->ReadTensorBytes(tensor, want_begin, out, out_bytes));
  crc = Crc32cExtend(crc, out, out_bytes);
  ZS_RETURN_IF_ERROR(read_through_scratch(want_end, total));
  if (crc != fragment.crc32c()) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint file %s: fragment %s has CRC32C 0x%08x, but the fragment table records "
        "0x%08x",
        path(), Quoted(key), crc, fragment.crc32c()));
  }
  return absl::OkStatus();
}

absl::Status ShardReader::ReadFragment(size_t index, void* out, size_t out_bytes) const {
  if (index >= fragments_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint file ", path(), ": fragment index ",
                                                   index, " of ", fragments_.size()));
  }
  return ReadFragmentRange(index, fragments_[index].begin(), fragments_[index].end(), out,
                           out_bytes);
}

}  // namespace zeroshard::checkpoint

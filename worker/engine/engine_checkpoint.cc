// The engine's side of checkpoints: which fragments a rank saves, copying them to a staging
// buffer at a step boundary, and loading a checkpoint written at any world size.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "common/dcheck.h"
#include "common/status_macros.h"
#include "worker/engine/engine.h"

namespace zeroshard::engine {
namespace {

using numerics::DType;

constexpr char kParamState[] = "param";
constexpr char kMasterState[] = "master";

}  // namespace

void Engine::BuildSavedFragments() {
  std::vector<std::pair<std::string, DType>> states = {{kParamState, config_.param_dtype}};
  if (HasMaster()) states.emplace_back(kMasterState, DType::kFloat32);
  for (int k = 0; k < state_arrays_; ++k) {
    states.emplace_back(kernels::StateArrayName(config_.optimizer, k), DType::kFloat32);
  }
  absl::Span<const sharding::OwnedPiece> pieces = view_.pieces();
  size_t piece = 0;
  for (const sharding::TensorFragment& fragment : view_.fragments()) {
    while (fragment.flat_begin >= pieces[piece].flat_end) ++piece;
    saved_piece_.push_back(piece);
  }
  saved_bytes_ = 0;
  for (const auto& [state, dtype] : states) {
    for (const sharding::TensorFragment& fragment : view_.fragments()) {
      SavedFragment saved;
      saved.state = state;
      saved.tensor = fragment.tensor;
      saved.begin = fragment.tensor_begin;
      saved.end = fragment.tensor_end;
      saved.dtype = dtype;
      saved.staging_offset = saved_bytes_;
      saved_bytes_ += saved.bytes();
      saved_fragments_.push_back(std::move(saved));
    }
  }
}

char* Engine::StateAt(absl::string_view state, const sharding::TensorFragment& fragment,
                      const sharding::OwnedPiece* piece, int64_t element) const {
  const int64_t flat = fragment.flat_begin + (element - fragment.tensor_begin);
  // ddp keeps masters and state in plan layout; zero1/zero2/zero3 in the owned layout.
  const int64_t index =
      piece == nullptr ? flat : OwnedOffset(piece->bucket) + flat - piece->flat_begin;
  if (state == kParamState) {
    // Plan layout in every mode but zero3, which keeps only the owned layout.
    if (!ShardsParameters()) return ParamsAt(flat);
    ZS_DCHECK(piece != nullptr) << "zero3 parameters are addressed by owned piece";
    return OwnedParamsAt(index);
  }
  if (state == kMasterState) return reinterpret_cast<char*>(master_.as<float>() + index);
  for (int k = 0; k < state_arrays_; ++k) {
    if (state == kernels::StateArrayName(config_.optimizer, k)) {
      return reinterpret_cast<char*>(state_[k].as<float>() + index);
    }
  }
  ZS_DCHECK(false) << "no state array named " << state;
  return nullptr;
}

char* Engine::SavedAt(size_t index, int64_t element) const {
  const size_t f = index % saved_piece_.size();
  const sharding::OwnedPiece* piece =
      config_.mode == EngineMode::kDdp ? nullptr : &view_.pieces()[saved_piece_[f]];
  return StateAt(saved_fragments_[index].state, view_.fragments()[f], piece, element);
}

absl::StatusOr<Engine::SavedScalars> Engine::CopyStateTo(absl::Span<char> staging) {
  ZS_RETURN_IF_ERROR(failure_.status());
  if (StepInProgress()) return absl::FailedPreconditionError("CopyStateTo during a step");
  if (static_cast<int64_t>(staging.size()) != saved_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging: ", staging.size(), " bytes, the saved state is ", saved_bytes_));
  }
  for (size_t i = 0; i < saved_fragments_.size(); ++i) {
    const SavedFragment& saved = saved_fragments_[i];
    ZS_RETURN_IF_ERROR(RecordFailure(device_->CopyToHost(staging.data() + saved.staging_offset,
                                                         SavedAt(i, saved.begin), saved.bytes())));
  }
  return scalars();
}

Engine::SavedScalars Engine::scalars() const {
  SavedScalars saved{optimizer_step_, loss_scaler_.scale(), loss_scaler_.good_steps(), {}};
  // Listed only once they differ from optimizer_step: checkpoints stay as before otherwise.
  if (tensor_skipped_ever_) saved.tensor_steps = tensor_steps_;
  return saved;
}

absl::Status Engine::CopyFragmentTo(size_t index, int64_t first, absl::Span<char> out) {
  ZS_RETURN_IF_ERROR(failure_.status());
  if (StepInProgress()) return absl::FailedPreconditionError("CopyFragmentTo during a step");
  if (index >= saved_fragments_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("index: ", index, " of ", saved_fragments_.size(), " fragments"));
  }
  const SavedFragment& saved = saved_fragments_[index];
  const int64_t element_size = numerics::DTypeSize(saved.dtype);
  const int64_t count = static_cast<int64_t>(out.size()) / element_size;
  if (static_cast<int64_t>(out.size()) % element_size != 0 || first < 0 ||
      first + count > saved.end - saved.begin) {
    return absl::InvalidArgumentError(absl::StrCat("elements [", first, ", ", first, " + ",
                                                   out.size(), " bytes): outside the fragment's ",
                                                   saved.end - saved.begin, " elements"));
  }
  return RecordFailure(
      device_->CopyToHost(out.data(), SavedAt(index, saved.begin + first), out.size()));
}

std::vector<Engine::SavedFragment> Engine::RestoredRanges() const {
  if (config_.mode != EngineMode::kDdp) return saved_fragments_;
  std::vector<SavedFragment> ranges;
  for (const SavedFragment& saved : saved_fragments_) {
    if (!ranges.empty() && ranges.back().state == saved.state) continue;
    for (int64_t t = 0; t < plan_.num_tensors(); ++t) {
      ranges.push_back({saved.state, t, 0, plan_.placement(t).num_elements, saved.dtype, 0});
    }
  }
  return ranges;
}

absl::Status Engine::RestoreState(const SavedScalars& scalars, StateReader read) {
  ZS_RETURN_IF_ERROR(failure_.status());
  if (StepInProgress()) return absl::FailedPreconditionError("RestoreState during a step");
  if (scalars.optimizer_step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer_step: must be >= 0, got ", scalars.optimizer_step));
  }
  if (!(scalars.loss_scale > 0.0) || !std::isfinite(scalars.loss_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss_scale: must be finite and > 0, got ", scalars.loss_scale));
  }
  if (scalars.good_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("good_steps: must be >= 0, got ", scalars.good_steps));
  }
  if (!scalars.tensor_steps.empty()) {
    if (static_cast<int64_t>(scalars.tensor_steps.size()) != plan_.num_tensors()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor_steps: ", scalars.tensor_steps.size(),
                                                     " entries, the plan has ", plan_.num_tensors(),
                                                     " tensors"));
    }
    for (size_t t = 0; t < scalars.tensor_steps.size(); ++t) {
      if (scalars.tensor_steps[t] < 0 || scalars.tensor_steps[t] > scalars.optimizer_step) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor_steps[", t, "]: ", scalars.tensor_steps[t], ", must be in [0, ",
                         scalars.optimizer_step, "] (the optimizer's step)"));
      }
    }
  }
  // The arrays are about to be overwritten: no all-gather may still write into them (zero3: nor
  // may a window keep values gathered from the old ones).
  ZS_RETURN_IF_ERROR(AwaitGathers(0, plan_.num_buckets(), /*on_host=*/true));
  if (ShardsParameters()) ZS_RETURN_IF_ERROR(gather_pool_->EndStep());
  const bool ddp = config_.mode == EngineMode::kDdp;
  std::vector<char> host;  // a device's staging, one range at a time
  auto load = [&](const SavedFragment& range, char* destination) -> absl::Status {
    if (device_->host_memory()) {
      return read(range, absl::MakeSpan(destination, range.bytes()));
    }
    host.resize(range.bytes());
    ZS_RETURN_IF_ERROR(read(range, absl::MakeSpan(host)));
    return RecordFailure(device_->CopyFromHost(destination, host.data(), range.bytes()));
  };
  if (ddp) {
    // Every rank holds every array whole: read whole tensors, in plan layout.
    for (const SavedFragment& range : RestoredRanges()) {
      const sharding::TensorPlacement& placement = plan_.placement(range.tensor);
      const sharding::TensorFragment whole{range.tensor, 0, placement.num_elements,
                                           placement.flat_offset};
      ZS_RETURN_IF_ERROR(load(range, StateAt(range.state, whole, nullptr, 0)));
    }
  } else {
    for (size_t i = 0; i < saved_fragments_.size(); ++i) {
      ZS_RETURN_IF_ERROR(load(saved_fragments_[i], SavedAt(i, saved_fragments_[i].begin)));
    }
  }
  optimizer_step_ = scalars.optimizer_step;
  loss_scaler_.Restore(scalars.loss_scale, scalars.good_steps);
  // Without a list (older checkpoints, or none ever skipped) every tensor is at the job's step.
  if (scalars.tensor_steps.empty()) {
    std::fill(tensor_steps_.begin(), tensor_steps_.end(), optimizer_step_);
    tensor_skipped_ever_ = false;
  } else {
    std::copy(scalars.tensor_steps.begin(), scalars.tensor_steps.end(), tensor_steps_.begin());
    tensor_skipped_ever_ =
        absl::c_any_of(tensor_steps_, [this](int64_t step) { return step != optimizer_step_; });
  }
  // Each rank loaded its own pieces of the parameters; the all-gathers give everyone the rest
  // (zero3: as forward asks for them, the first modules prefetched now).
  if (ShardsParameters()) {
    gather_pool_->StartStep();
  } else if (!ddp) {
    IssueGathers();
  }
  return absl::OkStatus();
}

}  // namespace zeroshard::engine

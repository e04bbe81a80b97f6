// The engine's step: gradient buckets, reductions, statistics, the fused update, the all-gather.
#include "worker/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/dcheck.h"
#include "common/status_macros.h"
#include "sharding/gather_windows.h"
#include "sharding/rank_memory.h"
#include "sharding/zero_formula.h"
#include "worker/engine/element_convert.h"

namespace zeroshard::engine {
namespace {

// The values of the statistics all-reduce: sum of squares, non-finite flag, loss, group digest,
// its square, and the count of tensors without a gradient (SetTensorsWithoutGradient).
constexpr int kStatsValues = 6;

// 20 bits of an FNV-1a hash of the groups' values (their bytes): small enough that the sums of
// digests and of their squares over 4,096 ranks stay exact in a double.
uint32_t GroupDigest(const std::vector<kernels::GroupHyperparameters>& groups) {
  uint64_t hash = 1469598103934665603ull;
  for (const kernels::GroupHyperparameters& group : groups) {
    for (const double value : {group.lr, group.weight_decay, group.beta1, group.beta2, group.eps,
                               group.momentum, group.dampening}) {
      unsigned char bytes[sizeof(double)];
      std::memcpy(bytes, &value, sizeof(double));
      for (const unsigned char byte : bytes) hash = (hash ^ byte) * 1099511628211ull;
    }
  }
  return static_cast<uint32_t>((hash ^ (hash >> 20) ^ (hash >> 40)) & 0xFFFFF);
}

using numerics::DType;

double Milliseconds(absl::Duration duration) { return absl::ToDoubleMilliseconds(duration); }

// The epsilon torch.nn.utils.clip_grad_norm_ adds to the norm.
constexpr double kClipEpsilon = 1e-6;

absl::Status ValidateConfig(const EngineConfig& config) {
  if (config.mode != EngineMode::kDdp && config.mode != EngineMode::kZero1 &&
      config.mode != EngineMode::kZero2 && config.mode != EngineMode::kZero3) {
    return absl::InvalidArgumentError("mode: not ddp, zero1, zero2 or zero3");
  }
  if (config.gather_pool_buckets < 0) {
    return absl::InvalidArgumentError("gather_pool_buckets: must be >= 0 (0: the default)");
  }
  if (config.memory_limit_bytes < 0) {
    return absl::InvalidArgumentError("memory_limit_bytes: must be >= 0 (0: no limit)");
  }
  if (!numerics::IsValidDType(config.param_dtype)) {
    return absl::InvalidArgumentError("param_dtype: invalid");
  }
  if (!numerics::IsValidDType(config.grad_dtype)) {
    return absl::InvalidArgumentError("grad_dtype: invalid");
  }
  if (!numerics::IsValidDType(config.reduce_dtype)) {
    return absl::InvalidArgumentError("reduce_dtype: invalid");
  }
  ZS_RETURN_IF_ERROR(ValidateLossScaleConfig(config.loss_scale));
  if (!(config.clip_grad_norm >= 0.0) || !std::isfinite(config.clip_grad_norm)) {
    return absl::InvalidArgumentError("clip_grad_norm: must be finite and >= 0");
  }
  if (config.threads < 1) return absl::InvalidArgumentError("threads: must be >= 1");
  if (config.bucket_pool_size < 1) {
    return absl::InvalidArgumentError("bucket_pool_size: must be >= 1");
  }
  if (config.collective_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("collective_timeout: must be > 0");
  }
  return kernels::ValidateUpdate(config.optimizer, /*step=*/1, /*grad_scale=*/1.0f, {});
}

BucketPipeline::Options PipelineOptions(const EngineConfig& config) {
  BucketPipeline::Options options;
  options.ddp = config.mode == EngineMode::kDdp;
  // zero3 reduces gradients as zero2 does (the same buckets, the same owned pieces).
  options.zero2 = config.mode == EngineMode::kZero2 || config.mode == EngineMode::kZero3;
  options.grad_dtype = config.grad_dtype;
  options.reduce_dtype = config.reduce_dtype;
  options.bucket_pool_size = config.bucket_pool_size;
  options.collective_timeout = config.collective_timeout;
  return options;
}

}  // namespace

const char* EngineModeName(EngineMode mode) {
  switch (mode) {
    case EngineMode::kDdp:
      return "ddp";
    case EngineMode::kZero1:
      return "zero1";
    case EngineMode::kZero2:
      return "zero2";
    case EngineMode::kZero3:
      return "zero3";
  }
  return "invalid";
}

absl::StatusOr<EngineMode> ParseEngineMode(absl::string_view name) {
  for (EngineMode mode :
       {EngineMode::kDdp, EngineMode::kZero1, EngineMode::kZero2, EngineMode::kZero3}) {
    if (name == EngineModeName(mode)) return mode;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("mode: \"", name, "\" is not ddp, zero1, zero2 or zero3"));
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const sharding::ShardPlan& plan,
                                                       int64_t rank, const EngineConfig& config,
                                                       comm::Communicator* communicator) {
  ZS_RETURN_IF_ERROR(ValidateConfig(config));
  if (communicator == nullptr) return absl::InvalidArgumentError("communicator: null");
  if (communicator->world_size() != plan.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("plan.world_size: ", plan.world_size(),
                                                   " but the communicator has ",
                                                   communicator->world_size(), " ranks"));
  }
  if (communicator->rank() != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", rank, " but the communicator is rank ", communicator->rank()));
  }
  if (!config.tensor_groups.empty() &&
      static_cast<int64_t>(config.tensor_groups.size()) != plan.num_tensors()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_groups: ", config.tensor_groups.size(),
                                                   " entries, the plan has ", plan.num_tensors(),
                                                   " tensors"));
  }
  if (absl::c_any_of(config.tensor_groups, [](int32_t group) { return group < 0; })) {
    return absl::InvalidArgumentError("tensor_groups: a group index is negative");
  }
  ZS_ASSIGN_OR_RETURN(sharding::RankView view, plan.ViewForRank(rank));
  std::unique_ptr<Engine> engine(new Engine(plan, std::move(view), config, communicator));
  if (config.memory_limit_bytes > 0) {
    ZS_RETURN_IF_ERROR(engine->allocator_.SetLimit(config.memory_limit_bytes));
  }
  for (const int32_t group : config.tensor_groups) {
    engine->groups_named_ = std::max(engine->groups_named_, static_cast<size_t>(group) + 1);
  }
  if (absl::Status allocated = engine->AllocateBuffers(); !allocated.ok()) {
    return engine->ExplainAllocationFailure(std::move(allocated));
  }
  engine->BuildPieces();
  const size_t tensors = static_cast<size_t>(plan.num_tensors());
  engine->tensor_steps_.assign(tensors, 0);
  engine->without_gradient_.assign(tensors, 0);
  engine->skipped_tensors_.assign(tensors, 0);
  engine->host_gradient_mask_.assign(tensors, 0.0f);
  engine->step_pieces_.reserve(engine->update_pieces_.size());
  engine->BuildSavedFragments();
  ZS_RETURN_IF_ERROR(engine->BuildGradStatsChunks());
  return engine;
}

Engine::Engine(const sharding::ShardPlan& plan, sharding::RankView view, const EngineConfig& config,
               comm::Communicator* communicator)
    : plan_(plan),
      view_(std::move(view)),
      config_(config),
      optimizer_(config.optimizer),
      communicator_(communicator),
      world_size_(plan.world_size()),
      rank_(view_.rank()),
      param_size_(numerics::DTypeSize(config.param_dtype)),
      grad_size_(numerics::DTypeSize(config.grad_dtype)),
      reduce_size_(numerics::DTypeSize(config.reduce_dtype)),
      state_arrays_(kernels::StateArraysPerParam(config.optimizer)),
      owned_device_(config.device == nullptr ? std::make_unique<HostDeviceOps>(config.threads)
                                             : nullptr),
      device_(config.device == nullptr ? owned_device_.get() : config.device),
      allocator_(device_),
      timer_(plan.num_buckets()),
      pipeline_(plan_, view_.rank(), PipelineOptions(config),
                {grads_, owned_offsets_, stats_chunks_, stats_partials_, stats_chunk_begin_},
                device_, communicator, &timer_, &failure_),
      gathers_(plan.num_buckets()),
      loss_scaler_(config.loss_scale) {
  owned_offsets_.reserve(plan_.num_buckets());
  int64_t offset = 0;
  for (const sharding::BucketLayout& bucket : plan_.buckets()) {
    owned_offsets_.push_back(offset);
    offset += bucket.piece_elems;
  }
  // The owned layout holds exactly the view's pieces, one per bucket.
  ZS_DCHECK_EQ(offset, view_.owned_elems());
}

Engine::~Engine() {
  // The communicator may still write into the parameters until each all-gather is done (the
  // pipeline, destroyed next, waits for the reductions).
  for (BucketGather& gather : gathers_) {
    if (gather.work != nullptr) gather.work->Wait().IgnoreError();
  }
}

bool Engine::HasMaster() const { return config_.param_dtype != DType::kFloat32; }

bool Engine::StagesGradients() const {
  // Backward writes fp32; a segment goes straight into its destination only when that holds
  // fp32 gradients. Otherwise it is rounded to grad_dtype on the way (as every mode must, so
  // that they stay bitwise equal).
  const DType destination = ShardsGradients() ? config_.reduce_dtype : config_.grad_dtype;
  return config_.grad_dtype != DType::kFloat32 || destination != DType::kFloat32;
}

absl::Status Engine::AllocateBuffers() {
  const int64_t padded = plan_.padded_elems();
  const int64_t owned = view_.owned_elems();
  const bool ddp = config_.mode == EngineMode::kDdp;
  ZS_ASSIGN_OR_RETURN(params_,
                      allocator_.TryAllocate(MemoryCategory::kParams,
                                             (ShardsParameters() ? owned : padded) * param_size_));
  const int64_t grad_elems = ShardsGradients() ? owned : padded;
  ZS_ASSIGN_OR_RETURN(grads_,
                      allocator_.TryAllocate(MemoryCategory::kGrads, grad_elems * grad_size_));
  // fp32 parameters are their own master (updated in place); bf16/fp16 ones need an fp32 one.
  const int64_t state_elems = ddp ? padded : owned;
  if (HasMaster()) {
    ZS_ASSIGN_OR_RETURN(master_,
                        allocator_.TryAllocate(MemoryCategory::kMaster, state_elems * int64_t{4}));
  }
  for (int k = 0; k < state_arrays_; ++k) {
    ZS_ASSIGN_OR_RETURN(CountedBuffer state, allocator_.TryAllocate(MemoryCategory::kOptimizerState,
                                                                    state_elems * int64_t{4}));
    state_.push_back(std::move(state));
  }
  if (pipeline_.uses_pool()) {
    ZS_RETURN_IF_ERROR(pipeline_.AllocatePool(allocator_, LargestBucket() * reduce_size_));
  }
  if (StagesGradients()) {
    // One segment at a time: a segment never passes its bucket.
    ZS_ASSIGN_OR_RETURN(grad_staging_, allocator_.TryAllocate(MemoryCategory::kBuckets,
                                                              LargestBucket() * int64_t{4}));
  }
  ZS_ASSIGN_OR_RETURN(stats_buffer_, allocator_.TryAllocate(MemoryCategory::kCommScratch,
                                                            kStatsValues * sizeof(double)));
  // One float per tensor: which ranks have a gradient for it, in steps where some rank lacks one.
  ZS_ASSIGN_OR_RETURN(gradient_mask_,
                      allocator_.TryAllocate(MemoryCategory::kCommScratch,
                                             plan_.num_tensors() * int64_t{sizeof(float)}));
  if (ShardsParameters()) {
    sharding::GatherWindows geometry = sharding::GatherWindowsFor(plan_);
    GatherPool::Options options;
    options.param_dtype = config_.param_dtype;
    options.windows = sharding::GatherPoolWindows(
        geometry, config_.gather_pool_buckets > 0 ? config_.gather_pool_buckets
                                                  : sharding::DefaultGatherPoolBuckets(plan_));
    options.collective_timeout = config_.collective_timeout;
    gather_pool_ = std::make_unique<GatherPool>(
        plan_, rank_, std::move(geometry), options,
        [this](int64_t bucket) -> const char* { return OwnedParamsAt(OwnedOffset(bucket)); },
        device_, communicator_, &timer_, &failure_);
    ZS_RETURN_IF_ERROR(gather_pool_->Allocate(allocator_));
  }
  return absl::OkStatus();
}

absl::Status Engine::ExplainAllocationFailure(absl::Status status) const {
  if (status.code() != absl::StatusCode::kResourceExhausted) return status;
  // What the mode needs in all, from the arithmetic the coordinator checks submissions with.
  static constexpr sharding::ZeroStage kStages[] = {
      sharding::ZeroStage::kDdp, sharding::ZeroStage::kZero1, sharding::ZeroStage::kZero2,
      sharding::ZeroStage::kZero3};
  sharding::RankMemoryOptions options;
  options.mode = kStages[static_cast<int>(config_.mode)];
  options.param_dtype = config_.param_dtype;
  options.grad_dtype = config_.grad_dtype;
  options.reduce_dtype = config_.reduce_dtype;
  options.state_arrays_per_param = state_arrays_;
  options.bucket_pool_size = config_.bucket_pool_size;
  options.gather_pool_buckets = config_.gather_pool_buckets;
  options.grad_stats_chunk_elements = device_->GradStatsChunkElements();
  const absl::StatusOr<sharding::RankMemoryBytes> need =
      sharding::RankMemoryNeed(plan_, rank_, options);
  if (!need.ok()) return status;
  return absl::ResourceExhaustedError(
      absl::StrCat(status.message(), "; ", EngineModeName(config_.mode), " at W=", world_size_,
                   " needs ", sharding::FormatMiB(need->total), " (", need->total,
                   " bytes) per rank in all: ", need->Breakdown()));
}

int64_t Engine::LargestBucket() const {
  int64_t largest = 0;
  for (const sharding::BucketLayout& bucket : plan_.buckets()) {
    largest = std::max(largest, bucket.padded_elems);
  }
  return largest;
}

void Engine::BuildPieces() {
  const bool zero2 = ShardsGradients();
  const bool ddp = config_.mode == EngineMode::kDdp;
  auto state_pointers = [&](int64_t element, kernels::UpdatePiece& piece) {
    for (int k = 0; k < state_arrays_; ++k) piece.state[k] = state_[k].as<float>() + element;
  };
  // fp32 parameters are updated in place (they are the master); otherwise the fp32 master at
  // `element` of the state layout is updated and rounded into the parameter copy at `flat` (in
  // zero3, at `element` of the owned parameters).
  auto master_and_copy = [&](int64_t element, int64_t flat, kernels::UpdatePiece& piece) {
    char* const param = ShardsParameters() ? OwnedParamsAt(element) : ParamsAt(flat);
    if (!HasMaster()) {
      piece.master = reinterpret_cast<float*>(param);
      return;
    }
    piece.master = master_.as<float>() + element;
    piece.param_copy = param;
    piece.param_dtype = config_.param_dtype;
  };
  if (ddp) {
    for (int64_t t = 0; t < plan_.num_tensors(); ++t) {
      const sharding::TensorPlacement& placement = plan_.placement(t);
      const sharding::TensorSpec& spec = plan_.tensors()[t];
      kernels::UpdatePiece piece;
      piece.grad = GradsAt(placement.flat_offset);
      piece.grad_dtype = config_.grad_dtype;
      master_and_copy(placement.flat_offset, placement.flat_offset, piece);
      state_pointers(placement.flat_offset, piece);
      piece.length = placement.num_elements;
      piece.weight_decay = spec.weight_decay;
      piece.lr_scale = spec.lr_scale;
      update_pieces_.push_back(piece);
      update_piece_tensors_.push_back(t);
    }
    return;
  }
  for (const sharding::OwnedPiece& owned : view_.pieces()) {
    for (const sharding::TensorFragment& fragment : view_.FragmentsOf(owned)) {
      const sharding::TensorSpec& spec = plan_.tensors()[fragment.tensor];
      const int64_t owned_element =
          OwnedOffset(owned.bucket) + fragment.flat_begin - owned.flat_begin;
      kernels::UpdatePiece piece;
      piece.grad =
          zero2 ? grads_.as<char>() + owned_element * grad_size_ : GradsAt(fragment.flat_begin);
      piece.grad_dtype = config_.grad_dtype;
      master_and_copy(owned_element, fragment.flat_begin, piece);
      state_pointers(owned_element, piece);
      piece.length = fragment.size();
      piece.weight_decay = spec.weight_decay;
      piece.lr_scale = spec.lr_scale;
      update_pieces_.push_back(piece);
      update_piece_tensors_.push_back(fragment.tensor);
    }
  }
}

absl::Status Engine::BuildGradStatsChunks() {
  // The owned fragments in every mode, each cut from its start as ComputeGradStats cuts a piece:
  // the same chunks everywhere, so the same bits.
  const int64_t chunk_elems = device_->GradStatsChunkElements();
  std::vector<kernels::GradStatsChunk> chunks;
  stats_chunk_begin_.assign(plan_.num_buckets() + 1, 0);
  for (const sharding::OwnedPiece& piece : view_.pieces()) {
    stats_chunk_begin_[piece.bucket] = static_cast<int64_t>(chunks.size());
    for (const sharding::TensorFragment& fragment : view_.FragmentsOf(piece)) {
      for (int64_t begin = 0; begin < fragment.size(); begin += chunk_elems) {
        kernels::GradStatsChunk chunk;
        chunk.begin = fragment.flat_begin - piece.flat_begin + begin;
        chunk.length = std::min(chunk_elems, fragment.size() - begin);
        chunks.push_back(chunk);
      }
    }
  }
  stats_chunk_begin_[plan_.num_buckets()] = static_cast<int64_t>(chunks.size());
  const int64_t table_bytes = static_cast<int64_t>(chunks.size() * sizeof(kernels::GradStatsChunk));
  ZS_ASSIGN_OR_RETURN(stats_chunks_,
                      allocator_.TryAllocate(MemoryCategory::kCommScratch, table_bytes));
  ZS_ASSIGN_OR_RETURN(stats_partials_,
                      allocator_.TryAllocate(MemoryCategory::kCommScratch,
                                             static_cast<int64_t>(chunks.size() * sizeof(double))));
  return device_->CopyFromHost(stats_chunks_.data(), chunks.data(), table_bytes);
}

absl::Status Engine::SetLearningRate(double lr) {
  if (!std::isfinite(lr) || lr < 0) {
    return absl::InvalidArgumentError(absl::StrCat("lr: must be finite and >= 0, got ", lr));
  }
  optimizer_.lr = lr;
  return absl::OkStatus();
}

absl::Status Engine::SetGroupHyperparameters(std::vector<kernels::GroupHyperparameters> groups) {
  if (config_.tensor_groups.empty()) {
    return absl::FailedPreconditionError(
        "param_groups: this engine's tensors have no groups (EngineConfig.tensor_groups)");
  }
  if (groups.size() < groups_named_) {
    return absl::InvalidArgumentError(absl::StrCat("param_groups: ", groups.size(),
                                                   " groups given, the tensors name group ",
                                                   groups_named_ - 1));
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    if (absl::Status valid = kernels::ValidateGroup(config_.optimizer, groups[g]); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("param_groups[", g, "]: ", valid.message()));
    }
  }
  groups_digest_ = GroupDigest(groups);
  // Every step sends the groups again: as many as before, the values change in place and the
  // pieces keep pointing at them.
  if (groups.size() == groups_.size()) {
    std::copy(groups.begin(), groups.end(), groups_.begin());
    return absl::OkStatus();
  }
  groups_ = std::move(groups);
  for (size_t i = 0; i < update_pieces_.size(); ++i) {
    update_pieces_[i].group = &groups_[config_.tensor_groups[update_piece_tensors_[i]]];
  }
  return absl::OkStatus();
}

absl::StatusOr<float*> Engine::FullGradient(int64_t tensor) const {
  if (tensor < 0 || tensor >= plan_.num_tensors()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor, " is outside the plan"));
  }
  if (ShardsGradients() || StagesGradients()) {
    return absl::FailedPreconditionError(
        "no full-size fp32 gradient buffer (zero2, zero3, or gradients stored in another dtype)");
  }
  return reinterpret_cast<float*>(GradsAt(plan_.placement(tensor).flat_offset));
}

char* Engine::ParamsAt(int64_t flat) const {
  ZS_DCHECK(!ShardsParameters()) << "zero3 keeps no plan-layout parameters";
  return params_.as<char>() + flat * param_size_;
}

char* Engine::OwnedParamsAt(int64_t element) const {
  ZS_DCHECK(ShardsParameters()) << "only zero3 keeps owned-layout parameters";
  return params_.as<char>() + element * param_size_;
}

char* Engine::GradsAt(int64_t flat) const { return grads_.as<char>() + flat * grad_size_; }

absl::Status Engine::InitializeParameters(
    absl::FunctionRef<absl::Status(int64_t tensor, absl::Span<float> out)> initial) {
  ZS_RETURN_IF_ERROR(failure_.status());
  if (StepInProgress()) {
    return absl::FailedPreconditionError("InitializeParameters during a step");
  }
  // The parameters are about to be overwritten: no all-gather may still write into them (zero3:
  // nor may a window keep values gathered from the old ones).
  ZS_RETURN_IF_ERROR(AwaitGathers(0, plan_.num_buckets(), /*on_host=*/true));
  if (ShardsParameters()) {
    ZS_RETURN_IF_ERROR(gather_pool_->EndStep());
    return InitializeOwnedParameters(initial);
  }
  const bool ddp = config_.mode == EngineMode::kDdp;
  absl::Span<const sharding::OwnedPiece> pieces = view_.pieces();
  size_t piece_index = 0;
  const sharding::TensorFragment* fragment = view_.fragments().data();
  const sharding::TensorFragment* fragments_end = fragment + view_.fragments().size();
  // Host staging only where it is needed, one tensor at a time: the largest tensor's size must
  // not stay behind as a process's peak memory that no category explains.
  const bool fp32_params = config_.param_dtype == DType::kFloat32;
  std::vector<float> values;
  std::vector<char> converted;  // values in param_dtype, for a device's copy
  for (int64_t t = 0; t < plan_.num_tensors(); ++t) {
    const sharding::TensorPlacement& placement = plan_.placement(t);
    if (fp32_params && device_->host_memory()) {
      // Straight into the parameters, which are their own master.
      float* params = reinterpret_cast<float*>(ParamsAt(placement.flat_offset));
      ZS_RETURN_IF_ERROR(initial(t, absl::MakeSpan(params, placement.num_elements)));
      continue;
    }
    values.assign(placement.num_elements, 0.0f);
    ZS_RETURN_IF_ERROR(initial(t, absl::MakeSpan(values)));
    if (fp32_params) {
      ZS_RETURN_IF_ERROR(RecordFailure(device_->CopyFromHost(
          ParamsAt(placement.flat_offset), values.data(), placement.num_elements * sizeof(float))));
    } else if (device_->host_memory()) {
      ConvertElements(values.data(), DType::kFloat32, ParamsAt(placement.flat_offset),
                      config_.param_dtype, placement.num_elements);
    } else {
      converted.resize(placement.num_elements * param_size_);
      ConvertElements(values.data(), DType::kFloat32, converted.data(), config_.param_dtype,
                      placement.num_elements);
      ZS_RETURN_IF_ERROR(
          RecordFailure(device_->CopyFromHost(ParamsAt(placement.flat_offset), converted.data(),
                                              placement.num_elements * param_size_)));
    }
    if (!HasMaster()) continue;  // fp32 parameters are their own master
    if (ddp) {
      ZS_RETURN_IF_ERROR(RecordFailure(
          device_->CopyFromHost(master_.as<float>() + placement.flat_offset, values.data(),
                                placement.num_elements * sizeof(float))));
      continue;
    }
    // Owned fragments are in flat order, as tensors are: those of tensor t come next.
    for (; fragment != fragments_end && fragment->tensor == t; ++fragment) {
      while (fragment->flat_begin >= pieces[piece_index].flat_end) ++piece_index;
      const sharding::OwnedPiece& piece = pieces[piece_index];
      ZS_DCHECK(fragment->flat_begin >= piece.flat_begin && fragment->flat_end() <= piece.flat_end)
          << "fragment of tensor " << t << " is not inside the piece of bucket " << piece.bucket;
      ZS_RETURN_IF_ERROR(RecordFailure(device_->CopyFromHost(
          master_.as<float>() + OwnedOffset(piece.bucket) + fragment->flat_begin - piece.flat_begin,
          values.data() + fragment->tensor_begin, fragment->size() * sizeof(float))));
    }
  }
  ZS_DCHECK(ddp || !HasMaster() || fragment == fragments_end)
      << "owned fragments of no tensor were left unset";
  return absl::OkStatus();
}

absl::Status Engine::InitializeOwnedParameters(
    absl::FunctionRef<absl::Status(int64_t tensor, absl::Span<float> out)> initial) {
  // Each rank keeps only its owned fragments (and their fp32 masters for bf16/fp16), one tensor's
  // values on the host at a time. On the host they are staged in a gather window when one is
  // large enough (fp32: a window holds any module), so that the staging is counted memory and no
  // tensor-sized peak appears beside the counted total.
  absl::Span<const sharding::OwnedPiece> pieces = view_.pieces();
  size_t piece_index = 0;
  const sharding::TensorFragment* fragment = view_.fragments().data();
  const sharding::TensorFragment* fragments_end = fragment + view_.fragments().size();
  const absl::Span<char> window = gather_pool_->IdleWindow();
  std::vector<float> values;
  std::vector<char> converted;  // a device's fragment in param_dtype
  for (int64_t t = 0; t < plan_.num_tensors(); ++t) {
    // A tensor this rank owns no part of is still generated: `initial` may count on every
    // tensor being asked for, in order.
    const int64_t elements = plan_.placement(t).num_elements;
    absl::Span<float> staged;
    if (device_->host_memory() &&
        elements * int64_t{sizeof(float)} <= static_cast<int64_t>(window.size())) {
      staged = absl::MakeSpan(reinterpret_cast<float*>(window.data()), elements);
      std::fill(staged.begin(), staged.end(), 0.0f);
    } else {
      values.assign(elements, 0.0f);
      staged = absl::MakeSpan(values);
    }
    ZS_RETURN_IF_ERROR(initial(t, staged));
    for (; fragment != fragments_end && fragment->tensor == t; ++fragment) {
      while (fragment->flat_begin >= pieces[piece_index].flat_end) ++piece_index;
      const sharding::OwnedPiece& piece = pieces[piece_index];
      const int64_t element = OwnedOffset(piece.bucket) + fragment->flat_begin - piece.flat_begin;
      const float* source = staged.data() + fragment->tensor_begin;
      const int64_t count = fragment->size();
      if (HasMaster()) {
        ZS_RETURN_IF_ERROR(RecordFailure(device_->CopyFromHost(
            master_.as<float>() + element, source, count * int64_t{sizeof(float)})));
      }
      if (device_->host_memory()) {
        ConvertElements(source, DType::kFloat32, OwnedParamsAt(element), config_.param_dtype,
                        count);
        continue;
      }
      converted.resize(count * param_size_);
      ConvertElements(source, DType::kFloat32, converted.data(), config_.param_dtype, count);
      ZS_RETURN_IF_ERROR(RecordFailure(
          device_->CopyFromHost(OwnedParamsAt(element), converted.data(), count * param_size_)));
    }
  }
  ZS_DCHECK(fragment == fragments_end) << "owned fragments of no tensor were left unset";
  return absl::OkStatus();
}

absl::StatusOr<workloads::StoredParameters> Engine::Parameters(int64_t tensor) {
  ZS_RETURN_IF_ERROR(failure_.status());
  if (tensor < 0 || tensor >= plan_.num_tensors()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor: ", tensor, " is not in [0, ", plan_.num_tensors(), ")"));
  }
  const sharding::TensorPlacement& placement = plan_.placement(tensor);
  if (ShardsParameters()) {
    ZS_ASSIGN_OR_RETURN(const char* const values, gather_pool_->Acquire(tensor));
    return workloads::StoredParameters{values, config_.param_dtype, placement.num_elements};
  }
  ZS_RETURN_IF_ERROR(
      AwaitGathers(placement.first_bucket, placement.num_buckets, /*on_host=*/false));
  return workloads::StoredParameters{ParamsAt(placement.flat_offset), config_.param_dtype,
                                     placement.num_elements};
}

absl::Status Engine::ReleaseParameters(int64_t tensor) {
  if (tensor < 0 || tensor >= plan_.num_tensors()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor: ", tensor, " is not in [0, ", plan_.num_tensors(), ")"));
  }
  if (!ShardsParameters()) return absl::OkStatus();
  return gather_pool_->Release(tensor);
}

absl::Status Engine::WriteHeldParameters(int64_t tensor) {
  ZS_RETURN_IF_ERROR(failure_.status());
  if (tensor < 0 || tensor >= plan_.num_tensors()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor: ", tensor, " is not in [0, ", plan_.num_tensors(), ")"));
  }
  const std::string& name = plan_.tensors()[tensor].name;
  if (!ShardsParameters()) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor ", name, ": only zero3 writes gathered parameters back"));
  }
  if (StepInProgress()) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor ", name, ": parameters are written back between steps only"));
  }
  ZS_ASSIGN_OR_RETURN(const char* const values, gather_pool_->HeldValues(tensor));
  absl::Span<const sharding::OwnedPiece> pieces = view_.pieces();
  size_t piece_index = 0;
  std::vector<char> staged;  // a device's fragment on the host
  for (const sharding::TensorFragment& fragment : view_.fragments()) {
    if (fragment.tensor != tensor) continue;
    while (fragment.flat_begin >= pieces[piece_index].flat_end) ++piece_index;
    const sharding::OwnedPiece& piece = pieces[piece_index];
    const int64_t element = OwnedOffset(piece.bucket) + fragment.flat_begin - piece.flat_begin;
    const int64_t count = fragment.size();
    const char* source = values + fragment.tensor_begin * param_size_;
    if (!device_->host_memory()) {
      staged.resize(count * param_size_);
      ZS_RETURN_IF_ERROR(
          RecordFailure(device_->CopyToHost(staged.data(), source, count * param_size_)));
      ZS_RETURN_IF_ERROR(RecordFailure(
          device_->CopyFromHost(OwnedParamsAt(element), staged.data(), count * param_size_)));
      source = staged.data();
    } else {
      std::memcpy(OwnedParamsAt(element), source, count * param_size_);
    }
    if (HasMaster()) {
      std::vector<float> master(count);
      ConvertElements(source, config_.param_dtype, master.data(), DType::kFloat32, count);
      ZS_RETURN_IF_ERROR(RecordFailure(device_->CopyFromHost(
          master_.as<float>() + element, master.data(), count * int64_t{sizeof(float)})));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Engine::ParametersOnHost(int64_t tensor) {
  const bool held_before = ShardsParameters() && tensor >= 0 && tensor < plan_.num_tensors() &&
                           gather_pool_->held(tensor);
  ZS_ASSIGN_OR_RETURN(const workloads::StoredParameters stored, Parameters(tensor));
  // The values go to the host: the all-gathers must have succeeded, not only be ordered.
  const sharding::TensorPlacement& placement = plan_.placement(tensor);
  if (ShardsParameters()) {
    ZS_RETURN_IF_ERROR(gather_pool_->AwaitAll(/*on_host=*/true));
  } else {
    ZS_RETURN_IF_ERROR(
        AwaitGathers(placement.first_bucket, placement.num_buckets, /*on_host=*/true));
  }
  // zero3: a tensor the caller did not hold is released again once copied.
  absl::Cleanup release = [&] {
    if (ShardsParameters() && !held_before) gather_pool_->Release(tensor).IgnoreError();
  };
  std::vector<float> host(stored.size);
  if (stored.dtype == DType::kFloat32) {
    ZS_RETURN_IF_ERROR(RecordFailure(
        device_->CopyToHost(host.data(), stored.data, stored.size * int64_t{sizeof(float)})));
    return host;
  }
  // Widened on the host, so the only extra memory is this one tensor's stored bits.
  std::vector<char> bits(stored.size * param_size_);
  ZS_RETURN_IF_ERROR(
      RecordFailure(device_->CopyToHost(bits.data(), stored.data, stored.size * param_size_)));
  ConvertElements(bits.data(), stored.dtype, host.data(), DType::kFloat32, stored.size);
  return host;
}

int64_t Engine::BucketOf(int64_t flat) const {
  // Every bucket but the last has bucket_elems() elements.
  return std::min(flat / plan_.bucket_elems(), plan_.num_buckets() - 1);
}

int64_t Engine::GradSegmentEnd(int64_t tensor, int64_t begin) const {
  const sharding::TensorPlacement& placement = plan_.placement(tensor);
  const int64_t bucket_end = plan_.buckets()[BucketOf(placement.flat_offset + begin)].flat_end();
  return std::min(placement.flat_end(), bucket_end) - placement.flat_offset;
}

absl::StatusOr<absl::Span<float>> Engine::GradBuffer(int64_t tensor, int64_t begin, int64_t end) {
  ZS_ASSIGN_OR_RETURN(std::optional<absl::Span<float>> buffer,
                      OpenGradSegment(tensor, begin, end, /*wait=*/true));
  ZS_DCHECK(buffer.has_value()) << "tensor " << tensor << " segment at " << begin;
  return *buffer;
}

absl::StatusOr<std::optional<absl::Span<float>>> Engine::TryGradBuffer(int64_t tensor,
                                                                       int64_t begin, int64_t end) {
  return OpenGradSegment(tensor, begin, end, /*wait=*/false);
}

absl::StatusOr<std::optional<absl::Span<float>>> Engine::OpenGradSegment(int64_t tensor,
                                                                         int64_t begin, int64_t end,
                                                                         bool wait) {
  ZS_RETURN_IF_ERROR(failure_.status());
  if (tensor < 0 || tensor >= plan_.num_tensors()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor: ", tensor, " is not in [0, ", plan_.num_tensors(), ")"));
  }
  const sharding::TensorPlacement& placement = plan_.placement(tensor);
  if (begin < 0 || begin >= placement.num_elements || end != GradSegmentEnd(tensor, begin)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "segment: [", begin, ", ", end, ") of tensor ", tensor, " (", placement.num_elements,
        " elements) is not a gradient segment (see GradSegmentEnd)"));
  }
  if (open_segment_.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor ", tensor, ": segment [", begin, ", ", end, ") asked for while the segment at ",
        open_segment_->begin, " of tensor ", open_segment_->tensor, " is still open"));
  }
  if (tensor != next_tensor_ || begin != next_element_) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor ", tensor, ": segment at ", begin,
                     " out of order; expected the segment at ", next_element_, " of tensor ",
                     next_tensor_, " (tensors in tensor-list order, each once per step)"));
  }
  const int64_t flat = placement.flat_offset + begin;
  const int64_t bucket_index = BucketOf(flat);
  char* destination;
  if (ShardsGradients()) {
    // zero2/zero3 keep no full gradient buffer: backward writes into the bucket's pool buffer.
    ZS_ASSIGN_OR_RETURN(char* const buffer, pipeline_.BucketBuffer(bucket_index, wait));
    if (buffer == nullptr) return std::nullopt;  // every buffer in flight, and no wait
    destination = buffer + (flat - plan_.buckets()[bucket_index].flat_begin) * reduce_size_;
  } else {
    destination = GradsAt(flat);
  }
  open_segment_ = OpenSegment{tensor, begin, end, bucket_index, destination};
  float* out =
      StagesGradients() ? grad_staging_.as<float>() : reinterpret_cast<float*>(destination);
  return std::optional<absl::Span<float>>(absl::MakeSpan(out, end - begin));
}

absl::Status Engine::GradWritten(int64_t tensor, int64_t begin, int64_t end) {
  ZS_RETURN_IF_ERROR(failure_.status());
  if (!open_segment_.has_value() || open_segment_->tensor != tensor ||
      open_segment_->begin != begin || open_segment_->end != end) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor ", tensor, ": segment [", begin, ", ", end, ") was not the open one"));
  }
  const OpenSegment segment = *open_segment_;
  open_segment_.reset();
  const int64_t count = end - begin;
  if (StagesGradients()) {
    const DType destination_dtype = ShardsGradients() ? config_.reduce_dtype : config_.grad_dtype;
    ZS_RETURN_IF_ERROR(RecordFailure(
        device_->StoreScaledGradient(grad_staging_.as<float>(), 1.0f, count, config_.grad_dtype,
                                     segment.destination, destination_dtype)));
  }
  next_element_ = end;
  if (end == plan_.placement(tensor).num_elements) {
    ++next_tensor_;
    next_element_ = 0;
  }
  ZS_RETURN_IF_ERROR(pipeline_.ElementsWritten(segment.bucket, count));
  return pipeline_.RetireFinished();
}

absl::Status Engine::EndMicroBatch() {
  ZS_RETURN_IF_ERROR(failure_.status());
  if (!ShardsGradients()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "EndMicroBatch: ", EngineModeName(config_.mode),
        " accumulates micro-batches in the full gradient buffer and hands the sum over once"));
  }
  if (next_tensor_ != plan_.num_tensors()) {
    return absl::FailedPreconditionError(
        absl::StrCat("EndMicroBatch: only ", next_tensor_, " of ", plan_.num_tensors(),
                     " tensors' gradients of the micro-batch were handed over"));
  }
  // Every bucket's reduced piece must be in grads_ before the next micro-batch's can be added.
  ZS_RETURN_IF_ERROR(pipeline_.RetireAll());
  pipeline_.ResetArrivals();
  next_tensor_ = 0;
  next_element_ = 0;
  pipeline_.StartAccumulating();
  return absl::OkStatus();
}

absl::Status Engine::AwaitGathers(int64_t first_bucket, int64_t num_buckets, bool on_host) {
  absl::Status first_failure;
  // Issue order: the last bucket first.
  for (int64_t b = first_bucket + num_buckets - 1; b >= first_bucket; --b) {
    BucketGather& gather = gathers_[b];
    if (gather.work == nullptr || (!on_host && gather.ordered)) continue;
    const absl::Time wait_start = absl::Now();
    absl::Status status;
    if (on_host) {
      status = RetireGather(b);
    } else {
      status = gather.work->WaitOnComputeStream();
      gather.ordered = true;
      // A host backend has waited for it; a device backend's is retired once seen done.
      if (status.ok() && gather.work->Done()) status = RetireGather(b);
    }
    timer_.GatherWaited(absl::Now() - wait_start);
    if (!status.ok() && first_failure.ok()) first_failure = status;
    // After a failure only the host waits go on: the buffers must be left alone by then.
    if (!first_failure.ok() && !on_host) break;
  }
  return RecordFailure(first_failure);
}

absl::Status Engine::RetireGather(int64_t bucket_index) {
  BucketGather& gather = gathers_[bucket_index];
  const absl::Status status = gather.work->Wait();
  timer_.GatherFinished(gather.work->RunTime());
  gather.work.reset();
  gather.ordered = false;
  return status;
}

absl::Status Engine::CheckHandedOver(absl::string_view what) const {
  // After EndMicroBatch() the step may end with no further hand-over.
  const bool micro_batches_ended = pipeline_.accumulating() && next_tensor_ == 0 &&
                                   next_element_ == 0 && !open_segment_.has_value();
  if (next_tensor_ != plan_.num_tensors() && !micro_batches_ended) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": only ", next_tensor_, " of ",
                                                      plan_.num_tensors(),
                                                      " tensors' gradients were handed over"));
  }
  return absl::OkStatus();
}

absl::Status Engine::SetTensorsWithoutGradient(absl::Span<const int64_t> tensors) {
  for (const int64_t t : tensors) {
    if (t < 0 || t >= plan_.num_tensors()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensors_without_gradient: tensor ", t, " is outside the plan's ", plan_.num_tensors()));
    }
  }
  std::fill(without_gradient_.begin(), without_gradient_.end(), 0);
  for (const int64_t t : tensors) without_gradient_[t] = 1;
  without_gradient_count_ = absl::c_count(without_gradient_, 1);
  return absl::OkStatus();
}

absl::Status Engine::CompleteReductions() {
  if (reductions_complete_) return absl::OkStatus();
  timer_.StartReductionWaitsInStep();
  StepTimings& timings = reduction_timings_;
  timings = StepTimings{};

  // 0. The previous step's all-gathers that forward did not wait for: the update writes the
  //    parameters they fill, and the step reports how they went.
  ZS_RETURN_IF_ERROR(AwaitGathers(0, plan_.num_buckets(), /*on_host=*/true));
  if (ShardsParameters()) ZS_RETURN_IF_ERROR(gather_pool_->AwaitAll(/*on_host=*/true));
  timer_.TakeGatherTimings(timings);

  // 1. Order every bucket's move into grads_ (and its statistics) after its reduction, then wait
  //    on the host for the reductions: the statistics hand values to the host, so the reductions
  //    must have succeeded. This rank's pieces of the summed gradients are then in grads_ (and in
  //    ddp, every piece).
  ZS_RETURN_IF_ERROR(pipeline_.RetireAll());
  ZS_DCHECK(pipeline_.Idle())
      << "a bucket still holds a slot or a reduction after the last retired";
  timer_.ReductionTimings(timings);
  reductions_complete_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> Engine::AverageGradients() {
  ZS_RETURN_IF_ERROR(failure_.status());
  if (config_.mode != EngineMode::kDdp || StagesGradients()) {
    return absl::FailedPreconditionError(
        "AverageGradients: only ddp with fp32 gradients keeps the whole reduced gradient");
  }
  if (averaged_) {
    return absl::FailedPreconditionError("AverageGradients: the gradients are averaged already");
  }
  ZS_RETURN_IF_ERROR(CheckHandedOver("AverageGradients"));
  ZS_RETURN_IF_ERROR(CompleteReductions());
  if (world_size_ > 1) {
    // torch's DDP divides the sum by W, as a float: so does the update otherwise (grad_scale).
    const float inverse = static_cast<float>(1.0 / static_cast<double>(world_size_));
    ZS_RETURN_IF_ERROR(RecordFailure(
        device_->StoreScaledGradient(grads_.as<float>(), inverse, plan_.padded_elems(),
                                     DType::kFloat32, grads_.data(), DType::kFloat32)));
  }
  // The trainer reads the buffer next: the device's writes must be complete.
  ZS_RETURN_IF_ERROR(RecordFailure(device_->Synchronize()));
  averaged_ = true;
  ZS_RETURN_IF_ERROR(AllReduceGradientMask());
  std::vector<int64_t> without_gradient;
  for (size_t t = 0; t < skipped_tensors_.size(); ++t) {
    if (skipped_tensors_[t]) without_gradient.push_back(static_cast<int64_t>(t));
  }
  return without_gradient;
}

absl::Status Engine::RecomputeGradStats() {
  const bool zero2 = ShardsGradients();
  for (int64_t b = 0; b < plan_.num_buckets(); ++b) {
    const sharding::BucketLayout& layout = plan_.buckets()[b];
    char* owned = zero2 ? grads_.as<char>() + OwnedOffset(b) * grad_size_
                        : GradsAt(layout.flat_begin + rank_ * layout.piece_elems);
    const int64_t first_chunk = stats_chunk_begin_[b];
    ZS_RETURN_IF_ERROR(RecordFailure(device_->ConvertWithGradStats(
        owned, config_.grad_dtype, owned, config_.grad_dtype,
        stats_chunks_.as<kernels::GradStatsChunk>() + first_chunk,
        stats_chunk_begin_[b + 1] - first_chunk, stats_partials_.as<double>() + first_chunk)));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Engine::OwnedMaxAbs() {
  const bool zero2 = ShardsGradients();
  std::vector<kernels::GradPiece> pieces;
  for (const sharding::OwnedPiece& owned : view_.pieces()) {
    for (const sharding::TensorFragment& fragment : view_.FragmentsOf(owned)) {
      kernels::GradPiece piece;
      piece.data = zero2 ? grads_.as<char>() + (OwnedOffset(owned.bucket) + fragment.flat_begin -
                                                owned.flat_begin) *
                                                   grad_size_
                         : GradsAt(fragment.flat_begin);
      piece.dtype = config_.grad_dtype;
      piece.length = fragment.size();
      pieces.push_back(piece);
    }
  }
  return device_->MaxAbs(pieces);
}

absl::StatusOr<double> Engine::ClipGradNorm(double max_norm, double norm_type) {
  ZS_RETURN_IF_ERROR(failure_.status());
  if (!std::isfinite(max_norm) || max_norm < 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_norm: must be finite and >= 0, got ", max_norm));
  }
  const bool infinity_norm = std::isinf(norm_type) && norm_type > 0;
  if (norm_type != 2.0 && !infinity_norm) {
    return absl::InvalidArgumentError(
        absl::StrCat("norm_type: ", norm_type, " is not supported (2 or inf)"));
  }
  ZS_RETURN_IF_ERROR(CheckHandedOver("ClipGradNorm"));
  ZS_RETURN_IF_ERROR(CompleteReductions());
  if (averaged_) ZS_RETURN_IF_ERROR(RecomputeGradStats());
  double* const stats = stats_buffer_.as<double>();
  absl::Status status;
  if (infinity_norm) {
    absl::StatusOr<double> largest = OwnedMaxAbs();
    status = largest.status();
    if (status.ok()) status = device_->CopyFromHost(stats, &*largest, sizeof(double));
  } else {
    status =
        device_->CombineGradStats(stats_partials_.as<double>(), stats_chunk_begin_.back(), stats);
  }
  comm::CollectiveOptions options;
  options.timeout = config_.collective_timeout;
  if (status.ok()) {
    status = communicator_
                 ->AllReduce(stats, 1, comm::ElementType::kFloat64,
                             infinity_norm ? comm::ReduceOp::kMax : comm::ReduceOp::kSum, options)
                 ->Wait();
  }
  double total = 0.0;
  if (status.ok()) status = device_->CopyToHost(&total, stats, sizeof(total));
  if (!status.ok()) return RecordFailure(status);
  const double divisor =
      (averaged_ ? 1.0 : static_cast<double>(world_size_)) * loss_scaler_.scale();
  clip_norm_ = (infinity_norm ? total : std::sqrt(total)) / divisor;
  clip_max_norm_ = max_norm;
  return clip_norm_;
}

absl::Status Engine::AgreeOnSkippedTensors(double missing) {
  if (missing == 0.0) {
    std::fill(skipped_tensors_.begin(), skipped_tensors_.end(), 0);
    return absl::OkStatus();
  }
  return AllReduceGradientMask();
}

absl::Status Engine::AllReduceGradientMask() {
  // Each rank adds 1 for every tensor it has a gradient for: 0 in the sum means no rank has.
  for (size_t t = 0; t < without_gradient_.size(); ++t) {
    host_gradient_mask_[t] = without_gradient_[t] ? 0.0f : 1.0f;
  }
  const int64_t bytes = plan_.num_tensors() * int64_t{sizeof(float)};
  absl::Status status =
      device_->CopyFromHost(gradient_mask_.data(), host_gradient_mask_.data(), bytes);
  comm::CollectiveOptions options;
  options.timeout = config_.collective_timeout;
  if (status.ok()) {
    status = communicator_
                 ->AllReduce(gradient_mask_.data(), plan_.num_tensors(),
                             comm::ElementType::kFloat32, comm::ReduceOp::kSum, options)
                 ->Wait();
  }
  if (status.ok())
    status = device_->CopyToHost(host_gradient_mask_.data(), gradient_mask_.data(), bytes);
  if (!status.ok()) return RecordFailure(status);
  for (size_t t = 0; t < skipped_tensors_.size(); ++t) {
    skipped_tensors_[t] = host_gradient_mask_[t] == 0.0f ? 1 : 0;
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Engine::Step(double local_loss) {
  ZS_RETURN_IF_ERROR(failure_.status());
  ZS_RETURN_IF_ERROR(CheckHandedOver("Step"));
  StepResult result;
  const absl::Time step_start = absl::Now();
  ZS_RETURN_IF_ERROR(CompleteReductions());
  result.timings = reduction_timings_;
  const absl::Time reduced = absl::Now();
  // The trainer may have changed the averaged gradients (clipped them): their statistics anew.
  if (averaged_) ZS_RETURN_IF_ERROR(RecomputeGradStats());

  // 2. One small all-reduce: sum of squares of the owned gradients, non-finite flag, loss. The
  //    squares were summed per chunk as each bucket retired; their partials are added here in
  //    chunk order, whatever order the buckets retired in, into the device's stats buffer (the
  //    communicator's memory), where the loss joins them.
  double* const stats = stats_buffer_.as<double>();
  absl::Status status =
      device_->CombineGradStats(stats_partials_.as<double>(), stats_chunk_begin_.back(), stats);
  // The loss, the digest of the group values this step uses and its square (the sums tell every
  // rank whether all ranks use the same values: GroupDigest), and how many tensors this rank
  // has no gradient for.
  const double digest = static_cast<double>(groups_digest_);
  const double local_values[4] = {local_loss, digest, digest * digest,
                                  static_cast<double>(without_gradient_count_)};
  if (status.ok()) status = device_->CopyFromHost(stats + 2, local_values, sizeof(local_values));
  comm::CollectiveOptions options;
  options.timeout = config_.collective_timeout;
  if (status.ok()) {
    status = communicator_
                 ->AllReduce(stats_buffer_.data(), kStatsValues, comm::ElementType::kFloat64,
                             comm::ReduceOp::kSum, options)
                 ->Wait();
  }
  double totals[kStatsValues] = {};
  if (status.ok()) status = device_->CopyToHost(totals, stats, sizeof(totals));
  if (!status.ok()) return RecordFailure(status);
  // The mean digest is this rank's and the mean square its square only when every rank's digest
  // is this rank's (no variance); the sums are exact (digests < 2^20, world sizes < 2^12), so
  // every rank sees a disagreement, and none updates.
  const double world = static_cast<double>(world_size_);
  if (totals[3] != world * digest || totals[4] != world * digest * digest) {
    return RecordFailure(absl::FailedPreconditionError(
        "param_groups: the ranks' trainers sent different group values for this step (every "
        "rank's param_groups must hold the same lr, weight_decay, betas, eps, momentum and "
        "dampening at each step)"));
  }
  ZS_RETURN_IF_ERROR(AgreeOnSkippedTensors(totals[5]));
  const absl::Time stats_done = absl::Now();
  result.timings.grad_stats_ms = Milliseconds(stats_done - reduced);
  result.global_loss = totals[2] / world;
  result.loss_scale = loss_scaler_.scale();
  // Averaged in place (AverageGradients): no further division by W.
  const double averaging = averaged_ ? 1.0 : world;
  result.grad_norm = std::sqrt(totals[0]) / (averaging * result.loss_scale);
  result.skipped = totals[1] != 0.0 || !std::isfinite(result.grad_norm);

  // 3. The fused update of the owned pieces (all of them in ddp), unless the step overflowed,
  //    less the pieces of tensors no rank has a gradient for (torch.optim skips them).
  if (!result.skipped) {
    if (clip_max_norm_.has_value()) {
      result.clip_coef = std::min(1.0, *clip_max_norm_ / (clip_norm_ + kClipEpsilon));
    } else if (config_.clip_grad_norm > 0.0) {
      result.clip_coef = std::min(1.0, config_.clip_grad_norm / (result.grad_norm + kClipEpsilon));
    }
    const float grad_scale = static_cast<float>(result.clip_coef / (averaging * result.loss_scale));
    step_pieces_.clear();
    for (size_t i = 0; i < update_pieces_.size(); ++i) {
      const int64_t t = update_piece_tensors_[i];
      if (skipped_tensors_[t]) continue;
      step_pieces_.push_back(update_pieces_[i]);
      step_pieces_.back().step = tensor_steps_[t] + 1;
    }
    status = step_pieces_.empty()
                 ? absl::OkStatus()
                 : device_->ApplyUpdate(optimizer_, optimizer_step_ + 1, grad_scale, step_pieces_);
    // Asynchronous devices: update_ms then covers the update's run time.
    if (status.ok()) status = device_->Synchronize();
    if (!status.ok()) return RecordFailure(status);
    ++optimizer_step_;
    for (size_t t = 0; t < tensor_steps_.size(); ++t) {
      if (skipped_tensors_[t]) {
        tensor_skipped_ever_ = true;
      } else {
        ++tensor_steps_[t];
      }
    }
  }
  loss_scaler_.Update(result.skipped);
  const absl::Time updated = absl::Now();
  result.timings.update_ms = Milliseconds(updated - stats_done);

  // 4. Issue every bucket's parameter all-gather (ddp updated everything already) and return
  //    without waiting: the next forward waits for each bucket when it reads its tensors
  //    (Parameters()). The last bucket goes first, as forward reads the tensor list backwards.
  //    zero3 issues none: the owned pieces are all it keeps. Its pool forgets what it gathered
  //    (the values changed) and prefetches the next forward's first modules.
  const bool gathers = !result.skipped && config_.mode != EngineMode::kDdp && !ShardsParameters();
  if (gathers) IssueGathers();
  if (ShardsParameters()) {
    ZS_RETURN_IF_ERROR(gather_pool_->EndStep());
    gather_pool_->StartStep();
  }
  const absl::Time done = absl::Now();
  if (gathers) result.timings.allgather_ms = Milliseconds(done - updated);
  result.timings.step_ms = Milliseconds(done - step_start);
  result.optimizer_step = optimizer_step_;
  result.next_loss_scale = loss_scaler_.scale();
  result.memory = allocator_.Report();
  ResetStepState();
  return result;
}

void Engine::IssueGathers() {
  timer_.GathersIssued();
  comm::CollectiveOptions options;
  options.timeout = config_.collective_timeout;
  const comm::ElementType type = ToElementType(config_.param_dtype);
  for (int64_t b = plan_.num_buckets() - 1; b >= 0; --b) {
    const sharding::BucketLayout& layout = plan_.buckets()[b];
    ZS_DCHECK(gathers_[b].work == nullptr) << "bucket " << b << " is still being gathered";
    gathers_[b].work = communicator_->AllGatherInPlace(ParamsAt(layout.flat_begin),
                                                       layout.piece_elems, type, options);
    gathers_[b].ordered = false;
  }
}

void Engine::ResetStepState() {
  pipeline_.EndStep();
  next_tensor_ = 0;
  next_element_ = 0;
  timer_.EndStep();
  averaged_ = false;
  reductions_complete_ = false;
  clip_max_norm_.reset();
  if (without_gradient_count_ > 0) {
    std::fill(without_gradient_.begin(), without_gradient_.end(), 0);
    without_gradient_count_ = 0;
  }
}

}  // namespace zeroshard::engine

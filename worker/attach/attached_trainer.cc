// AttachedTrainer: accepting the trainer, the welcome, and the per-step request loop.
#include "worker/attach/attached_trainer.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace zeroshard::attach {
namespace {

// Waits for the listener are cut into slices this long, so that Abort() is seen in time.
constexpr absl::Duration kAcceptSlice = absl::Milliseconds(50);
// A connection's whole hello frame must have come within this of its accept (a trainer writes
// it right after connecting; one queued in the backlog has it there already) ...
constexpr absl::Duration kHelloTimeout = absl::Seconds(10);
// ... and within this of its first byte: one deadline per frame, not per read, so a peer
// dribbling a byte at a time is cut off.
constexpr absl::Duration kHelloFrameTimeout = absl::Seconds(2);
// A hello is a few dozen bytes; a connection that has not said hello may not make the worker
// hold more.
constexpr uint32_t kMaxHelloBytes = 64 << 10;
// Connections waiting for their hello at once; beyond it, one is dropped (EvictionVictim).
constexpr size_t kMaxPendingConnections = 16;

// Whether the peer of connected socket `fd` has closed its end (what it sent may still be
// buffered here).
bool PeerHungUp(int fd) {
  pollfd peer{fd, POLLRDHUP, 0};
  return ::poll(&peer, 1, 0) > 0 && (peer.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace

AttachedTrainer::AttachedTrainer(AttachedTrainerOptions options, SharedBlocks* backing)
    : options_(std::move(options)), backing_(backing) {}

AttachedTrainer::~AttachedTrainer() = default;

void AttachedTrainer::Abort() {
  absl::MutexLock lock(&abort_mu_);
  aborted_ = true;
  if (socket_ != nullptr) socket_->Shutdown();
}

namespace {

// A connection that has not said hello yet.
struct PendingConnection {
  std::unique_ptr<FrameSocket> socket;
  int fd = -1;
  uid_t uid = 0;  // SO_PEERCRED's, for the eviction's fairness
  absl::Time accepted;
  std::optional<absl::Time> first_byte;

  absl::Time deadline() const {
    const absl::Time hello = accepted + kHelloTimeout;
    return first_byte.has_value() ? std::min(hello, *first_byte + kHelloFrameTimeout) : hello;
  }
};

// Which connection to drop for a new one when kMaxPendingConnections wait: the oldest of the
// user holding the most, so that one user's flood of slow connections evicts its own and never
// the trainer of another.
size_t EvictionVictim(const std::vector<PendingConnection>& pending) {
  std::map<uid_t, size_t> held;
  for (const PendingConnection& connection : pending) ++held[connection.uid];
  size_t victim = 0;
  for (size_t k = 1; k < pending.size(); ++k) {
    if (held[pending[k].uid] > held[pending[victim].uid]) victim = k;
  }
  return victim;  // pending is in accept order: the first of the top holder is its oldest
}

}  // namespace

absl::Status AttachedTrainer::Accept() {
  // Connections are served side by side, each read without blocking and held to its own
  // deadline for its whole hello frame: a stray one that sends nothing, or dribbles its bytes,
  // neither holds back this rank's trainer nor hides Abort() or the attach deadline.
  std::vector<PendingConnection> pending;
  // Why the last trainer of this job was refused (for the deadline's error).
  std::string last_refusal;
  auto refuse = [](FrameSocket& connection, const std::string& why) {
    v1::AttachResponse refusal;
    refusal.set_error(why);
    (void)connection.Write(refusal);
  };
  while (true) {
    {
      absl::MutexLock lock(&abort_mu_);
      if (aborted_) return absl::CancelledError("aborted while waiting for the trainer");
    }
    const absl::Time now = absl::Now();
    const absl::Duration remaining = options_.attach_deadline - now;
    if (remaining <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no trainer of ", options_.job_id, " rank ", options_.rank,
          " attached in time (its launcher must start it and call zt.init())",
          last_refusal.empty() ? "" : absl::StrCat("; the last one was refused: ", last_refusal)));
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [&](const PendingConnection& c) { return c.deadline() <= now; }),
                  pending.end());
    absl::Duration wait = std::min(remaining, kAcceptSlice);
    std::vector<pollfd> polled;
    polled.push_back({options_.listen_fd, POLLIN, 0});
    for (const PendingConnection& connection : pending) {
      polled.push_back({connection.fd, POLLIN, 0});
      wait = std::min(wait, connection.deadline() - now);
    }
    const int ready =
        ::poll(polled.data(), polled.size(),
               static_cast<int>(absl::ToInt64Milliseconds(std::max(absl::Milliseconds(1), wait))));
    if (ready <= 0) continue;
    // Hellos first (polled[k + 1] is pending[k]), then new connections.
    std::vector<PendingConnection> still_pending;
    for (size_t k = 0; k < pending.size(); ++k) {
      if (polled[k + 1].revents == 0) {
        still_pending.push_back(std::move(pending[k]));
        continue;
      }
      PendingConnection connection = std::move(pending[k]);
      v1::AttachRequest request;
      const absl::StatusOr<bool> whole = connection.socket->ReadAvailable(request, kMaxHelloBytes);
      if (!whole.ok()) continue;  // closed, broken or not a hello frame: dropped
      if (!*whole) {
        if (!connection.first_byte.has_value() && connection.socket->frame_started()) {
          connection.first_byte = absl::Now();
        }
        still_pending.push_back(std::move(connection));
        continue;
      }
      if (!request.has_hello()) continue;
      // A trainer that connected and died before any generation accepted it (its launcher
      // restarted the script) left its hello in the backlog; welcoming it would fail this
      // generation.
      if (PeerHungUp(connection.fd)) continue;
      const v1::AttachHello& hello = request.hello();
      if (hello.job_id() != options_.job_id) {
        refuse(*connection.socket, absl::StrCat("this worker runs ", options_.job_id, " rank ",
                                                options_.rank, ", not ", hello.job_id()));
        continue;
      }
      std::string mismatch;
      const std::string device_kind = backing_->device().kind;
      const std::string trainer_device_kind =
          hello.device_kind().empty() ? "cpu" : hello.device_kind();
      if (hello.rank() != options_.rank || hello.world_size() != options_.world_size) {
        mismatch =
            absl::StrCat("the trainer is rank ", hello.rank(), " of ", hello.world_size(),
                         ", this worker runs rank ", options_.rank, " of ", options_.world_size);
      } else if (hello.layout_hash() != 0 && hello.layout_hash() != options_.layout_hash) {
        mismatch = absl::StrCat("the trainer's model has layout hash ", hello.layout_hash(),
                                ", the job's plan ", options_.layout_hash,
                                " (a parameter differs in name, shape or group between ranks, "
                                "or the model changed after the job was submitted)");
      } else if (trainer_device_kind != device_kind) {
        mismatch = absl::StrCat("the trainer's parameters are on ", trainer_device_kind,
                                ", this worker's buffers on ", device_kind,
                                " (the job's device_kind must match where the model is)");
      }
      if (!mismatch.empty()) {
        // Only this connection is refused: anyone who can read the job id could otherwise fail
        // the run. This rank's own trainer may still come.
        refuse(*connection.socket, mismatch);
        ZS_LOG(WARNING) << options_.job_id << " rank " << options_.rank
                        << ": refused a trainer: " << mismatch;
        last_refusal = mismatch;
        continue;
      }
      absl::MutexLock lock(&abort_mu_);
      if (aborted_) return absl::CancelledError("aborted while the trainer attached");
      socket_ = std::move(connection.socket);
      return absl::OkStatus();
    }
    pending = std::move(still_pending);
    if ((polled[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(options_.listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    auto connection = std::make_unique<FrameSocket>(fd);
    if (absl::Status allowed = options_.peers.Check(fd); !allowed.ok()) {
      ZS_LOG(WARNING) << "attach socket: " << allowed.message();
      refuse(*connection, std::string(allowed.message()));
      continue;
    }
    ucred peer{};
    socklen_t length = sizeof(peer);
    (void)::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length);
    if (pending.size() >= kMaxPendingConnections) {
      pending.erase(pending.begin() + static_cast<ptrdiff_t>(EvictionVictim(pending)));
    }
    pending.push_back({std::move(connection), fd, peer.uid, absl::Now(), std::nullopt});
  }
}

absl::Status AttachedTrainer::Reply(const v1::AttachResponse& response, int pass_fd) {
  return socket_->Write(response, pass_fd);
}

absl::Status AttachedTrainer::Ack() {
  v1::AttachResponse response;
  response.mutable_ack();
  return Reply(response);
}

absl::Status AttachedTrainer::Fail(absl::Status status) {
  if (socket_ != nullptr && !absl::IsCancelled(status)) {
    v1::AttachResponse response;
    response.set_error(std::string(status.message()));
    (void)socket_->Write(response);
  }
  return status;
}

absl::Status AttachedTrainer::ReadRequest() {
  v1::AttachRequest request;
  // Only load_state may pass a descriptor (the checkpoint the trainer opened); any other is
  // closed here.
  UniqueFd passed;
  ZS_RETURN_IF_ERROR(socket_->Read(request, &passed));
  pending_fd_ = request.has_load_state() ? std::move(passed) : UniqueFd();
  pending_ = std::move(request);
  return absl::OkStatus();
}

absl::Status AttachedTrainer::MapBlock(const v1::MapBlock& request) {
  // Only what the protocol hands this trainer: never the optimizer state, the masters or
  // another bucket.
  if (mappable_blocks_.count(request.block()) == 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "map_block: block ", request.block(),
        " is not one a trainer maps (its parameters, its gradients, and the bucket buffers "
        "`place` named)"));
  }
  const std::optional<SharedBlock> block = backing_->FindById(request.block());
  if (!block.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("map_block: no block ", request.block()));
  }
  v1::AttachResponse response;
  response.mutable_mapped()->set_block(block->id);
  response.mutable_mapped()->set_bytes(block->bytes);
  if (!block->cuda_ipc_handle.empty()) {
    response.mutable_mapped()->set_cuda_ipc_handle(block->cuda_ipc_handle);
    response.mutable_mapped()->set_cuda_pci_bus_id(backing_->device().pci_bus_id);
  }
  return Reply(response, block->fd);
}

absl::Status AttachedTrainer::WaitForDevice() {
  if (options_.device == nullptr) return absl::OkStatus();
  return options_.device->Synchronize();
}

absl::Status AttachedTrainer::Welcome(engine::Engine& engine, int64_t start_step,
                                      bool needs_initial_parameters,
                                      const ShareInitialParameters& share) {
  const sharding::ShardPlan& plan = engine.plan();
  engine_ = &engine;
  const engine::EngineMode mode = engine.config().mode;
  zero3_ = mode == engine::EngineMode::kZero3;
  by_segment_ = mode == engine::EngineMode::kZero2 || zero3_;
  // zero3's step ends without an all-gather: the trainer gathers each module when it runs it.
  gathers_issued_ = mode == engine::EngineMode::kZero1 || mode == engine::EngineMode::kZero2;
  num_tensors_ = static_cast<int32_t>(plan.num_tensors());
  tensor_elements_.assign(num_tensors_, 0);
  full_gradients_.assign(num_tensors_, nullptr);
  v1::AttachResponse response;
  v1::AttachWelcome& welcome = *response.mutable_welcome();
  welcome.set_job_id(options_.job_id);
  welcome.set_worker_name(options_.worker_name);
  welcome.set_worker_id(options_.worker_id);
  welcome.set_generation(options_.generation);
  welcome.set_rank(options_.rank);
  welcome.set_world_size(options_.world_size);
  welcome.set_mode(engine::EngineModeName(engine.config().mode));
  welcome.set_layout_hash(plan.layout_hash());
  welcome.set_start_step(start_step);
  welcome.set_needs_initial_parameters(needs_initial_parameters);
  welcome.set_loss_scale(engine.loss_scale());
  const SharedDevice device = backing_->device();
  welcome.set_device_kind(device.kind);
  if (device.kind == "cuda") {
    welcome.mutable_cuda_device()->set_ordinal(device.ordinal);
    welcome.mutable_cuda_device()->set_pci_bus_id(device.pci_bus_id);
    welcome.mutable_cuda_device()->set_uuid(device.uuid);
  }
  for (int32_t t = 0; t < num_tensors_; ++t) {
    const sharding::TensorSpec& spec = plan.tensors()[t];
    tensor_elements_[t] = spec.num_elements;
    v1::AttachedTensorLayout& layout = *welcome.add_tensors();
    layout.set_name(spec.name);
    for (int64_t dim : spec.shape) layout.add_shape(dim);
    layout.set_elements(spec.num_elements);
    layout.set_grad_block(-1);
    if (zero3_) {
      layout.set_param_block(-1);  // no full parameters between uses: see `gather`
    } else {
      ZS_ASSIGN_OR_RETURN(const workloads::StoredParameters params, engine.Parameters(t));
      const std::optional<SharedBlock> param_block = backing_->Find(params.data);
      if (!param_block.has_value()) {
        return Fail(absl::InternalError("the engine's parameters are not in shared memory"));
      }
      layout.set_param_block(param_block->id);
      mappable_blocks_.insert(param_block->id);
      layout.set_param_offset(static_cast<const char*>(params.data) - param_block->data);
    }
    if (by_segment_) {
      for (int64_t begin = 0; begin < spec.num_elements;) {
        begin = engine.GradSegmentEnd(t, begin);
        layout.add_segment_ends(begin);
      }
    } else {
      ZS_ASSIGN_OR_RETURN(float* gradient, engine.FullGradient(t));
      const std::optional<SharedBlock> grad_block = backing_->Find(gradient);
      if (!grad_block.has_value()) {
        return Fail(absl::InternalError("the engine's gradients are not in shared memory"));
      }
      full_gradients_[t] = gradient;
      layout.set_grad_block(grad_block->id);
      mappable_blocks_.insert(grad_block->id);
      layout.set_grad_offset(reinterpret_cast<char*>(gradient) - grad_block->data);
    }
  }
  if (zero3_) {
    const std::optional<SharedBlock> pool = engine.gather_pool() == nullptr
                                                ? std::nullopt
                                                : backing_->Find(engine.gather_pool()->arena());
    if (!pool.has_value()) {
      return Fail(absl::InternalError("the engine's gather pool is not in shared memory"));
    }
    gather_pool_block_ = pool->id;
    mappable_blocks_.insert(pool->id);
    welcome.set_gather_pool_block(pool->id);
    welcome.set_gather_pool_bytes(engine.gather_pool()->windows() *
                                  engine.gather_pool()->window_bytes());
  }
  // A resumed generation's parameters were loaded on the device: in place before the trainer
  // reads them.
  if (absl::Status waited = WaitForDevice(); !waited.ok()) return Fail(waited);
  ZS_RETURN_IF_ERROR(Reply(response));
  if (!needs_initial_parameters) return absl::OkStatus();
  if (zero3_) {
    // No rank holds a full copy: the engine stages one tensor at a time in its gather pool, the
    // trainer writes it there, rank 0's values reach every rank, and each keeps its owned
    // pieces.
    ZS_RETURN_IF_ERROR(engine.InitializeParameters([&](int64_t tensor, absl::Span<float> out) {
      return ReceiveInitialTensor(static_cast<int32_t>(tensor), out, share);
    }));
    initialized_parameters_ = true;
    return absl::OkStatus();
  }
  // The trainer maps the parameters and writes its model's values; then says so.
  ZS_ASSIGN_OR_RETURN(const v1::AttachRequest written, ReadSkippingMapBlock());
  if (!written.has_initial_parameters()) {
    return Fail(absl::FailedPreconditionError(
        "the trainer must send its initial parameters before its first step"));
  }
  // Every rank's trainer wrote its own model's values into the parameter block, which holds the
  // flat buffer: every tensor and the padding between them (zeros on every rank).
  if (share && num_tensors_ > 0) {
    const char* first = nullptr;
    const char* last = nullptr;
    for (int32_t t = 0; t < num_tensors_; ++t) {
      ZS_ASSIGN_OR_RETURN(const workloads::StoredParameters params, engine.Parameters(t));
      const char* begin = static_cast<const char*>(params.data);
      const char* end = begin + params.size * static_cast<int64_t>(sizeof(float));
      if (first == nullptr || begin < first) first = begin;
      if (last == nullptr || end > last) last = end;
    }
    const std::optional<SharedBlock> block = backing_->Find(first);
    if (!block.has_value()) {
      return Fail(absl::InternalError("the engine's parameters are not in shared memory"));
    }
    float* const params = reinterpret_cast<float*>(block->data + (first - block->data));
    const int64_t elements = (last - first) / static_cast<int64_t>(sizeof(float));
    if (absl::Status shared = share(params, elements); !shared.ok()) {
      return Fail(absl::Status(
          shared.code(),
          absl::StrCat("rank 0's initial parameters to every rank: ", shared.message())));
    }
    if (absl::Status waited = WaitForDevice(); !waited.ok()) return Fail(waited);
  }
  initial_.assign(num_tensors_, {});
  for (int32_t t = 0; t < num_tensors_; ++t) {
    ZS_ASSIGN_OR_RETURN(const workloads::StoredParameters params, engine.Parameters(t));
    if (options_.device != nullptr && !options_.device->host_memory()) {
      initial_[t].resize(params.size);
      if (absl::Status copied = options_.device->CopyToHost(
              initial_[t].data(), params.data, params.size * static_cast<int64_t>(sizeof(float)));
          !copied.ok()) {
        return Fail(copied);
      }
    } else {
      const float* values = static_cast<const float*>(params.data);
      initial_[t].assign(values, values + params.size);
    }
    for (float value : initial_[t]) {
      if (!std::isfinite(value)) {
        return Fail(absl::InvalidArgumentError(absl::StrCat(
            "parameter ", plan.tensors()[t].name, ": its initial values hold NaN or Inf")));
      }
    }
  }
  return Ack();
}

absl::StatusOr<v1::AttachRequest> AttachedTrainer::ReadSkippingMapBlock() {
  while (true) {
    ZS_RETURN_IF_ERROR(ReadRequest());
    v1::AttachRequest request = *std::move(pending_);
    pending_.reset();
    if (!request.has_map_block()) return request;
    if (absl::Status mapped = MapBlock(request.map_block()); !mapped.ok()) return Fail(mapped);
  }
}

absl::Status AttachedTrainer::ReceiveInitialTensor(int32_t tensor, absl::Span<float> out,
                                                   const ShareInitialParameters& share) {
  const std::string& name = engine_->plan().tensors()[tensor].name;
  ZS_ASSIGN_OR_RETURN(const v1::AttachRequest asked, ReadSkippingMapBlock());
  if (!asked.has_initial_tensor() || asked.initial_tensor().tensor() != tensor) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "initial_tensor: the trainer must send each tensor's initial values in plan order; "
        "expected tensor ",
        tensor, " (", name, ")",
        asked.has_initial_tensor() ? absl::StrCat(", got ", asked.initial_tensor().tensor())
                                   : "")));
  }
  const std::optional<SharedBlock> block = backing_->Find(out.data());
  if (!block.has_value()) {
    return Fail(absl::InternalError(
        absl::StrCat("tensor ", name, ": the initial values' staging is not in shared memory")));
  }
  mappable_blocks_.insert(block->id);
  v1::AttachResponse response;
  response.mutable_place()->set_block(block->id);
  response.mutable_place()->set_offset(reinterpret_cast<char*>(out.data()) - block->data);
  ZS_RETURN_IF_ERROR(Reply(response));
  ZS_ASSIGN_OR_RETURN(const v1::AttachRequest written, ReadSkippingMapBlock());
  if (!written.has_initial_parameters()) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "initial_parameters: expected after initial_tensor ", tensor, " (", name, ")")));
  }
  if (share) {
    if (absl::Status shared = share(out.data(), static_cast<int64_t>(out.size())); !shared.ok()) {
      return Fail(absl::Status(shared.code(), absl::StrCat("rank 0's initial values of ", name,
                                                           " to every rank: ", shared.message())));
    }
  }
  for (const float value : out) {
    if (!std::isfinite(value)) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("parameter ", name, ": its initial values hold NaN or Inf")));
    }
  }
  return Ack();
}

absl::Status AttachedTrainer::Gather(const v1::GatherParameters& request) {
  if (!zero3_) {
    return Fail(absl::FailedPreconditionError(
        "gather: only zero3 gathers parameters (the others keep them whole)"));
  }
  v1::AttachResponse response;
  v1::ParametersGathered& gathered = *response.mutable_gathered();
  for (const int32_t tensor : request.tensors()) {
    if (tensor < 0 || tensor >= num_tensors_) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("gather.tensors: no tensor ", tensor,
                                                          " (the plan has ", num_tensors_, ")")));
    }
  }
  for (const int32_t tensor : request.tensors()) {
    absl::StatusOr<workloads::StoredParameters> params = engine_->Parameters(tensor);
    if (!params.ok()) return Fail(params.status());
    const std::optional<SharedBlock> block = backing_->Find(params->data);
    if (!block.has_value() || block->id != gather_pool_block_) {
      return Fail(absl::InternalError("a gathered tensor is not in the gather pool's block"));
    }
    gathered.add_offsets(static_cast<const char*>(params->data) - block->data);
  }
  // On a device the gathers were ordered on its stream: done before the trainer reads.
  if (absl::Status waited = WaitForDevice(); !waited.ok()) return Fail(waited);
  return Reply(response);
}

absl::Status AttachedTrainer::Release(const v1::ReleaseParameters& request) {
  if (!zero3_) {
    return Fail(absl::FailedPreconditionError("release: only zero3 gathers parameters"));
  }
  for (const int32_t tensor : request.tensors()) {
    if (tensor < 0 || tensor >= num_tensors_) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("release.tensors: no tensor ", tensor,
                                                          " (the plan has ", num_tensors_, ")")));
    }
    if (absl::Status released = engine_->ReleaseParameters(tensor); !released.ok()) {
      return Fail(released);
    }
  }
  return absl::OkStatus();
}

absl::Status AttachedTrainer::WriteBack(const v1::WriteParameters& request) {
  if (!zero3_) {
    return Fail(absl::FailedPreconditionError(
        "write_parameters: only zero3 (in the other modes the trainer writes the parameters in "
        "place)"));
  }
  for (const int32_t tensor : request.tensors()) {
    if (tensor < 0 || tensor >= num_tensors_) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "write_parameters.tensors: no tensor ", tensor, " (the plan has ", num_tensors_, ")")));
    }
    if (absl::Status written = engine_->WriteHeldParameters(tensor); !written.ok()) {
      return Fail(
          absl::Status(written.code(), absl::StrCat("write_parameters: ", written.message())));
    }
  }
  return Ack();
}

absl::Status AttachedTrainer::InitialParameters(int64_t tensor, absl::Span<float> out) const {
  if (tensor < 0 || tensor >= static_cast<int64_t>(initial_.size()) ||
      out.size() != initial_[tensor].size()) {
    return absl::FailedPreconditionError("the trainer sent no initial parameters");
  }
  std::copy(initial_[tensor].begin(), initial_[tensor].end(), out.begin());
  return absl::OkStatus();
}

int64_t AttachedTrainer::BufferBytes() const {
  int64_t bytes = 0;
  for (const std::vector<float>& tensor : initial_) {
    bytes += static_cast<int64_t>(tensor.capacity() * sizeof(float));
  }
  return bytes;
}

void AttachedTrainer::SetStateHandlers(AttachedStateHandlers handlers) {
  state_handlers_ = std::move(handlers);
}

absl::Status AttachedTrainer::ServeStateRequest(const v1::AttachRequest& request) {
  v1::AttachResponse response;
  if (request.has_save_state()) {
    if (!state_handlers_.save) {
      response.mutable_state_saved()->set_refused("this worker cannot save attached state");
    } else {
      absl::StatusOr<v1::StateSaved> saved = state_handlers_.save();
      if (!saved.ok()) return Fail(saved.status());
      *response.mutable_state_saved() = *std::move(saved);
    }
  } else {
    if (!state_handlers_.load) {
      response.mutable_state_loaded()->set_refused("this worker cannot load attached state");
    } else {
      absl::StatusOr<v1::StateLoaded> loaded =
          state_handlers_.load(request.load_state(), std::move(pending_fd_));
      if (!loaded.ok()) return Fail(loaded.status());
      *response.mutable_state_loaded() = *std::move(loaded);
    }
  }
  return Reply(response);
}

absl::Status AttachedTrainer::AgreeOn(TrainerCall call) {
  if (!call_hook_) return absl::OkStatus();
  return call_hook_(call, micro_batches_ended_);
}

absl::Status AttachedTrainer::AgreeOnHandOver() {
  if (hand_over_agreed_) return absl::OkStatus();
  ZS_RETURN_IF_ERROR(AgreeOn(TrainerCall::kBackward));
  hand_over_agreed_ = true;
  return absl::OkStatus();
}

absl::StatusOr<bool> AttachedTrainer::AwaitNextStep() {
  // Engine::InitializeParameters has read the initial values by now.
  initial_.clear();
  initial_.shrink_to_fit();
  if (!pending_.has_value()) ZS_RETURN_IF_ERROR(ReadRequest());
  // State requests and the next forward's waits come between steps: served here, before the
  // step's first request. A state request reads or writes the engine's memory, so every
  // all-gather is waited for first.
  while (pending_->has_save_state() || pending_->has_load_state() ||
         pending_->has_wait_parameters() || pending_->has_gather() || pending_->has_release() ||
         pending_->has_write_parameters() || pending_->has_map_block()) {
    const v1::AttachRequest request = *std::move(pending_);
    pending_.reset();
    if (request.has_wait_parameters()) {
      ZS_RETURN_IF_ERROR(WaitParameters(request.wait_parameters()));
    } else if (request.has_gather()) {
      ZS_RETURN_IF_ERROR(Gather(request.gather()));
    } else if (request.has_release()) {
      ZS_RETURN_IF_ERROR(Release(request.release()));
    } else if (request.has_write_parameters()) {
      ZS_RETURN_IF_ERROR(WriteBack(request.write_parameters()));
    } else if (request.has_map_block()) {
      if (absl::Status mapped = MapBlock(request.map_block()); !mapped.ok()) return Fail(mapped);
    } else {
      if (absl::Status waited = WaitForAllGathers(); !waited.ok()) return Fail(waited);
      if (absl::Status agreed =
              AgreeOn(request.has_save_state() ? TrainerCall::kSaveState : TrainerCall::kLoadState);
          !agreed.ok()) {
        return Fail(agreed);
      }
      ZS_RETURN_IF_ERROR(ServeStateRequest(request));
    }
    ZS_RETURN_IF_ERROR(ReadRequest());
  }
  if (pending_->has_finish()) {
    const std::string failure = pending_->finish().failure();
    pending_.reset();
    // The final checkpoint reads the parameters.
    if (absl::Status waited = WaitForAllGathers(); !waited.ok()) return Fail(waited);
    // A rank that finishes while another steps on (uneven step counts) fails both at once (a
    // failed script's finish fails the run anyway, saying why).
    if (failure.empty()) {
      micro_batches_ended_ = 0;
      if (absl::Status agreed = AgreeOn(TrainerCall::kFinish); !agreed.ok()) return Fail(agreed);
    }
    ZS_RETURN_IF_ERROR(Ack());
    // The script ended by an uncaught exception: the job must not count that as a success.
    if (!failure.empty()) {
      return absl::AbortedError(
          absl::StrCat("the trainer of rank ", options_.rank, " failed: ", failure));
    }
    return false;
  }
  return true;
}

absl::Status AttachedTrainer::WaitParameters(const v1::WaitParameters& request) {
  for (const int32_t tensor : request.tensors()) {
    if (tensor < 0 || tensor >= num_tensors_) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "wait_parameters.tensors: no tensor ", tensor, " (the plan has ", num_tensors_, ")")));
    }
  }
  if (outstanding_gathers_ != nullptr) {
    // Only these tensors' buckets: the later ones stay in flight behind the trainer's forward.
    for (const int32_t tensor : request.tensors()) {
      if (absl::Status gathered = outstanding_gathers_->Parameters(tensor).status();
          !gathered.ok()) {
        return Fail(gathered);
      }
    }
    if (absl::Status waited = WaitForDevice(); !waited.ok()) return Fail(waited);
  }
  return Ack();
}

absl::Status AttachedTrainer::WaitForAllGathers() {
  if (outstanding_gathers_ == nullptr) return absl::OkStatus();
  for (int32_t t = 0; t < num_tensors_; ++t) {
    ZS_RETURN_IF_ERROR(outstanding_gathers_->Parameters(t).status());
  }
  // The all-gathers are ordered on the device: done before anyone reads or writes the blocks.
  ZS_RETURN_IF_ERROR(WaitForDevice());
  outstanding_gathers_ = nullptr;
  return absl::OkStatus();
}

absl::Status AttachedTrainer::HandOver(workloads::GradientSink& sink, int32_t tensor) {
  // The trainer's .grad view already holds the gradient: each segment is handed back as it is.
  return workloads::ForEachGradSegment(
      sink, tensor, tensor_elements_[tensor],
      [&](int64_t begin, int64_t, absl::Span<float> buffer) {
        if (buffer.data() != full_gradients_[tensor] + begin) {
          return absl::InternalError(
              "the engine moved a gradient segment out of the shared buffer");
        }
        return absl::OkStatus();
      });
}

absl::Status AttachedTrainer::HandOverReady(workloads::GradientSink& sink) {
  while (next_tensor_ < num_tensors_ && ready_[next_tensor_]) {
    ZS_RETURN_IF_ERROR(HandOver(sink, next_tensor_));
    ++next_tensor_;
  }
  return absl::OkStatus();
}

absl::Status AttachedTrainer::HandOverRest(workloads::GradientSink& sink, const char* what) {
  if (!by_segment_) {
    // Tensors never marked ready take their buffer as it is (zeros, or what accumulated).
    for (; next_tensor_ < num_tensors_; ++next_tensor_)
      ZS_RETURN_IF_ERROR(HandOver(sink, next_tensor_));
    return absl::OkStatus();
  }
  if (open_segment_.has_value() ||
      (next_tensor_ != num_tensors_ && !(micro_batches_ended_ > 0 && !micro_batch_begun_))) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": tensor ", next_tensor_, "'s gradient was not handed over"));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> AttachedTrainer::ForwardBackward(int64_t step,
                                                        workloads::ParameterSource& params,
                                                        workloads::GradientSink& sink) {
  // The trainer reads the shared parameters, gathered before the last answer (zero3: gathered
  // through engine_, the same engine, at each `gather`).
  (void)params;
  ready_.assign(num_tensors_, false);
  next_tensor_ = 0;
  open_segment_.reset();
  micro_batches_ended_ = 0;
  micro_batch_begun_ = false;
  hand_over_agreed_ = false;
  lr_.reset();
  while (true) {
    if (!pending_.has_value()) {
      if (absl::Status read = ReadRequest(); !read.ok()) return read;
    }
    v1::AttachRequest request = *std::move(pending_);
    pending_.reset();
    if (request.request_case() == v1::AttachRequest::kWaitParameters) {
      ZS_RETURN_IF_ERROR(WaitParameters(request.wait_parameters()));
      continue;
    }
    // zero3: forward and backward gather and release each module as it runs.
    if (request.request_case() == v1::AttachRequest::kGather) {
      ZS_RETURN_IF_ERROR(Gather(request.gather()));
      continue;
    }
    if (request.request_case() == v1::AttachRequest::kRelease) {
      ZS_RETURN_IF_ERROR(Release(request.release()));
      continue;
    }
    // Every other request of the step hands gradients over or reads them (or ends the step):
    // the all-gathers the trainer's forward did not wait for complete first, so that nothing
    // touches the engine's memory under them.
    if (request.request_case() != v1::AttachRequest::kMapBlock) {
      if (absl::Status waited = WaitForAllGathers(); !waited.ok()) return Fail(waited);
    }
    // The step's collective calls are agreed on with the other ranks before the engine runs
    // anything of them (CallAgreement): the hand-over of this backward's gradients at its first
    // one (ddp/zero1: also at a request that hands over what backward did not mark ready),
    // then average_gradients, clip_grad_norm and step each.
    absl::Status agreed;
    switch (request.request_case()) {
      case v1::AttachRequest::kReady:
      case v1::AttachRequest::kSegment:
        agreed = AgreeOnHandOver();
        break;
      case v1::AttachRequest::kAverageGradients:
      case v1::AttachRequest::kClipGradNorm:
      case v1::AttachRequest::kStep:
        // zero2 hands every tensor over by segment first (agreed there).
        if (!by_segment_) agreed = AgreeOnHandOver();
        if (agreed.ok()) {
          agreed = AgreeOn(request.has_step()             ? TrainerCall::kStep
                           : request.has_clip_grad_norm() ? TrainerCall::kClipGradNorm
                                                          : TrainerCall::kAverageGradients);
        }
        break;
      default:
        break;
    }
    if (!agreed.ok()) return Fail(agreed);
    absl::Status served;
    switch (request.request_case()) {
      case v1::AttachRequest::kMapBlock:
        served = MapBlock(request.map_block());
        break;
      case v1::AttachRequest::kReady:
        if (by_segment_) {
          served = absl::FailedPreconditionError("ready: zero2 hands gradients over by segment");
          break;
        }
        for (int32_t tensor : request.ready().tensors()) {
          if (tensor < 0 || tensor >= num_tensors_) {
            served = absl::InvalidArgumentError(absl::StrCat("ready: no tensor ", tensor));
            break;
          }
          ready_[tensor] = true;
        }
        if (served.ok()) served = HandOverReady(sink);
        break;
      case v1::AttachRequest::kSegment: {
        const v1::GradientSegment& segment = request.segment();
        if (!by_segment_ || open_segment_.has_value() || segment.tensor() < 0 ||
            segment.tensor() >= num_tensors_) {
          served = absl::FailedPreconditionError(
              absl::StrCat("segment: tensor ", segment.tensor(), " [", segment.begin(), ", ",
                           segment.end(), ") is not the next segment"));
          break;
        }
        // The backward hook that asks must not block: without `wait` a segment whose bucket has
        // no free buffer is deferred, and the trainer keeps the gradient until it asks again.
        absl::StatusOr<std::optional<absl::Span<float>>> buffer =
            sink.TryGradBuffer(segment.tensor(), segment.begin(), segment.end());
        if (buffer.ok() && !buffer->has_value() && segment.wait()) {
          buffer = sink.GradBuffer(segment.tensor(), segment.begin(), segment.end());
        }
        if (!buffer.ok()) {
          served = buffer.status();
          break;
        }
        if (!buffer->has_value()) {
          v1::AttachResponse response;
          response.mutable_deferred();
          served = Reply(response);
          break;
        }
        const absl::Span<float> place = **buffer;
        const std::optional<SharedBlock> block = backing_->Find(place.data());
        if (!block.has_value()) {
          served = absl::InternalError("the engine's bucket buffer is not in shared memory");
          break;
        }
        // On a device the buffer is free once the reduction that used it has run, which the
        // engine orders on the device only: the trainer writes into it from another process.
        served = WaitForDevice();
        if (!served.ok()) break;
        open_segment_ = segment;
        v1::AttachResponse response;
        mappable_blocks_.insert(block->id);
        response.mutable_place()->set_block(block->id);
        response.mutable_place()->set_offset(reinterpret_cast<char*>(place.data()) - block->data);
        served = Reply(response);
        break;
      }
      case v1::AttachRequest::kWritten: {
        const v1::GradientSegment& segment = request.written();
        if (!open_segment_.has_value() || open_segment_->tensor() != segment.tensor() ||
            open_segment_->begin() != segment.begin() || open_segment_->end() != segment.end()) {
          served = absl::FailedPreconditionError("written: not the segment that was placed");
          break;
        }
        open_segment_.reset();
        micro_batch_begun_ = true;
        served = sink.GradWritten(segment.tensor(), segment.begin(), segment.end());
        if (served.ok() && segment.end() == tensor_elements_[segment.tensor()]) {
          next_tensor_ = segment.tensor() + 1;
        }
        break;
      }
      case v1::AttachRequest::kMicroBatchDone:
        if (!by_segment_) {
          served = absl::FailedPreconditionError(
              "micro_batch_done: ddp/zero1 accumulate in the shared gradient buffer");
          break;
        }
        if (next_tensor_ != num_tensors_ || open_segment_.has_value()) {
          served = absl::FailedPreconditionError(absl::StrCat(
              "micro_batch_done: tensor ", next_tensor_, "'s gradient was not handed over"));
          break;
        }
        // The engine waits for the micro-batch's last reductions here, while the trainer runs
        // the next forward (no answer is expected).
        served = sink.EndMicroBatch();
        next_tensor_ = 0;
        micro_batch_begun_ = false;
        ++micro_batches_ended_;
        hand_over_agreed_ = false;
        break;
      case v1::AttachRequest::kAverageGradients:
        if (engine_ == nullptr || engine_->config().mode != engine::EngineMode::kDdp) {
          served = absl::FailedPreconditionError(
              "average_gradients: only ddp keeps the whole reduced gradient");
          break;
        }
        served = HandOverRest(sink, "average_gradients");
        if (served.ok()) {
          const auto& named = request.average_gradients().tensors_without_gradient();
          served =
              engine_->SetTensorsWithoutGradient(std::vector<int64_t>(named.begin(), named.end()));
        }
        if (served.ok()) {
          absl::StatusOr<std::vector<int64_t>> without_gradient = engine_->AverageGradients();
          served = without_gradient.status();
          // The trainer reads the averaged buffer next: the device is done with it first.
          if (served.ok()) served = WaitForDevice();
          if (served.ok()) {
            v1::AttachResponse response;
            for (const int64_t t : *without_gradient) {
              response.mutable_averaged()->add_tensors_without_gradient(static_cast<int32_t>(t));
            }
            response.mutable_averaged();
            served = Reply(response);
          }
        }
        break;
      case v1::AttachRequest::kClipGradNorm: {
        if (engine_ == nullptr) {
          served = absl::FailedPreconditionError("clip_grad_norm: no engine");
          break;
        }
        served = HandOverRest(sink, "clip_grad_norm");
        if (!served.ok()) break;
        absl::StatusOr<double> norm = engine_->ClipGradNorm(request.clip_grad_norm().max_norm(),
                                                            request.clip_grad_norm().norm_type());
        if (!norm.ok()) {
          served = norm.status();
          break;
        }
        v1::AttachResponse response;
        response.mutable_grad_norm()->set_total_norm(*norm);
        served = Reply(response);
        break;
      }
      case v1::AttachRequest::kStep: {
        const v1::StepRequest& step_request = request.step();
        const double lr = step_request.lr();
        if (!std::isfinite(lr) || lr < 0) {
          return Fail(absl::InvalidArgumentError(absl::StrCat("step: lr ", lr, " is not >= 0")));
        }
        if (absl::Status handed = HandOverRest(sink, "step"); !handed.ok()) return Fail(handed);
        const std::vector<int64_t> without_gradient(step_request.tensors_without_gradient().begin(),
                                                    step_request.tensors_without_gradient().end());
        if (engine_ != nullptr) {
          if (absl::Status marked = engine_->SetTensorsWithoutGradient(without_gradient);
              !marked.ok()) {
            return Fail(marked);
          }
        }
        lr_ = lr;
        overlap_requested_ = step_request.overlap_all_gather();
        group_values_.clear();
        for (const v1::GroupValues& values : step_request.param_groups()) {
          kernels::GroupHyperparameters& group = group_values_.emplace_back();
          group.lr = values.lr();
          group.weight_decay = values.weight_decay();
          group.beta1 = values.beta1();
          group.beta2 = values.beta2();
          group.eps = values.eps();
          group.momentum = values.momentum();
          group.dampening = values.dampening();
        }
        return step_request.loss();
      }
      case v1::AttachRequest::kFinish:
        // The trainer gave up on this step (an exception between backward and step()): its
        // gradients are incomplete, so the run fails (its peers stop at once) after the ack.
        (void)Ack();
        return absl::AbortedError(absl::StrCat(
            "the trainer of rank ", options_.rank, " finished in the middle of step ", step,
            " (after handing over part of its gradients)",
            request.finish().failure().empty() ? ""
                                               : absl::StrCat(": ", request.finish().failure())));
      default:
        served = absl::FailedPreconditionError(absl::StrCat(
            "request ", static_cast<int>(request.request_case()), " is not allowed during a step"));
    }
    if (!served.ok()) return Fail(served);
  }
}

absl::Status AttachedTrainer::StepApplied(const workloads::StepOutcome& outcome,
                                          workloads::ParameterSource& params) {
  // With the overlap, the trainer's step() returns now and its next forward waits for each
  // module's tensors (wait_parameters) while the later buckets are still being gathered.
  const bool pending = overlap_requested_ && gathers_issued_;
  outstanding_gathers_ = &params;
  if (zero3_) {
    // Nothing is gathered after a zero3 step; the update is on the owned pieces only, which the
    // trainer never reads (each gather waits for the device).
    outstanding_gathers_ = nullptr;
  } else if (!pending) {
    if (absl::Status waited = WaitForAllGathers(); !waited.ok()) return Fail(waited);
  }
  v1::AttachResponse response;
  v1::StepOutcome& result = *response.mutable_step_result();
  result.set_skipped(outcome.skipped);
  result.set_optimizer_step(outcome.optimizer_step);
  result.set_global_loss(outcome.global_loss);
  result.set_grad_norm(outcome.grad_norm);
  result.set_clip_coef(outcome.clip_coef);
  result.set_next_loss_scale(outcome.next_loss_scale);
  result.set_parameters_pending(pending);
  return Reply(response);
}

}  // namespace zeroshard::attach

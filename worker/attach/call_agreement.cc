// CallAgreement: an all-gather of each rank's call record before the call's collectives.
#include "worker/attach/call_agreement.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace zeroshard::attach {
namespace {

// The exchange's tag: an engine collective that another rank issued instead times out rather
// than pairing with it (CollectiveOptions::tag).
constexpr uint32_t kCallAgreementTag = 0x43414c4c;  // "CALL"
// After a mismatch every rank knows it from the same records; they meet once more before
// failing, so that none fails (and aborts its peers' exchange) before every rank has the records.
constexpr absl::Duration kMismatchBarrierTimeout = absl::Seconds(10);
// Ranks named one by one in a message; the rest are counted.
constexpr size_t kNamedRanks = 4;
constexpr char kRule[] =
    "every rank must make the same collective calls (backward, opt.step(), "
    "opt.clip_grad_norm_(), opt.state_dict(), opt.load_state_dict(), zt.finish()) in the same "
    "order (docs/pytorch.md, \"Collective calls\")";

std::string CallAt(TrainerCall call, int64_t step, int64_t micro_batch) {
  return absl::StrCat(TrainerCallName(call, micro_batch), " at step ", step);
}

}  // namespace

std::string TrainerCallName(TrainerCall call, int64_t micro_batch) {
  switch (call) {
    case TrainerCall::kBackward:
      return micro_batch > 0 ? absl::StrCat("backward (micro-batch ", micro_batch + 1,
                                            " of the step, after opt.no_sync())")
                             : "backward";
    case TrainerCall::kAverageGradients:
      return "the end of backward (ddp's gradient average)";
    case TrainerCall::kClipGradNorm:
      return "opt.clip_grad_norm_()";
    case TrainerCall::kStep:
      return "opt.step()";
    case TrainerCall::kSaveState:
      return "opt.state_dict()";
    case TrainerCall::kLoadState:
      return "opt.load_state_dict()";
    case TrainerCall::kFinish:
      return "zt.finish() (or the script's end)";
  }
  return absl::StrCat("call ", static_cast<int64_t>(call));
}

CallAgreement::CallAgreement(comm::Communicator* communicator, CallAgreementOptions options)
    : communicator_(communicator), options_(std::move(options)) {}

CallAgreement::~CallAgreement() {
  if (device_mine_ != nullptr) options_.device->Free(device_mine_);
  if (device_all_ != nullptr) options_.device->Free(device_all_);
}

absl::StatusOr<std::unique_ptr<CallAgreement>> CallAgreement::Create(
    comm::Communicator* communicator, CallAgreementOptions options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("call agreement: rank ", options.rank, " of world size ", options.world_size));
  }
  std::unique_ptr<CallAgreement> agreement(new CallAgreement(communicator, std::move(options)));
  engine::DeviceOps* const device = agreement->options_.device;
  if (device != nullptr && !device->host_memory()) {
    const int64_t bytes = static_cast<int64_t>(sizeof(int64_t)) * kFields;
    agreement->device_mine_ = device->AllocateZeroed(bytes);
    agreement->device_all_ = device->AllocateZeroed(bytes * agreement->options_.world_size);
    if (agreement->device_mine_ == nullptr || agreement->device_all_ == nullptr) {
      return absl::ResourceExhaustedError("out of device memory for the call agreement's records");
    }
  }
  return agreement;
}

absl::Status CallAgreement::Exchange(const int64_t (&mine)[kFields], int64_t* all) {
  comm::CollectiveOptions collective;
  collective.timeout = options_.timeout;
  collective.tag = kCallAgreementTag;
  const int64_t bytes = static_cast<int64_t>(sizeof(mine));
  if (device_mine_ == nullptr) {
    return communicator_->AllGather(mine, all, kFields, comm::ElementType::kInt64, collective)
        ->Wait();
  }
  ZS_RETURN_IF_ERROR(options_.device->CopyFromHost(device_mine_, mine, bytes));
  ZS_RETURN_IF_ERROR(
      communicator_
          ->AllGather(device_mine_, device_all_, kFields, comm::ElementType::kInt64, collective)
          ->Wait());
  return options_.device->CopyToHost(all, device_all_, bytes * options_.world_size);
}

absl::Status CallAgreement::Agree(TrainerCall call, int64_t step, int64_t micro_batch) {
  const int64_t sequence = ++sequence_;
  const std::string here =
      absl::StrCat(TrainerCallName(call, micro_batch), " on rank ", options_.rank, " (at step ",
                   step, ", collective call #", sequence, ")");
  const int64_t mine[kFields] = {static_cast<int64_t>(call), sequence, step, micro_batch};
  std::vector<int64_t> all(static_cast<size_t>(kFields) * options_.world_size, 0);
  if (options_.world_size > 1) {
    if (absl::Status exchanged = Exchange(mine, all.data()); !exchanged.ok()) {
      if (!absl::IsDeadlineExceeded(exchanged)) {
        return absl::Status(exchanged.code(), absl::StrCat(here, ": ", exchanged.message()));
      }
      const std::string who =
          options_.world_size == 2 ? absl::StrCat("rank ", 1 - options_.rank) : "not every rank";
      const std::string last =
          last_call_.has_value() ? absl::StrCat("every rank's last collective call was ",
                                                CallAt(*last_call_, last_step_, last_micro_batch_))
                                 : "no collective call was made before";
      return absl::DeadlineExceededError(
          absl::StrCat(here, ": ", who, " did not make any collective call within ",
                       absl::FormatDuration(options_.timeout), " (", last, "); ", kRule));
    }
  }
  std::vector<std::string> others;
  size_t differing = 0;
  for (int r = 0; r < options_.world_size; ++r) {
    if (r == options_.rank) continue;
    const int64_t* theirs = all.data() + static_cast<size_t>(r) * kFields;
    if (theirs[0] == mine[0] && theirs[1] == mine[1]) continue;
    if (++differing > kNamedRanks) continue;
    others.push_back(absl::StrCat(
        "rank ", r, " called ", CallAt(static_cast<TrainerCall>(theirs[0]), theirs[2], theirs[3]),
        theirs[1] == sequence ? "" : absl::StrCat(" (its collective call #", theirs[1], ")")));
  }
  if (differing == 0) {
    last_call_ = call;
    last_step_ = step;
    last_micro_batch_ = micro_batch;
    return absl::OkStatus();
  }
  if (differing > kNamedRanks) {
    others.push_back(absl::StrCat(differing - kNamedRanks, " more rank(s) called another"));
  }
  // Every rank found the mismatch in the same records: they meet before any fails (its failure
  // would abort a peer's exchange still under way, which would then not say why).
  comm::CollectiveOptions barrier;
  barrier.timeout = kMismatchBarrierTimeout;
  barrier.tag = kCallAgreementTag;
  (void)communicator_->Barrier(barrier)->Wait();
  return absl::FailedPreconditionError(absl::StrCat(
      here, ": not joined by every rank: ", absl::StrJoin(others, "; "), " instead; ", kRule));
}

}  // namespace zeroshard::attach

// CallAgreement: the ranks' workers agree on which collective call their trainers made before
// running its collectives (docs/pytorch.md, "Collective calls"), so that a call only some ranks
// make (state_dict() on rank 0 only, uneven step counts) fails on every rank at once, naming
// the call and the ranks, instead of hanging in collectives that do not match.
#ifndef ZEROSHARD_WORKER_ATTACH_CALL_AGREEMENT_H_
#define ZEROSHARD_WORKER_ATTACH_CALL_AGREEMENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/engine/device_ops.h"

namespace zeroshard::attach {

// A trainer's call that makes the workers run collectives (attach.proto's requests), in the
// order a step makes them. Values travel between workers: never renumber.
enum class TrainerCall : int64_t {
  // The first gradient hand-over of a backward (zero2: of each micro-batch; ddp/zero1: of the
  // step, or its step/average_gradients/clip_grad_norm when no gradient was marked ready).
  kBackward = 1,
  kAverageGradients = 2,  // ddp: the end of a backward
  kClipGradNorm = 3,
  kStep = 4,
  kSaveState = 5,  // state_dict()
  kLoadState = 6,  // load_state_dict()
  kFinish = 7,     // zt.finish(), or the script's end
};

// How the script makes the call, for messages ("opt.state_dict()").
std::string TrainerCallName(TrainerCall call, int64_t micro_batch);

struct CallAgreementOptions {
  int rank = 0;
  int world_size = 1;
  // How long a rank waits for the others to make any call once it made one: a rank slower to
  // get there (an evaluation between steps) is not an error, so this is generous; a rank that
  // makes another call is an error at once, whatever this is.
  absl::Duration timeout = absl::Minutes(5);
  // The communicator's memory when it is not the host's (CUDA workers); null: the host.
  engine::DeviceOps* device = nullptr;
};

// Thread contract: Agree from the run's thread, which issues the communicator's operations.
class CallAgreement {
 public:
  // `communicator` (not owned) outlives this.
  static absl::StatusOr<std::unique_ptr<CallAgreement>> Create(comm::Communicator* communicator,
                                                               CallAgreementOptions options);
  ~CallAgreement();
  CallAgreement(const CallAgreement&) = delete;
  CallAgreement& operator=(const CallAgreement&) = delete;

  // Collective: every rank's worker calls it before it runs the collectives of its trainer's
  // call, at the job's `step` (`micro_batch`: zero2's backward number within the step, for
  // messages). OK when every rank made the same call. FAILED_PRECONDITION naming the ranks that
  // made another call and theirs (found at once, on every rank); DEADLINE_EXCEEDED naming the
  // ranks' last agreed call when not every rank made a call within options.timeout; another
  // failure of the exchange (a lost peer) with the call named.
  absl::Status Agree(TrainerCall call, int64_t step, int64_t micro_batch);

 private:
  // One rank's record as it travels: call, sequence (calls agreed so far), step, micro-batch.
  static constexpr int kFields = 4;

  CallAgreement(comm::Communicator* communicator, CallAgreementOptions options);
  absl::Status Exchange(const int64_t (&mine)[kFields], int64_t* all);

  comm::Communicator* const communicator_;
  const CallAgreementOptions options_;
  int64_t sequence_ = 0;  // calls agreed so far (the same on every rank)
  // The last agreed call, its step and micro-batch, for the timeout's message.
  std::optional<TrainerCall> last_call_;
  int64_t last_step_ = 0;
  int64_t last_micro_batch_ = 0;
  // Device buffers (CUDA workers): this rank's record and every rank's.
  void* device_mine_ = nullptr;
  void* device_all_ = nullptr;
};

}  // namespace zeroshard::attach

#endif  // ZEROSHARD_WORKER_ATTACH_CALL_AGREEMENT_H_

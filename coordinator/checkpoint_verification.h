// A committed checkpoint's files checked whole against its manifest, as VerifyCheckpoint answers
// them, and the refusal an export makes of a checkpoint that is not intact.
#ifndef ZEROSHARD_COORDINATOR_CHECKPOINT_VERIFICATION_H_
#define ZEROSHARD_COORDINATOR_CHECKPOINT_VERIFICATION_H_

#include <vector>

#include "absl/status/status.h"
#include "checkpoint/manifest.h"
#include "coordinator/job_manager.h"
#include "zeroshard/v1/coordinator.pb.h"

namespace zeroshard::coordinator {

// The API's name for a file's state.
v1::CheckpointFileState ToCheckpointFileState(checkpoint::CheckpointFileState state);

// Reads every file of `source` whole (checkpoint::VerifyCheckpoint: size, then the CRC32C of the
// whole file, through the step directory's descriptor, never following a link) and answers each
// one's state, in rank order; `ok` when all are intact. Blocks for as long as reading the
// checkpoint takes: never call it on gRPC's threads or under JobManager's lock.
v1::VerifyCheckpointResponse VerifyCommittedCheckpoint(const CommittedCheckpointSource& source);

// OK when every file of `checks` is intact. Otherwise the first damaged one's error, naming the
// file, its state and what was found, and how many are damaged: DATA_LOSS for a missing file, a
// size or CRC32C mismatch and a file that is not a regular file (a link); an unreadable file keeps
// its I/O error's code.
absl::Status FirstDamagedFile(const std::vector<checkpoint::CheckpointFileCheck>& checks);

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_CHECKPOINT_VERIFICATION_H_

// The worker daemon's identity file (--identity_file): the id and secret of its latest
// registration, kept across restarts of the daemon so that a restarted daemon proves it is the
// worker that held its name (previous_worker_id and secret) and gets the name back at once; a
// name is held by proof (docs/api.md, "Identities and roles").
#ifndef ZEROSHARD_WORKER_DAEMON_IDENTITY_FILE_H_
#define ZEROSHARD_WORKER_DAEMON_IDENTITY_FILE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zeroshard::worker {

struct WorkerIdentity {
  std::string worker_id;
  // A credential: the file is mode 0600 and never logged.
  std::string secret;
};

// Reads the identity kept at `path`: nullopt when there is none yet (the file does not exist).
// FAILED_PRECONDITION ("identity_file: ...") for a link, a file that is not regular, owned by
// another user or readable or writable by group or others, or one that is not an identity file;
// I/O errors as they are.
absl::StatusOr<std::optional<WorkerIdentity>> ReadIdentityFile(const std::string& path);

// Replaces the identity at `path` atomically (a new file of mode 0600 beside it, fsync'd, renamed
// over it, the directory fsync'd). Errors name identity_file.
absl::Status WriteIdentityFile(const std::string& path, const WorkerIdentity& identity);

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_IDENTITY_FILE_H_

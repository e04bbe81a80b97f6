// Test support: a loopback TCP port for a server a test must start on a port it knows first
// (e.g. to restart it on the same port). Servers that may pick their own port should bind 0.
#ifndef ZEROSHARD_COMMON_FREE_PORT_H_
#define ZEROSHARD_COMMON_FREE_PORT_H_

#include "absl/status/statusor.h"

namespace zeroshard::common {

// A port on 127.0.0.1 that was free a moment ago: binds port 0, reads the port, closes. Another
// process may take it before the caller binds it. Thread-safe.
absl::StatusOr<int> PickFreeLoopbackPort();

// The same, for tests that cannot go on without one: aborts with the error otherwise.
int PickFreeLoopbackPortOrDie();

}  // namespace zeroshard::common

#endif  // ZEROSHARD_COMMON_FREE_PORT_H_

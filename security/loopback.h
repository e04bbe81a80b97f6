// Whether a gRPC target names this machine only (loopback addresses, localhost, unix sockets):
// the clients send a bearer token in plaintext only to such targets unless told --insecure.
#ifndef ZEROSHARD_SECURITY_LOOPBACK_H_
#define ZEROSHARD_SECURITY_LOOPBACK_H_

#include "absl/strings/string_view.h"

namespace zeroshard::security {

// True for a gRPC target every address of which is on this machine: `unix:` and
// `unix-abstract:` sockets, and hosts 127.0.0.0/8, ::1 (also as ::ffff:127.x.y.z) or localhost,
// written as `host:port`, `[v6]:port`, `dns:[//authority/]host:port` or an `ipv4:`/`ipv6:` list.
// Any other name is false, even one that resolves to loopback: it is not resolved.
bool IsLoopbackTarget(absl::string_view target);

// The env var that, set to 1, lets a client send its token in plaintext to a non-loopback target
// (as the --insecure flag does).
inline constexpr char kInsecureEnv[] = "ZEROSHARD_INSECURE";

}  // namespace zeroshard::security

#endif  // ZEROSHARD_SECURITY_LOOPBACK_H_

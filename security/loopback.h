// Whether a gRPC target names this machine only (loopback addresses, localhost, unix sockets):
// the clients send a bearer token in plaintext only to such targets unless told --insecure.
#ifndef ZEROSHARD_SECURITY_LOOPBACK_H_
#define ZEROSHARD_SECURITY_LOOPBACK_H_

#include "absl/strings/string_view.h"

namespace zeroshard::security {

// True for a gRPC target every address of which is on this machine without asking a DNS server:
//   - `unix:` and `unix-abstract:` sockets;
//   - IP literals in 127.0.0.0/8 or ::1 (also ::ffff:127.x.y.z), as `host[:port]`,
//     `[v6][:port]`, `dns:[//authority/]host[:port]` or an `ipv4:`/`ipv6:` list (literals only);
//   - `localhost` (any case, no trailing dot) as `localhost[:port]` or `dns:[///]localhost[:port]`:
//     the system resolver answers it from /etc/hosts.
// Anything else is false, even a name that resolves to loopback, since a DNS server answers
// it: `localhost.` (fully qualified, so not in /etc/hosts) and `dns://SERVER/localhost:P`
// (SERVER is asked) included. A port, where given, is decimal digits. See kLoopbackRule.
bool IsLoopbackTarget(absl::string_view target);

// The rule above in one phrase, for errors that refuse a target.
inline constexpr char kLoopbackRule[] =
    "loopback means 127.0.0.0/8 or ::1 written as an IP literal, `localhost` without a trailing "
    "dot or a dns://SERVER/ authority, or a unix: socket";

// The env var that, set to 1, lets a client send its token in plaintext to a non-loopback target
// (as the --insecure flag does).
inline constexpr char kInsecureEnv[] = "ZEROSHARD_INSECURE";

}  // namespace zeroshard::security

#endif  // ZEROSHARD_SECURITY_LOOPBACK_H_

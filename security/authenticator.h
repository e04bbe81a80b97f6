// Who is calling: the server side of identities. Maps a call's bearer token, or its verified
// client certificate, to an Identity through the token file, which SIGHUP reloads.
#ifndef ZEROSHARD_SECURITY_AUTHENTICATOR_H_
#define ZEROSHARD_SECURITY_AUTHENTICATOR_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/server_context.h"
#include "security/identity.h"

namespace zeroshard::security {

// Thread-safe: Authenticate runs on gRPC's threads while Reload runs on another.
class Authenticator {
 public:
  // Authentication off: every caller is an admin named after its peer host (the development
  // default on loopback).
  static std::unique_ptr<Authenticator> Disabled();
  // Loads `token_file` (`token role name` lines, identity.h); errors name the file and line.
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromTokenFile(std::string token_file);
  // For tests and tools: a table parsed already.
  static std::unique_ptr<Authenticator> FromTable(TokenTable table);

  bool enabled() const { return enabled_; }

  // Re-reads the token file. On error the table in use stays, and the error says why.
  absl::Status Reload() ABSL_LOCKS_EXCLUDED(mu_);
  // Entries (tokens and certificate names) in the table in use.
  size_t entries() const ABSL_LOCKS_EXCLUDED(mu_);

  // The caller of `context`:
  //   - "authorization: Bearer <token>" with a token of the table;
  //   - else a client certificate, verified by the TLS handshake, whose subject CN the table
  //     lists as `cert:<CN>`;
  //   - else UNAUTHENTICATED saying what to send. A token that is not in the table is
  //     UNAUTHENTICATED too, and so is a malformed authorization header.
  // With `credential`, sets it to the credential that authenticated the caller, as Revoked
  // takes it: "token:<SHA-256 hex>" or "cert:<CN>"; "" with authentication off.
  absl::StatusOr<Identity> Authenticate(const grpc::ServerContextBase& context,
                                        std::string* credential = nullptr) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The identity of a bearer token that came another way (the dashboard's HTTP port): the same
  // table and the same UNAUTHENTICATED error for a token that is not in it. With
  // authentication off, an admin named "anonymous". `credential` as for Authenticate.
  absl::StatusOr<Identity> AuthenticateToken(absl::string_view token,
                                             std::string* credential = nullptr) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the table in use no longer gives `identity` (name and role) to `credential` (from
  // Authenticate): its line was removed, or now names another identity or role. Long calls and
  // dashboard sessions ask this after a Reload. Never with authentication off.
  bool Revoked(const std::string& credential, const Identity& identity) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Authenticator(bool enabled, std::string token_file, TokenTable table);

  std::shared_ptr<const TokenTable> table() const ABSL_LOCKS_EXCLUDED(mu_);

  const bool enabled_;
  const std::string token_file_;
  mutable absl::Mutex mu_;
  // Replaced whole by Reload; callers copy the pointer and read without the lock.
  std::shared_ptr<const TokenTable> table_ ABSL_GUARDED_BY(mu_);
};

// The host part of a gRPC peer string ("ipv4:10.0.0.1:5000" -> "10.0.0.1", "ipv6:[::1]:5000" ->
// "[::1]"); other forms (unix sockets) whole.
std::string PeerHost(const std::string& peer);

}  // namespace zeroshard::security

#endif  // ZEROSHARD_SECURITY_AUTHENTICATOR_H_

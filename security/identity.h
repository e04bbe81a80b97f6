// Who a caller is: the roles of docs/api.md ("Identities and roles") and the table of bearer
// tokens and client-certificate names that grants them (the coordinator's --token_file).
#ifndef ZEROSHARD_SECURITY_IDENTITY_H_
#define ZEROSHARD_SECURITY_IDENTITY_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zeroshard::security {

// viewer < submitter < admin grant more and more of the people's RPCs; worker is the daemons'
// role, limited to their own assignment. docs/api.md holds the table of what each may call.
enum class Role { kViewer, kSubmitter, kAdmin, kWorker };

// "viewer", "submitter", "admin", "worker".
absl::string_view RoleName(Role role);
std::optional<Role> ParseRole(absl::string_view name);

struct Identity {
  // From the token file's third column; recorded as a job's submitter.
  std::string name;
  Role role = Role::kViewer;
};

using Sha256Digest = std::array<uint8_t, 32>;
Sha256Digest Sha256(absl::string_view data);
// Lower-case hex of the digest.
std::string Sha256Hex(absl::string_view data);

// A token is 16 to 256 printable ASCII characters without spaces; INVALID_ARGUMENT naming
// `source` (a flag, a file and line) otherwise. Never quotes the token.
absl::Status CheckTokenSyntax(absl::string_view source, absl::string_view token);

// 32 random bytes from OpenSSL's generator, as 64 hex characters.
std::string RandomSecret();

// The parsed token file. Each non-blank line that is not a comment (#) is `credential role
// name`:
//   - a bearer token (16 to 256 printable characters, no spaces), kept only as its SHA-256;
//   - `sha256:<64 hex>`, the SHA-256 of a token, so the file need not hold the token itself;
//   - `cert:<common name>`, a client certificate's subject CN (mTLS, verified against the
//     coordinator's --tls_client_ca_file).
// Immutable once parsed; safe to share between threads.
class TokenTable {
 public:
  // `source` names the file in errors ("tokens.txt:3: ...").
  static absl::StatusOr<TokenTable> Parse(absl::string_view text, absl::string_view source);
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  // The identity whose token this is. Tokens are compared by their SHA-256 digests only: a
  // lookup's timing depends on the digest, which tells nothing about the token.
  std::optional<Identity> FindToken(absl::string_view token) const;
  // The identity of the token whose SHA-256 is `digest`.
  std::optional<Identity> FindTokenDigest(const Sha256Digest& digest) const;
  std::optional<Identity> FindCertificate(absl::string_view common_name) const;

  size_t size() const { return tokens_.size() + certificates_.size(); }

 private:
  struct DigestHash {
    size_t operator()(const Sha256Digest& digest) const;
  };
  absl::flat_hash_map<Sha256Digest, Identity, DigestHash> tokens_;
  absl::flat_hash_map<std::string, Identity> certificates_;
};

}  // namespace zeroshard::security

#endif  // ZEROSHARD_SECURITY_IDENTITY_H_

#include "security/authenticator.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log_escape.h"
#include "common/status_macros.h"
#include "grpcpp/security/auth_context.h"
#include "security/metadata.h"

namespace zeroshard::security {
namespace {

// The two kinds of credential Authenticate names (see Revoked).
constexpr char kTokenCredentialPrefix[] = "token:";
constexpr char kCertificateCredentialPrefix[] = "cert:";

}  // namespace

std::string PeerHost(const std::string& peer) {
  const size_t scheme = peer.find(':');
  if (scheme == std::string::npos) return peer;
  const std::string_view prefix = std::string_view(peer).substr(0, scheme);
  if (prefix != "ipv4" && prefix != "ipv6") return peer;
  const std::string address = peer.substr(scheme + 1);
  const size_t port = address.rfind(':');
  if (port == std::string::npos || (prefix == "ipv6" && address.rfind('[', 0) != 0)) {
    return address;
  }
  return address.substr(0, port);
}

Authenticator::Authenticator(bool enabled, std::string token_file, TokenTable table)
    : enabled_(enabled),
      token_file_(std::move(token_file)),
      table_(std::make_shared<const TokenTable>(std::move(table))) {}

std::unique_ptr<Authenticator> Authenticator::Disabled() {
  return std::unique_ptr<Authenticator>(new Authenticator(false, "", TokenTable()));
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::FromTokenFile(
    std::string token_file) {
  ZS_ASSIGN_OR_RETURN(TokenTable table, TokenTable::Load(token_file));
  return std::unique_ptr<Authenticator>(
      new Authenticator(true, std::move(token_file), std::move(table)));
}

std::unique_ptr<Authenticator> Authenticator::FromTable(TokenTable table) {
  return std::unique_ptr<Authenticator>(new Authenticator(true, "", std::move(table)));
}

absl::Status Authenticator::Reload() {
  if (token_file_.empty()) {
    return absl::FailedPreconditionError("token_file: none given, nothing to reload");
  }
  ZS_ASSIGN_OR_RETURN(TokenTable table, TokenTable::Load(token_file_));
  auto loaded = std::make_shared<const TokenTable>(std::move(table));
  absl::MutexLock lock(&mu_);
  table_ = std::move(loaded);
  return absl::OkStatus();
}

size_t Authenticator::entries() const {
  absl::MutexLock lock(&mu_);
  return table_->size();
}

std::shared_ptr<const TokenTable> Authenticator::table() const {
  absl::MutexLock lock(&mu_);
  return table_;
}

absl::StatusOr<Identity> Authenticator::AuthenticateToken(absl::string_view token,
                                                          std::string* credential) const {
  if (!enabled_) {
    if (credential != nullptr) credential->clear();
    return Identity{"anonymous", Role::kAdmin};
  }
  const Sha256Digest digest = Sha256(token);
  std::optional<Identity> identity = table()->FindTokenDigest(digest);
  if (!identity.has_value()) {
    return absl::UnauthenticatedError(
        "authorization: this token is not in the coordinator's token file (or was removed from "
        "it)");
  }
  if (credential != nullptr) {
    *credential = absl::StrCat(kTokenCredentialPrefix,
                               absl::BytesToHexString(absl::string_view(
                                   reinterpret_cast<const char*>(digest.data()), digest.size())));
  }
  return *std::move(identity);
}

bool Authenticator::Revoked(const std::string& credential, const Identity& identity) const {
  if (!enabled_) return false;
  const std::shared_ptr<const TokenTable> current = table();
  std::optional<Identity> now;
  absl::string_view rest = credential;
  if (absl::ConsumePrefix(&rest, kTokenCredentialPrefix)) {
    const std::string bytes = absl::HexStringToBytes(rest);
    Sha256Digest digest;
    if (rest.size() != 2 * digest.size() || bytes.size() != digest.size()) return true;
    std::copy(bytes.begin(), bytes.end(), digest.begin());
    now = current->FindTokenDigest(digest);
  } else if (absl::ConsumePrefix(&rest, kCertificateCredentialPrefix)) {
    now = current->FindCertificate(rest);
  }
  return !now.has_value() || now->name != identity.name || now->role != identity.role;
}

absl::StatusOr<Identity> Authenticator::Authenticate(const grpc::ServerContextBase& context,
                                                     std::string* credential) const {
  if (!enabled_) {
    if (credential != nullptr) credential->clear();
    return Identity{PeerHost(context.peer()), Role::kAdmin};
  }
  const std::shared_ptr<const TokenTable> table = this->table();
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find(kAuthorizationKey); it != metadata.end()) {
    const absl::string_view value(it->second.data(), it->second.size());
    if (!absl::StartsWith(value, kBearerPrefix)) {
      return absl::UnauthenticatedError(
          "authorization: expected 'Bearer <token>' (the token is never quoted)");
    }
    return AuthenticateToken(value.substr(absl::string_view(kBearerPrefix).size()), credential);
  }
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    // gRPC's SSL transport puts the verified certificate's subject CN here.
    for (const grpc::string_ref& name : auth->FindPropertyValues("x509_common_name")) {
      const std::string common_name(name.data(), name.size());
      if (std::optional<Identity> identity = table->FindCertificate(common_name)) {
        if (credential != nullptr)
          *credential = absl::StrCat(kCertificateCredentialPrefix, common_name);
        return *std::move(identity);
      }
      return absl::UnauthenticatedError(absl::StrCat(
          "client certificate CN '", common::EscapeForLog(common_name.substr(0, 64)),
          "' is not in the coordinator's token file (add a `cert:<CN> role name` line)"));
    }
  }
  return absl::UnauthenticatedError(
      "no credentials: send 'authorization: Bearer <token>' (--token_file, or the "
      "ZEROSHARD_TOKEN environment variable) or a client certificate");
}

}  // namespace zeroshard::security

#include "security/authenticator.h"

#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log_escape.h"
#include "common/status_macros.h"
#include "grpcpp/security/auth_context.h"
#include "security/metadata.h"

namespace zeroshard::security {

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

absl::StatusOr<Identity> Authenticator::AuthenticateToken(absl::string_view token) const {
  if (!enabled_) return Identity{"anonymous", Role::kAdmin};
  std::shared_ptr<const TokenTable> table;
  {
    absl::MutexLock lock(&mu_);
    table = table_;
  }
  std::optional<Identity> identity = table->FindToken(token);
  if (!identity.has_value()) {
    return absl::UnauthenticatedError(
        "authorization: this token is not in the coordinator's token file (or was removed from "
        "it)");
  }
  return *std::move(identity);
}

absl::StatusOr<Identity> Authenticator::Authenticate(const grpc::ServerContextBase& context) const {
  if (!enabled_) return Identity{PeerHost(context.peer()), Role::kAdmin};
  std::shared_ptr<const TokenTable> table;
  {
    absl::MutexLock lock(&mu_);
    table = table_;
  }
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find(kAuthorizationKey); it != metadata.end()) {
    const absl::string_view value(it->second.data(), it->second.size());
    if (!absl::StartsWith(value, kBearerPrefix)) {
      return absl::UnauthenticatedError(
          "authorization: expected 'Bearer <token>' (the token is never quoted)");
    }
    std::optional<Identity> identity =
        table->FindToken(value.substr(absl::string_view(kBearerPrefix).size()));
    if (!identity.has_value()) {
      return absl::UnauthenticatedError(
          "authorization: this token is not in the coordinator's token file (or was removed "
          "from it)");
    }
    return *std::move(identity);
  }
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    // gRPC's SSL transport puts the verified certificate's subject CN here.
    for (const grpc::string_ref& name : auth->FindPropertyValues("x509_common_name")) {
      const std::string common_name(name.data(), name.size());
      if (std::optional<Identity> identity = table->FindCertificate(common_name)) {
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

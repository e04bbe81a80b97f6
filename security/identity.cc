#include "security/identity.h"

#include <openssl/rand.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/log_escape.h"

namespace zeroshard::security {
namespace {

constexpr size_t kMinTokenBytes = 16;
constexpr size_t kMaxTokenBytes = 256;
constexpr size_t kMaxNameBytes = 64;

bool IsNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
         c == '@';
}

std::string HexOf(const Sha256Digest& digest) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kViewer:
      return "viewer";
    case Role::kSubmitter:
      return "submitter";
    case Role::kAdmin:
      return "admin";
    case Role::kWorker:
      return "worker";
  }
  return "unknown";
}

std::optional<Role> ParseRole(absl::string_view name) {
  for (Role role : {Role::kViewer, Role::kSubmitter, Role::kAdmin, Role::kWorker}) {
    if (RoleName(role) == name) return role;
  }
  return std::nullopt;
}

Sha256Digest Sha256(absl::string_view data) {
  Sha256Digest digest;
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest.data());
  return digest;
}

std::string Sha256Hex(absl::string_view data) { return HexOf(Sha256(data)); }

absl::Status CheckTokenSyntax(absl::string_view source, absl::string_view token) {
  if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     "token: 16 to 256 printable characters without spaces (e.g. `openssl "
                     "rand -hex 32`); this one is ",
                     token.size(), " bytes"));
  }
  for (char c : token) {
    if (c <= ' ' || c >= 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, "token: holds a space or a non-printable character"));
    }
  }
  return absl::OkStatus();
}

std::string RandomSecret() {
  unsigned char bytes[32];
  // RAND_bytes fails only when the generator cannot be seeded, which leaves nothing safe to do.
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) std::abort();
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bytes), 32));
}

size_t TokenTable::DigestHash::operator()(const Sha256Digest& digest) const {
  size_t value;
  std::memcpy(&value, digest.data(), sizeof(value));
  return value;
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text, absl::string_view source) {
  TokenTable table;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat(source, ":", line_number, ": ");
    // Never quote a field of a malformed line: it may be a token.
    if (fields.size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "expected 3 fields `token role name`, found ", fields.size()));
    }
    const absl::string_view credential = fields[0];
    const std::optional<Role> role = ParseRole(fields[1]);
    if (!role.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "role '", common::EscapeForLog(fields[1].substr(0, 16)),
                       "' is not one of viewer, submitter, admin, worker"));
    }
    const absl::string_view name = fields[2];
    if (name.size() > kMaxNameBytes || !std::all_of(name.begin(), name.end(), IsNameChar)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "name: 1 to 64 characters of [A-Za-z0-9._@-], got '",
                       common::EscapeForLog(name.substr(0, 64)), "'"));
    }
    Identity identity{std::string(name), *role};
    if (absl::StartsWith(credential, "cert:")) {
      const absl::string_view common_name = credential.substr(5);
      if (common_name.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(where, "cert: names no common name"));
      }
      if (!table.certificates_.emplace(common_name, std::move(identity)).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "certificate name '", common::EscapeForLog(common_name), "' is listed twice"));
      }
      continue;
    }
    Sha256Digest digest;
    if (absl::StartsWith(credential, "sha256:")) {
      const absl::string_view hex = credential.substr(7);
      std::string bytes;
      if (hex.size() != 64 || !std::all_of(hex.begin(), hex.end(), [](char c) {
            return absl::ascii_isxdigit(static_cast<unsigned char>(c));
          })) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "sha256: needs 64 hex digits (the token's SHA-256)"));
      }
      bytes = absl::HexStringToBytes(hex);
      std::memcpy(digest.data(), bytes.data(), digest.size());
    } else {
      if (absl::Status valid = CheckTokenSyntax(where, credential); !valid.ok()) return valid;
      digest = Sha256(credential);
    }
    if (!table.tokens_.emplace(digest, std::move(identity)).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, "this token is listed twice"));
    }
  }
  return table;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("token_file: cannot read ", path, ": ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str(), path);
}

std::optional<Identity> TokenTable::FindToken(absl::string_view token) const {
  auto it = tokens_.find(Sha256(token));
  if (it == tokens_.end()) return std::nullopt;
  return it->second;
}

std::optional<Identity> TokenTable::FindTokenDigest(const Sha256Digest& digest) const {
  auto it = tokens_.find(digest);
  if (it == tokens_.end()) return std::nullopt;
  return it->second;
}

std::optional<Identity> TokenTable::FindCertificate(absl::string_view common_name) const {
  auto it = certificates_.find(common_name);
  if (it == certificates_.end()) return std::nullopt;
  return it->second;
}

}  // namespace zeroshard::security

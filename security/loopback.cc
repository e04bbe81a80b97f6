// The loopback rule for plaintext tokens: the target is parsed the way gRPC's resolvers parse it,
// and only what gRPC connects to without a DNS query counts.
#include "security/loopback.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace zeroshard::security {
namespace {

// `host` (no port, no brackets) is an IPv4 or IPv6 literal in a loopback range. inet_pton takes
// only the dotted quad and the RFC 4291 forms, as gRPC's literal parsing does: "127.1" or a
// trailing dot would go to the resolver, so they are no literal here either.
bool IsLoopbackLiteral(absl::string_view host) {
  const std::string text(host);
  in_addr v4;
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    static constexpr uint8_t kLoopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    static constexpr uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    const uint8_t* bytes = v6.s6_addr;
    if (std::equal(bytes, bytes + 16, kLoopback)) return true;
    return std::equal(bytes, bytes + 12, kMappedPrefix) && bytes[12] == 127;
  }
  return false;
}

// The host of `host:port`, `[v6]:port`, `[v6]`, `host` or a bare IPv6 address, in `*host`;
// false when the form is broken (an unclosed bracket, a port that is not decimal digits).
bool HostOf(absl::string_view address, absl::string_view* host) {
  absl::string_view port;
  bool has_port = false;
  if (absl::ConsumePrefix(&address, "[")) {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos) return false;
    *host = address.substr(0, close);
    absl::string_view rest = address.substr(close + 1);
    if (!rest.empty()) {
      if (!absl::ConsumePrefix(&rest, ":")) return false;
      port = rest;
      has_port = true;
    }
  } else {
    const size_t colon = address.find(':');
    if (colon == absl::string_view::npos ||
        address.find(':', colon + 1) != absl::string_view::npos) {
      *host = address;  // no port, or a bare IPv6 address
    } else {
      *host = address.substr(0, colon);
      port = address.substr(colon + 1);
      has_port = true;
    }
  }
  if (has_port && (port.empty() || !std::all_of(port.begin(), port.end(), absl::ascii_isdigit))) {
    return false;
  }
  return !host->empty();
}

// One address of a dns: target (or of a plain one, which gRPC resolves as dns:///address).
// `server_named`: the target's authority names the DNS server to ask, which then answers even
// `localhost`.
bool IsLoopbackDnsAddress(absl::string_view address, bool server_named) {
  absl::string_view host;
  if (!HostOf(address, &host)) return false;
  if (IsLoopbackLiteral(host)) return true;  // a literal is never looked up
  // Exactly `localhost`: the system resolver answers it from /etc/hosts. `localhost.` is
  // fully qualified, which /etc/hosts does not list, so a DNS server answers it.
  return !server_named && absl::EqualsIgnoreCase(host, "localhost");
}

}  // namespace

bool IsLoopbackTarget(absl::string_view target) {
  if (absl::StartsWith(target, "unix:") || absl::StartsWith(target, "unix-abstract:")) {
    return true;
  }
  for (absl::string_view scheme : {absl::string_view("ipv4:"), absl::string_view("ipv6:")}) {
    if (absl::ConsumePrefix(&target, scheme)) {
      // Literals only: gRPC resolves no name under these schemes.
      for (absl::string_view address : absl::StrSplit(target, ',')) {
        absl::string_view host;
        if (!HostOf(address, &host) || !IsLoopbackLiteral(host)) return false;
      }
      return true;
    }
  }
  bool server_named = false;
  if (absl::ConsumePrefix(&target, "dns:")) {
    if (absl::ConsumePrefix(&target, "//")) {  // dns://[authority]/host:port
      const size_t slash = target.find('/');
      if (slash == absl::string_view::npos) return false;
      server_named = slash > 0;
      target.remove_prefix(slash + 1);
    } else {
      absl::ConsumePrefix(&target, "/");  // dns:/host:port
    }
  }
  return IsLoopbackDnsAddress(target, server_named);
}

}  // namespace zeroshard::security

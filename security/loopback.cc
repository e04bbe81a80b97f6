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

// `host` (no port, no brackets) is a loopback address or localhost.
bool IsLoopbackHost(absl::string_view host) {
  std::string name = absl::AsciiStrToLower(host);
  if (!name.empty() && name.back() == '.') name.pop_back();
  if (name == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, name.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, name.c_str(), &v6) == 1) {
    static constexpr uint8_t kLoopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    static constexpr uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    const uint8_t* bytes = v6.s6_addr;
    if (std::equal(bytes, bytes + 16, kLoopback)) return true;
    return std::equal(bytes, bytes + 12, kMappedPrefix) && bytes[12] == 127;
  }
  return false;
}

// The host of `host:port`, `[v6]:port`, `host` or a bare IPv6 address.
absl::string_view HostOf(absl::string_view address) {
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    return close == absl::string_view::npos ? address : address.substr(1, close - 1);
  }
  const size_t colon = address.find(':');
  if (colon == absl::string_view::npos) return address;
  if (address.find(':', colon + 1) != absl::string_view::npos) return address;  // bare IPv6
  return address.substr(0, colon);
}

}  // namespace

bool IsLoopbackTarget(absl::string_view target) {
  if (absl::StartsWith(target, "unix:") || absl::StartsWith(target, "unix-abstract:")) {
    return true;
  }
  for (absl::string_view scheme : {absl::string_view("ipv4:"), absl::string_view("ipv6:")}) {
    if (absl::StartsWith(target, scheme)) {
      std::vector<absl::string_view> addresses = absl::StrSplit(target.substr(scheme.size()), ',');
      for (absl::string_view address : addresses) {
        if (!IsLoopbackHost(HostOf(address))) return false;
      }
      return true;
    }
  }
  if (absl::StartsWith(target, "dns:")) {
    target.remove_prefix(4);
    if (absl::StartsWith(target, "//")) {  // dns://authority/host:port
      const size_t slash = target.find('/', 2);
      if (slash == absl::string_view::npos) return false;
      target.remove_prefix(slash + 1);
    }
  }
  return IsLoopbackHost(HostOf(target));
}

}  // namespace zeroshard::security

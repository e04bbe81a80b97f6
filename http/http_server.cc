// libmicrohttpd behind HttpServer: one epoll thread, bounded connections, idle timeout.
#include "http/http_server.h"

#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace zeroshard::http {
namespace {

// One request's state between libmicrohttpd's calls: its body so far. Freed when the request
// completes (RequestCompleted), however it ends.
struct RequestState {
  std::string body;
  bool body_too_large = false;
};

MHD_Result CollectValue(void* into, MHD_ValueKind /*kind*/, const char* key, const char* value) {
  if (key == nullptr) return MHD_YES;
  (*static_cast<std::map<std::string, std::string>*>(into))[key] = value == nullptr ? "" : value;
  return MHD_YES;
}

MHD_Result CollectHeader(void* into, MHD_ValueKind /*kind*/, const char* key, const char* value) {
  if (key == nullptr) return MHD_YES;
  (*static_cast<std::map<std::string, std::string>*>(into))[absl::AsciiStrToLower(key)] =
      value == nullptr ? "" : value;
  return MHD_YES;
}

MHD_Result Answer(void* server, MHD_Connection* connection, const char* url, const char* method,
                  const char* /*version*/, const char* upload_data, size_t* upload_data_size,
                  void** request_state) {
  const auto* http = static_cast<const HttpServer*>(server);
  // libmicrohttpd calls once when the headers are in, then once per piece of body, then once
  // more; answering on the last call keeps a request with a body well-formed on keep-alive.
  if (*request_state == nullptr) {
    *request_state = new RequestState();
    return MHD_YES;
  }
  auto* state = static_cast<RequestState*>(*request_state);
  if (*upload_data_size != 0) {
    // Past the bound the rest is read and dropped, so memory stays bounded.
    if (!state->body_too_large) {
      if (state->body.size() + *upload_data_size > http->max_body_bytes()) {
        state->body_too_large = true;
        state->body.clear();
      } else {
        state->body.append(upload_data, *upload_data_size);
      }
    }
    *upload_data_size = 0;
    return MHD_YES;
  }
  HttpResponse answer;
  if (state->body_too_large) {
    answer = {MHD_HTTP_CONTENT_TOO_LARGE, "text/plain",
              absl::StrCat("request body: more than ", http->max_body_bytes(), " bytes\n")};
  } else {
    HttpRequest request;
    request.method = method;
    request.path = url;
    request.body = std::move(state->body);
    MHD_get_connection_values(connection, MHD_GET_ARGUMENT_KIND, &CollectValue, &request.query);
    MHD_get_connection_values(connection, MHD_HEADER_KIND, &CollectHeader, &request.headers);
    answer = http->Respond(request);
  }
  MHD_Response* response = MHD_create_response_from_buffer(
      answer.body.size(), const_cast<char*>(answer.body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  if (!answer.content_type.empty()) {
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, answer.content_type.c_str());
  }
  for (const auto& [name, value] : answer.headers) {
    MHD_add_response_header(response, name.c_str(), value.c_str());
  }
  const MHD_Result queued =
      MHD_queue_response(connection, static_cast<unsigned int>(answer.status), response);
  MHD_destroy_response(response);
  return queued;
}

void RequestCompleted(void* /*server*/, MHD_Connection* /*connection*/, void** request_state,
                      MHD_RequestTerminationCode /*code*/) {
  delete static_cast<RequestState*>(*request_state);
  *request_state = nullptr;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

absl::StatusOr<std::string> DecodeFormValue(absl::string_view encoded) {
  std::string decoded;
  decoded.reserve(encoded.size());
  for (size_t i = 0; i < encoded.size(); ++i) {
    if (encoded[i] == '+') {
      decoded.push_back(' ');
    } else if (encoded[i] == '%') {
      const int high = i + 2 < encoded.size() ? HexDigit(encoded[i + 1]) : -1;
      const int low = i + 2 < encoded.size() ? HexDigit(encoded[i + 2]) : -1;
      if (high < 0 || low < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("form: bad percent escape at byte ", i, " of a field"));
      }
      decoded.push_back(static_cast<char>(high * 16 + low));
      i += 2;
    } else {
      decoded.push_back(encoded[i]);
    }
  }
  return decoded;
}

// "[::1]" -> "::1": the bracketed form of an IPv6 host in host:port addresses.
std::string Unbracket(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

// `text` for an error message: printable ASCII only (others as '?'), at most 100 characters.
std::string Printable(absl::string_view text) {
  std::string out(text.substr(0, 100));
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  if (text.size() > 100) out += "...";
  return out;
}

bool IsNameCharacter(char c) { return absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_'; }

bool IsIpv6Character(char c) { return absl::ascii_isxdigit(c) || c == ':' || c == '.'; }

}  // namespace

absl::StatusOr<HostAndPort> ParseHostAndPort(absl::string_view text) {
  auto invalid = [text](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", Printable(text), "' is not host or host:port (", why, ")"));
  };
  absl::string_view host = text;
  absl::string_view port;
  bool has_port = false;
  bool ipv6 = false;
  if (absl::StartsWith(text, "[")) {
    const size_t close = text.find(']');
    if (close == absl::string_view::npos) return invalid("no ']' after the IPv6 address");
    host = text.substr(1, close - 1);
    absl::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (!absl::ConsumePrefix(&rest, ":")) return invalid("only ':port' may follow ']'");
      port = rest;
      has_port = true;
    }
    ipv6 = true;
  } else if (std::count(text.begin(), text.end(), ':') > 1) {
    // A bare IPv6 address; its port could not be told apart, so it has none.
    ipv6 = true;
  } else if (const size_t colon = text.find(':'); colon != absl::string_view::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    has_port = true;
  }
  if (host.empty()) return invalid("no host");
  for (const char c : host) {
    if (ipv6 ? !IsIpv6Character(c) : !IsNameCharacter(c)) {
      return invalid(ipv6 ? "an IPv6 address has only hex digits, ':' and '.'"
                          : "a host name has only letters, digits, '-', '_' and '.'");
    }
  }
  HostAndPort parsed;
  if (has_port) {
    int number = 0;
    if (port.empty() || port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
        !absl::SimpleAtoi(port, &number) || number < 1 || number > 65535) {
      return invalid("the port is a number from 1 to 65535");
    }
    parsed.port = number;
  }
  if (ipv6) {
    parsed.host = absl::StrCat("[", absl::AsciiStrToLower(host), "]");
  } else {
    absl::ConsumeSuffix(&host, ".");
    if (host.empty()) return invalid("no host");
    parsed.host = absl::AsciiStrToLower(host);
  }
  return parsed;
}

std::vector<std::string> DefaultAllowedHosts(absl::string_view listen_host) {
  std::vector<std::string> hosts;
  std::vector<HostAndPort> seen;
  for (absl::string_view candidate : {listen_host, absl::string_view("localhost"),
                                      absl::string_view("127.0.0.1"), absl::string_view("[::1]")}) {
    absl::StatusOr<HostAndPort> parsed = ParseHostAndPort(candidate);
    if (!parsed.ok() || parsed->port != 0 ||
        std::find(seen.begin(), seen.end(), *parsed) != seen.end()) {
      continue;
    }
    seen.push_back(*parsed);
    hosts.push_back(parsed->host);
  }
  return hosts;
}

absl::StatusOr<std::vector<std::string>> ParseAllowedHosts(absl::string_view value,
                                                           absl::string_view flag) {
  std::vector<std::string> hosts;
  for (absl::string_view entry : absl::StrSplit(value, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) continue;
    if (entry != "*") {
      if (absl::Status valid = ParseHostAndPort(entry).status(); !valid.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(flag, ": ", valid.message()));
      }
    }
    hosts.emplace_back(entry);
  }
  if (hosts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag,
                     ": empty; list the Host names clients use (host or host:port, comma "
                     "separated), or '*' for any Host"));
  }
  if (hosts.size() > 1 && std::find(hosts.begin(), hosts.end(), "*") != hosts.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '*' (any Host) goes alone, not with other hosts"));
  }
  return hosts;
}

std::string HttpRequest::Header(absl::string_view lower_case_name) const {
  const auto it = headers.find(std::string(lower_case_name));
  return it == headers.end() ? "" : it->second;
}

absl::StatusOr<std::map<std::string, std::string>> ParseFormBody(absl::string_view body) {
  std::map<std::string, std::string> fields;
  for (absl::string_view pair : absl::StrSplit(body, '&', absl::SkipEmpty())) {
    const size_t equals = pair.find('=');
    absl::StatusOr<std::string> name = DecodeFormValue(pair.substr(0, equals));
    if (!name.ok()) return name.status();
    absl::StatusOr<std::string> value = DecodeFormValue(
        equals == absl::string_view::npos ? absl::string_view() : pair.substr(equals + 1));
    if (!value.ok()) return value.status();
    fields[*std::move(name)] = *std::move(value);
  }
  return fields;
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options) {
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_connections: ", options.max_connections, " must be at least 1"));
  }
  if (options.idle_timeout < absl::Seconds(1) ||
      options.idle_timeout != absl::Seconds(absl::ToInt64Seconds(options.idle_timeout))) {
    return absl::InvalidArgumentError(
        absl::StrCat("idle_timeout: ", absl::FormatDuration(options.idle_timeout),
                     " must be a whole number of seconds, at least 1s"));
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port: ", options.port, " is out of range"));
  }
  const std::string host = Unbracket(options.host);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* resolved = nullptr;
  if (const int error = getaddrinfo(host.c_str(), nullptr, &hints, &resolved); error != 0) {
    return absl::UnavailableError(
        absl::StrCat("port: cannot resolve host '", host, "': ", gai_strerror(error)));
  }
  sockaddr_storage address{};
  std::memcpy(&address, resolved->ai_addr, resolved->ai_addrlen);
  freeaddrinfo(resolved);
  unsigned int flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ITC;
  const uint16_t port = htons(static_cast<uint16_t>(options.port));
  if (address.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&address)->sin6_port = port;
    flags |= MHD_USE_IPv6;
  } else {
    reinterpret_cast<sockaddr_in*>(&address)->sin_port = port;
  }

  std::vector<HostAndPort> allowed_hosts;
  if (!(options.allowed_hosts.size() == 1 && options.allowed_hosts[0] == "*")) {
    for (const std::string& entry : options.allowed_hosts) {
      absl::StatusOr<HostAndPort> parsed = ParseHostAndPort(entry);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(options.allowed_hosts_flag, ": ", parsed.status().message(),
                         entry == "*" ? "; '*' (any Host) goes alone" : ""));
      }
      allowed_hosts.push_back(*std::move(parsed));
    }
  }

  std::unique_ptr<HttpServer> server(new HttpServer());
  server->options_ = std::move(options);
  server->allowed_hosts_ = std::move(allowed_hosts);
  server->daemon_ = MHD_start_daemon(
      flags, /*port, taken from the address*/ 0, /*accept_policy*/ nullptr, nullptr, &Answer,
      server.get(), MHD_OPTION_SOCK_ADDR, &address, MHD_OPTION_CONNECTION_LIMIT,
      static_cast<unsigned int>(server->options_.max_connections), MHD_OPTION_CONNECTION_TIMEOUT,
      static_cast<unsigned int>(absl::ToInt64Seconds(server->options_.idle_timeout)),
      MHD_OPTION_NOTIFY_COMPLETED, &RequestCompleted, nullptr, MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("port: cannot listen on ", server->options_.host, ":", server->options_.port));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info == nullptr ? 0 : info->port;
  if (server->port_ == 0) {
    return absl::InternalError("port: libmicrohttpd does not report the port it listens on");
  }
  return server;
}

HttpServer::~HttpServer() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

std::optional<HttpResponse> HttpServer::RefuseHost(const HttpRequest& request) const {
  if (allowed_hosts_.empty()) return std::nullopt;
  const std::vector<std::string>& exempt = options_.any_host_paths;
  if (std::find(exempt.begin(), exempt.end(), request.path) != exempt.end()) return std::nullopt;
  const std::string host = request.Header("host");
  if (absl::StatusOr<HostAndPort> parsed = ParseHostAndPort(host); parsed.ok()) {
    for (const HostAndPort& allowed : allowed_hosts_) {
      if (allowed.host == parsed->host && (allowed.port == 0 || allowed.port == parsed->port)) {
        return std::nullopt;
      }
    }
  }
  std::vector<std::string> allowed;
  for (const HostAndPort& entry : allowed_hosts_) {
    allowed.push_back(entry.port == 0 ? entry.host : absl::StrCat(entry.host, ":", entry.port));
  }
  const std::string& flag = options_.allowed_hosts_flag;
  return HttpResponse{
      421, "text/plain",
      absl::StrCat(
          "host: ", host.empty() ? "no Host header" : absl::StrCat("'", Printable(host), "'"),
          " is not an allowed Host of this port (allowed: ", absl::StrJoin(allowed, ", "),
          "); add the name clients use to ", flag, ", or pass ", flag,
          "='*' to answer any Host as before (no protection against DNS rebinding)\n")};
}

HttpResponse HttpServer::Respond(const HttpRequest& request) const {
  if (std::optional<HttpResponse> refused = RefuseHost(request)) return *std::move(refused);
  const bool get_or_head =
      request.method == MHD_HTTP_METHOD_GET || request.method == MHD_HTTP_METHOD_HEAD;
  if (const auto handler = options_.handlers.find(request.path);
      handler != options_.handlers.end()) {
    if (!get_or_head) {
      return {MHD_HTTP_METHOD_NOT_ALLOWED,
              "text/plain",
              "method not allowed\n",
              {{MHD_HTTP_HEADER_ALLOW, "GET, HEAD"}}};
    }
    return handler->second();
  }
  const HttpRoute* match = nullptr;
  for (const HttpRoute& route : options_.routes) {
    if (!route.prefix && route.path == request.path) {
      match = &route;
      break;
    }
    if (route.prefix && absl::StartsWith(request.path, route.path) &&
        (match == nullptr || (match->prefix && route.path.size() > match->path.size()))) {
      match = &route;
    }
  }
  if (match == nullptr) return {MHD_HTTP_NOT_FOUND, "text/plain", "not found\n"};
  std::vector<std::string> allowed;
  bool allowed_method = false;
  for (const std::string& method : match->methods) {
    allowed.push_back(method);
    if (method == MHD_HTTP_METHOD_GET) allowed.push_back(MHD_HTTP_METHOD_HEAD);
    if (method == request.method || (method == MHD_HTTP_METHOD_GET && get_or_head)) {
      allowed_method = true;
    }
  }
  if (!allowed_method) {
    return {MHD_HTTP_METHOD_NOT_ALLOWED,
            "text/plain",
            "method not allowed\n",
            {{MHD_HTTP_HEADER_ALLOW, absl::StrJoin(allowed, ", ")}}};
  }
  return match->handler(request);
}

}  // namespace zeroshard::http

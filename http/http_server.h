// A small plaintext HTTP port (metrics, health probes, the dashboard): libmicrohttpd on one epoll
// thread with a connection cap and an idle timeout, so idle or slow clients hold a slot each.
#ifndef ZEROSHARD_HTTP_HTTP_SERVER_H_
#define ZEROSHARD_HTTP_HTTP_SERVER_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

struct MHD_Daemon;

namespace zeroshard::http {

struct HttpResponse {
  int status = 200;
  std::string content_type;
  std::string body;
  // Further headers in order (Set-Cookie, Location, Content-Security-Policy, Cache-Control...).
  std::vector<std::pair<std::string, std::string>> headers;
};

// What a route's handler sees of a request.
struct HttpRequest {
  std::string method;
  // Without the query string, percent-decoded by libmicrohttpd.
  std::string path;
  // Decoded query parameters; a repeated name keeps its last value.
  std::map<std::string, std::string> query;
  // Header names in lower case; a repeated header keeps its last value.
  std::map<std::string, std::string> headers;
  // At most HttpServerOptions::max_body_bytes (a longer one is answered 413 before any route).
  std::string body;

  // The header's value, or "" without it. `name` in lower case.
  std::string Header(absl::string_view lower_case_name) const;
};

// Answers GET (and HEAD) of one path. Runs on the server's only thread, so it must be quick.
using HttpHandler = std::function<HttpResponse()>;
// Answers a route's requests. Runs on the server's only thread, so it must be quick and never
// wait on the network.
using HttpRequestHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpRoute {
  // The path, or with `prefix` every path that starts with it ("/static/").
  std::string path;
  bool prefix = false;
  // Methods answered; GET implies HEAD. Others get 405 with an Allow header.
  std::vector<std::string> methods = {"GET"};
  HttpRequestHandler handler;
};

// `a=1&b=x%20y` (an application/x-www-form-urlencoded body, '+' for space) -> its fields; a
// repeated name keeps its last value. INVALID_ARGUMENT for a bad percent escape.
absl::StatusOr<std::map<std::string, std::string>> ParseFormBody(absl::string_view body);

// One entry of an allow-list of Host header values, or a Host header (or an Origin's authority)
// parsed: a name or address in lower case without a trailing dot, an IPv6 address in brackets,
// and the port, 0 when none is given.
struct HostAndPort {
  std::string host;
  int port = 0;

  bool operator==(const HostAndPort& other) const {
    return host == other.host && port == other.port;
  }
};

// "Example.COM:8080" -> {"example.com", 8080}; "::1" and "[::1]" -> {"[::1]", 0}; "[::1]:80" ->
// {"[::1]", 80}. INVALID_ARGUMENT for an empty host, a bad port or stray characters.
absl::StatusOr<HostAndPort> ParseHostAndPort(absl::string_view text);

// The allow-list a port listening on `listen_host` answers by default: that host, localhost,
// 127.0.0.1 and [::1] (duplicates removed), any port.
std::vector<std::string> DefaultAllowedHosts(absl::string_view listen_host);

// A comma list of allowed hosts (the flag's value) -> its entries, each checked: "*" alone
// means any Host; INVALID_ARGUMENT names `flag` and the bad entry. An empty value is an error
// too (say "*" to answer any Host).
absl::StatusOr<std::vector<std::string>> ParseAllowedHosts(absl::string_view value,
                                                           absl::string_view flag);

struct HttpServerOptions {
  // Host name or address to listen on; the first address it resolves to is used.
  std::string host = "127.0.0.1";
  // 0 picks a free port (see HttpServer::port()).
  int port = 0;
  // Open connections at most; further ones wait in the listen backlog until one closes.
  int max_connections = 256;
  // A connection that sends or receives nothing for this long is closed (whole seconds, >= 1s).
  absl::Duration idle_timeout = absl::Seconds(10);
  // Path (without query) -> handler of GET and HEAD. Other methods get 405.
  std::map<std::string, HttpHandler> handlers;
  // Tried after `handlers`: an exact route first, then the longest matching prefix. Paths
  // neither matches get 404.
  std::vector<HttpRoute> routes;
  // Largest request body read (a POST form); a longer one gets 413 and is never buffered whole.
  size_t max_body_bytes = 8 << 10;
  // The Host header values answered, against DNS rebinding (a page of another site whose name
  // now resolves to this address): entries `name`, `name:port`, `[v6]` or `[v6]:port`; one
  // without a port matches any port; names compare case-insensitively, a trailing dot ignored.
  // Empty, or the one entry "*": every Host is answered. Any other request, one without a Host
  // header included, gets 421 naming `allowed_hosts_flag`.
  std::vector<std::string> allowed_hosts;
  // What sets allowed_hosts (a flag, "--http_allowed_hosts"), named in its errors and refusals.
  std::string allowed_hosts_flag = "allowed_hosts";
  // Paths answered whatever the Host: probes that return no data (/healthz).
  std::vector<std::string> any_host_paths;
};

// Thread contract: Start, then port() from any thread; destruction stops the server and waits
// for a handler in progress. Handlers run one at a time on the server's thread.
class HttpServer {
 public:
  // Errors name the option at fault ("max_connections: ...", "port: cannot listen on ...").
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options);
  ~HttpServer();

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

  // Used by the libmicrohttpd callback; not part of the interface.
  HttpResponse Respond(const HttpRequest& request) const;
  size_t max_body_bytes() const { return options_.max_body_bytes; }

 private:
  HttpServer() = default;

  // The 421 answer for a request whose Host is not allowed; nullopt when it is.
  std::optional<HttpResponse> RefuseHost(const HttpRequest& request) const;

  HttpServerOptions options_;
  // options_.allowed_hosts parsed; empty: every Host is answered.
  std::vector<HostAndPort> allowed_hosts_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
};

}  // namespace zeroshard::http

#endif  // ZEROSHARD_HTTP_HTTP_SERVER_H_

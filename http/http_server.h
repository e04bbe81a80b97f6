// A small plaintext HTTP port (metrics, health probes, the dashboard): libmicrohttpd on one epoll
// thread with a connection cap and an idle timeout, so idle or slow clients hold a slot each.
#ifndef ZEROSHARD_HTTP_HTTP_SERVER_H_
#define ZEROSHARD_HTTP_HTTP_SERVER_H_

#include <functional>
#include <map>
#include <memory>
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

  HttpServerOptions options_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
};

}  // namespace zeroshard::http

#endif  // ZEROSHARD_HTTP_HTTP_SERVER_H_

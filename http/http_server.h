// A small plaintext HTTP port (metrics, health probes): libmicrohttpd on one epoll thread
// with a connection cap and an idle timeout, so idle or slow clients hold a slot each, never it.
#ifndef ZEROSHARD_HTTP_HTTP_SERVER_H_
#define ZEROSHARD_HTTP_HTTP_SERVER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

struct MHD_Daemon;

namespace zeroshard::http {

struct HttpResponse {
  int status = 200;
  std::string content_type;
  std::string body;
};

// Answers GET (and HEAD) of one path. Runs on the server's only thread, so it must be quick.
using HttpHandler = std::function<HttpResponse()>;

struct HttpServerOptions {
  // Host name or address to listen on; the first address it resolves to is used.
  std::string host = "127.0.0.1";
  // 0 picks a free port (see HttpServer::port()).
  int port = 0;
  // Open connections at most; further ones wait in the listen backlog until one closes.
  int max_connections = 256;
  // A connection that sends or receives nothing for this long is closed (whole seconds, >= 1s).
  absl::Duration idle_timeout = absl::Seconds(10);
  // Path (without query) -> handler. Other paths get 404, other methods 405.
  std::map<std::string, HttpHandler> handlers;
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
  HttpResponse Respond(const std::string& method, const std::string& path) const;

 private:
  HttpServer() = default;

  HttpServerOptions options_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
};

}  // namespace zeroshard::http

#endif  // ZEROSHARD_HTTP_HTTP_SERVER_H_

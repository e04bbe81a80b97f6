// StartHealthServer: the two probe paths on an http::HttpServer.
#include "worker/daemon/health_server.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace zeroshard::worker {

absl::StatusOr<std::unique_ptr<http::HttpServer>> StartHealthServer(HealthServerOptions options) {
  if (!options.readiness) return absl::InvalidArgumentError("readiness: no function given");
  http::HttpServerOptions http_options;
  http_options.host = options.host;
  http_options.port = options.port;
  // Probes are a few requests a second; a small cap keeps a misbehaving client from holding more.
  http_options.max_connections = 16;
  http_options.handlers["/healthz"] = [] { return http::HttpResponse{200, "text/plain", "ok\n"}; };
  http_options.handlers["/readyz"] = [readiness = std::move(options.readiness)] {
    const absl::Status status = readiness();
    if (status.ok()) return http::HttpResponse{200, "text/plain", "ready\n"};
    // One line, whatever the reason (gRPC's messages may span several).
    return http::HttpResponse{
        503, "text/plain",
        absl::StrCat(absl::StrReplaceAll(status.message(), {{"\r\n", " "}, {"\n", " "}}), "\n")};
  };
  return http::HttpServer::Start(std::move(http_options));
}

}  // namespace zeroshard::worker

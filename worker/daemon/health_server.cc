// StartHealthServer: the two probe paths on an http::HttpServer.
#include "worker/daemon/health_server.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace zeroshard::worker {
namespace {

// 200 with `ok_body`, or 503 with the status's message.
http::HttpResponse ProbeResponse(const absl::Status& status, const char* ok_body) {
  if (status.ok()) return http::HttpResponse{200, "text/plain", ok_body};
  // One line, whatever the reason (gRPC's messages may span several).
  return http::HttpResponse{
      503, "text/plain",
      absl::StrCat(absl::StrReplaceAll(status.message(), {{"\r\n", " "}, {"\n", " "}}), "\n")};
}

}  // namespace

absl::StatusOr<std::unique_ptr<http::HttpServer>> StartHealthServer(HealthServerOptions options) {
  if (!options.readiness) return absl::InvalidArgumentError("readiness: no function given");
  http::HttpServerOptions http_options;
  http_options.host = options.host;
  http_options.port = options.port;
  // Probes are a few requests a second; a small cap keeps a misbehaving client from holding more.
  http_options.max_connections = 16;
  http_options.handlers["/healthz"] = [liveness = std::move(options.liveness)] {
    return liveness ? ProbeResponse(liveness(), "ok\n")
                    : http::HttpResponse{200, "text/plain", "ok\n"};
  };
  http_options.handlers["/readyz"] = [readiness = std::move(options.readiness)] {
    return ProbeResponse(readiness(), "ready\n");
  };
  return http::HttpServer::Start(std::move(http_options));
}

}  // namespace zeroshard::worker

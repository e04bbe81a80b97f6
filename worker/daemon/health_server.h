// The worker's plaintext health port for Kubernetes probes: /healthz (liveness) and /readyz
// (readiness, from WorkerDaemon::Readiness).
#ifndef ZEROSHARD_WORKER_DAEMON_HEALTH_SERVER_H_
#define ZEROSHARD_WORKER_DAEMON_HEALTH_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "http/http_server.h"

namespace zeroshard::worker {

struct HealthServerOptions {
  std::string host = "127.0.0.1";
  // 0 picks a free port (HttpServer::port()).
  int port = 0;
  // OK: ready; otherwise its message is the one-line reason /readyz answers with 503. Called on
  // the server's thread, so it must be quick (WorkerDaemon::Readiness takes one mutex).
  std::function<absl::Status()> readiness;
  // The same for /healthz (WorkerDaemon::Liveness). Unset: always live.
  std::function<absl::Status()> liveness;
};

// /healthz answers 200 while the process serves and `liveness` holds: a worker whose coordinator
// is away keeps training, so liveness must not depend on the coordinator being reachable (kubelet
// would restart every worker during a coordinator outage); only a coordinator that has refused
// the worker for minutes makes it fail. /readyz answers 200 or 503 with the readiness reason.
// Thread contract: as http::HttpServer's.
absl::StatusOr<std::unique_ptr<http::HttpServer>> StartHealthServer(HealthServerOptions options);

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_HEALTH_SERVER_H_

// A running coordinator: the durable store, rendezvous store, job manager, the gRPC server
// (with health checking and server reflection), the HTTP port (/metrics, /healthz and the
// dashboard) and the ticker that expires leases. `zeroshard-coordinator` is a thin main around it;
// service tests run it in-process.
#ifndef ZEROSHARD_APPS_COORDINATOR_COORDINATOR_SERVER_H_
#define ZEROSHARD_APPS_COORDINATOR_COORDINATOR_SERVER_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/job_manager.h"
#include "coordinator/metrics.h"
#include "coordinator/reflection_service.h"
#include "coordinator/rendezvous_store.h"
#include "dashboard/dashboard.h"
#include "grpcpp/server.h"
#include "http/http_server.h"
#include "security/authenticator.h"
#include "security/tls_files.h"

namespace zeroshard::coordinator {

struct CoordinatorServerOptions {
  // gRPC address, host:port; port 0 picks a free port (see grpc_port()).
  std::string listen_address = "127.0.0.1:50051";
  // TLS on the gRPC port (optional mTLS); off: plaintext.
  security::ServerTlsOptions tls;
  // The `token role name` table (docs/api.md, "Identities and roles"); empty: no caller is
  // authenticated and every caller may call everything (the loopback development default),
  // unless tls.client_ca_file is set, which authenticates callers by certificate alone.
  std::string token_file;
  // /metrics HTTP port on the same host; 0 picks a free one; -1 disables it.
  int metrics_port = 0;
  // Open connections to the metrics port at most; more wait in the listen backlog.
  int metrics_max_connections = 256;
  // A metrics connection idle (nothing sent or received) this long is closed; whole seconds.
  absl::Duration metrics_idle_timeout = absl::Seconds(10);
  // The web dashboard and its JSON API on the metrics port (flag --dashboard); off: neither is
  // served (404). Needs metrics_port >= 0.
  bool dashboard = true;
  // The Host header values the metrics port answers (flag --http_allowed_hosts; entries as
  // http::HttpServerOptions::allowed_hosts, {"*"} for any Host); empty: the listen address's
  // host, localhost, 127.0.0.1 and [::1], any port. /healthz and /metrics answer any Host.
  std::vector<std::string> http_allowed_hosts;
  std::string state_dir;
  JobManagerOptions manager;
  ServiceOptions service;
  // How often the ticker expires leases and schedules.
  absl::Duration tick_period = absl::Milliseconds(100);
  // Largest gRPC message accepted, bytes.
  int max_message_bytes = 4 << 20;
  // The rendezvous store's limits (key and value sizes, keys and bytes per namespace, parked
  // Gets).
  RendezvousLimits rendezvous;
  // Server reflection's limits (open streams, requests per stream); its largest answer is
  // service.max_send_message_bytes.
  ReflectionOptions reflection;
  // HTTP/2 keepalive: the server pings a connection quiet this long (flag --grpc_keepalive_time)
  // and closes it when the ping is not answered within grpc_keepalive_timeout, which ends its
  // calls (a watcher whose host vanished is cancelled and freed).
  absl::Duration grpc_keepalive_time = absl::Minutes(1);
  absl::Duration grpc_keepalive_timeout = absl::Seconds(20);
  // A connection with no call in progress this long is closed with GOAWAY (flag
  // --grpc_max_connection_idle); clients reconnect on their next call.
  absl::Duration grpc_max_connection_idle = absl::Minutes(10);
};

// Thread contract: Start once, then the accessors from any thread; Shutdown (or the
// destructor) once.
class CoordinatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      CoordinatorServerOptions options, common::Clock* clock = common::Clock::Real());
  ~CoordinatorServer();

  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  std::string grpc_target() const;
  JobManager* manager() { return manager_.get(); }
  RendezvousStore* rendezvous() { return rendezvous_.get(); }
  CoordinatorService* service() { return service_.get(); }
  const security::Authenticator* authenticator() const { return authenticator_.get(); }
  bool tls_enabled() const { return options_.tls.enabled(); }

  // Re-reads the token file (SIGHUP), then ends the WatchJob, ExportCheckpoint and reflection
  // streams and the dashboard sessions whose tokens it revoked (removed, or given another
  // identity or role). On error the table in use stays and nothing ends; the error says why.
  absl::Status ReloadTokens();

  // Blocks until Shutdown is called from another thread (or a signal handler's helper).
  void Wait();
  void Shutdown();

 private:
  CoordinatorServer() = default;

  CoordinatorServerOptions options_;
  common::Clock* clock_ = nullptr;
  CoordinatorMetrics metrics_;
  std::unique_ptr<RendezvousStore> rendezvous_;
  std::unique_ptr<JobManager> manager_;
  std::unique_ptr<security::Authenticator> authenticator_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<ReflectionService> reflection_;
  std::unique_ptr<grpc::Server> server_;
  // Before http_, whose handlers use it, so that it goes after it. Null without the dashboard.
  std::unique_ptr<dashboard::Dashboard> dashboard_;
  std::unique_ptr<http::HttpServer> http_;
  std::thread ticker_;
  absl::Notification stopping_;
  absl::Notification stopped_;
  int grpc_port_ = 0;
  int metrics_port_ = -1;
  std::string host_;
};

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_APPS_COORDINATOR_COORDINATOR_SERVER_H_

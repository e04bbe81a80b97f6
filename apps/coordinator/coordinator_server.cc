// Wiring of the coordinator's parts into one running server.
#include "apps/coordinator/coordinator_server.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"

namespace zeroshard::coordinator {
namespace {

// gRPC channel arguments are int milliseconds; longer durations saturate.
int ToIntMilliseconds(absl::Duration duration) {
  return static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(duration), 1, std::numeric_limits<int>::max()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    CoordinatorServerOptions options, common::Clock* clock) {
  if (options.state_dir.empty()) {
    return absl::InvalidArgumentError("state_dir: required (where the job database lives)");
  }
  const size_t colon = options.listen_address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen: '", options.listen_address, "' is not host:port"));
  }
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->options_ = options;
  server->clock_ = clock;
  server->host_ = options.listen_address.substr(0, colon);
  server->rendezvous_ = std::make_unique<RendezvousStore>(clock, options.rendezvous);
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<JobStore> store, JobStore::Open(options.state_dir));
  ZS_ASSIGN_OR_RETURN(
      server->manager_,
      JobManager::Create(clock, std::move(store), server->rendezvous_.get(), options.manager));
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                      security::MakeServerCredentials(options.tls));
  if (!options.token_file.empty()) {
    ZS_ASSIGN_OR_RETURN(server->authenticator_,
                        security::Authenticator::FromTokenFile(options.token_file));
  } else if (!options.tls.client_ca_file.empty()) {
    // Certificates alone: `cert:<CN>` lines would come from a token file; without one no
    // certificate maps to a role, so a client CA without a token file is refused.
    return absl::InvalidArgumentError(
        "token_file: required with tls_client_ca_file (its `cert:<CN> role name` lines give "
        "client certificates their roles)");
  } else {
    server->authenticator_ = security::Authenticator::Disabled();
  }
  server->service_ = std::make_unique<CoordinatorService>(
      server->manager_.get(), server->rendezvous_.get(), &server->metrics_,
      server->authenticator_.get(), options.service);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, credentials, &server->grpc_port_);
  builder.RegisterService(server->service_.get());
  // Our own reflection, so it is authenticated like every other RPC (docs/api.md, "Reflection").
  ReflectionOptions reflection = options.reflection;
  // A larger answer could not be sent; it gets an error_response instead.
  reflection.max_response_bytes = options.service.max_send_message_bytes;
  server->reflection_ =
      std::make_unique<ReflectionService>(server->authenticator_.get(), reflection);
  server->reflection_->AddTo(&builder);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.service.max_send_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             ToIntMilliseconds(options.grpc_keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             ToIntMilliseconds(options.grpc_keepalive_timeout));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             ToIntMilliseconds(options.grpc_max_connection_idle));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->grpc_port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("listen: cannot serve gRPC on ", options.listen_address));
  }

  if (options.metrics_port >= 0) {
    http::HttpServerOptions http_options;
    http_options.host = server->host_;
    http_options.port = options.metrics_port;
    http_options.max_connections = options.metrics_max_connections;
    http_options.idle_timeout = options.metrics_idle_timeout;
    http_options.allowed_hosts = options.http_allowed_hosts.empty()
                                     ? http::DefaultAllowedHosts(server->host_)
                                     : options.http_allowed_hosts;
    http_options.allowed_hosts_flag = "--http_allowed_hosts";
    // Probes (a load balancer's, Kubernetes') and Prometheus ask by address; neither answer
    // holds job data or needs credentials (the counts of /metrics are anyone's who can connect).
    http_options.any_host_paths = {"/healthz", "/metrics"};
    CoordinatorServer* raw = server.get();
    http_options.handlers["/metrics"] = [raw] {
      return http::HttpResponse{200, "text/plain; version=0.0.4",
                                raw->metrics_.RenderPrometheus(raw->manager_->Stats())};
    };
    http_options.handlers["/healthz"] = [] {
      return http::HttpResponse{200, "text/plain", "ok\n"};
    };
    if (options.dashboard) {
      dashboard::DashboardOptions dashboard_options;
      dashboard_options.manager = server->manager_.get();
      dashboard_options.authenticator = server->authenticator_.get();
      dashboard_options.clock = clock;
      dashboard_options.max_reply_bytes =
          static_cast<size_t>(options.service.max_send_message_bytes);
      server->dashboard_ = std::make_unique<dashboard::Dashboard>(dashboard_options);
      http_options.routes = server->dashboard_->Routes();
    }
    absl::StatusOr<std::unique_ptr<http::HttpServer>> started =
        http::HttpServer::Start(std::move(http_options));
    if (!started.ok()) {
      // "port: ..." becomes "metrics_port: ...": the option (and flag) names. Errors of
      // --http_allowed_hosts name it already.
      if (absl::StartsWith(started.status().message(), "--")) return started.status();
      return absl::Status(started.status().code(),
                          absl::StrCat("metrics_", started.status().message()));
    }
    server->http_ = *std::move(started);
    server->metrics_port_ = server->http_->port();
  }

  server->ticker_ = std::thread([raw = server.get()] {
    while (!raw->stopping_.WaitForNotificationWithTimeout(raw->options_.tick_period)) {
      raw->manager_->Tick();
    }
  });
  ZS_LOG(INFO) << "coordinator serving gRPC on " << server->grpc_target()
               << (options.tls.enabled() ? " (TLS" : " (plaintext")
               << (server->authenticator_->enabled()
                       ? absl::StrCat(", ", server->authenticator_->entries(), " identities)")
                       : ", no authentication)")
               << ", metrics" << (server->dashboard_ != nullptr ? " and dashboard" : "")
               << " on port " << server->metrics_port_ << ", state in " << options.state_dir;
  return server;
}

absl::Status CoordinatorServer::ReloadTokens() {
  ZS_RETURN_IF_ERROR(authenticator_->Reload());
  const int64_t streams = service_->EndRevokedWatches();
  const int64_t exports = service_->EndRevokedExports();
  const int64_t reflections = reflection_->EndRevokedStreams();
  size_t sessions = 0;
  if (dashboard_ != nullptr) {
    const security::Authenticator* authenticator = authenticator_.get();
    sessions = dashboard_->sessions().RemoveRevoked(
        [authenticator](const security::Identity& identity, const std::string& credential) {
          return authenticator->Revoked(credential, identity);
        });
  }
  if (streams > 0 || exports > 0 || reflections > 0 || sessions > 0) {
    ZS_LOG(INFO) << "token reload: ended " << streams << " WatchJob streams, " << exports
                 << " ExportCheckpoint streams, " << reflections << " reflection streams and "
                 << sessions << " dashboard sessions of revoked tokens";
  }
  return absl::OkStatus();
}

std::string CoordinatorServer::grpc_target() const { return absl::StrCat(host_, ":", grpc_port_); }

void CoordinatorServer::Wait() { stopped_.WaitForNotification(); }

void CoordinatorServer::Shutdown() {
  if (stopping_.HasBeenNotified()) return;
  stopping_.Notify();
  if (ticker_.joinable()) ticker_.join();
  http_.reset();
  // Calls still in flight at the deadline (parked StoreGets, WatchJob streams) are cancelled
  // then and end with CANCELLED. The rendezvous store goes only after the server: the handlers
  // use it until the server is gone.
  server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  server_.reset();
  rendezvous_.reset();
  stopped_.Notify();
}

CoordinatorServer::~CoordinatorServer() {
  if (server_ != nullptr) Shutdown();
}

}  // namespace zeroshard::coordinator

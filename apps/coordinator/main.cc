// zeroshard-coordinator: the control plane. Serves the v1 Coordinator gRPC API (plus health
// checking and reflection) and Prometheus /metrics; keeps job state in SQLite under --state_dir.
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "apps/coordinator/coordinator_server.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "http/http_server.h"
#include "security/loopback.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC listen address host:port (port 0 picks one). Loopback by default; a non-loopback "
          "address needs TLS (--tls_cert_file, --tls_key_file) or --insecure.");
ABSL_FLAG(bool, insecure, false,
          "Serve a non-loopback --listen address without TLS (trusted networks only); a warning "
          "is logged every minute while it does.");
ABSL_FLAG(bool, insecure_bind_any, false, "Deprecated alias of --insecure.");
ABSL_FLAG(absl::Duration, insecure_warning_period, absl::Minutes(1),
          "With --insecure on a non-loopback address, the warning is logged again this often "
          "(at least 100ms; tests shorten it).");
ABSL_FLAG(std::string, tls_cert_file, "",
          "The coordinator's TLS certificate chain (PEM); with --tls_key_file turns TLS on for "
          "the gRPC port. Certificates are read at start only: restart the coordinator to "
          "rotate them (SIGHUP reloads only --token_file).");
ABSL_FLAG(std::string, tls_key_file, "", "The private key (PEM) of --tls_cert_file.");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "CA (PEM) whose client certificates are accepted (mTLS); a certificate's CN gets its "
          "role from a `cert:<CN> role name` line of --token_file. Read at start only.");
ABSL_FLAG(bool, tls_require_client_cert, false,
          "Refuse, at the TLS handshake, clients without a certificate signed by "
          "--tls_client_ca_file.");
ABSL_FLAG(std::string, token_file, "",
          "File of `token role name` lines (roles viewer, submitter, admin, worker; docs/api.md, "
          "\"Identities and roles\"). Empty: no authentication, every caller is an admin. "
          "SIGHUP reloads it.");
ABSL_FLAG(int, metrics_port, 0, "Port of the /metrics HTTP endpoint (0 picks one, -1 disables).");
ABSL_FLAG(int, metrics_max_connections, 256,
          "Open connections to the metrics port at most; further ones wait in the listen backlog "
          "until one closes.");
ABSL_FLAG(absl::Duration, metrics_idle_timeout, absl::Seconds(10),
          "A metrics-port connection that sends or receives nothing this long is closed (whole "
          "seconds, at least 1s).");
ABSL_FLAG(bool, dashboard, true,
          "Serve the web dashboard and its JSON API (/api/v1/...) on the --metrics_port HTTP port; "
          "with --token_file they need a viewer, submitter or admin token (docs/api.md).");
ABSL_FLAG(std::string, http_allowed_hosts, "",
          "Host header values the --metrics_port HTTP port answers, comma separated: host or "
          "host:port (without a port any port matches; [v6] for IPv6). Others get 421, which "
          "stops DNS-rebinding pages from reading the dashboard. Empty: the --listen host, "
          "localhost, 127.0.0.1 and [::1]. '*' answers any Host (the behaviour before this flag). "
          "/healthz and /metrics answer any Host.");
ABSL_FLAG(std::string, state_dir, "", "Directory of the durable job state (SQLite). Required.");
ABSL_FLAG(std::string, checkpoint_root, "",
          "Directory the workers write checkpoints into (the same path on every worker and "
          "here, e.g. a shared volume). The coordinator commits checkpoints by writing their "
          "manifests there and reads it to export. It must exist and be writable at start (it "
          "is not created). Empty: no checkpoints can be committed.");
ABSL_FLAG(absl::Duration, heartbeat_period, absl::Seconds(1), "Worker heartbeat period.");
ABSL_FLAG(int, missed_heartbeats, 3, "Missed heartbeat periods after which a worker is dead.");
ABSL_FLAG(absl::Duration, dead_worker_retention, absl::Minutes(10),
          "How long DEAD and LEFT workers stay listed (ListWorkers, metrics) after their lease "
          "ended, before they are forgotten (0: at the next tick); until then their name is "
          "held for them: only the holder's id and secret register it again.");
ABSL_FLAG(absl::Duration, max_backfill_wait, absl::Seconds(30),
          "How long a pending job lets later jobs start ahead of it before it reserves workers.");
ABSL_FLAG(absl::Duration, adoption_window, absl::ZeroDuration(),
          "After a restart, how long a running generation waits for its workers to re-register "
          "and be adopted before it ends (0: two leases).");
ABSL_FLAG(absl::Duration, regroup_wait, absl::ZeroDuration(),
          "After a lost worker ended a generation, how long the job's next generation waits at "
          "most for that generation's surviving workers to come back before it starts without "
          "those still missing (0: one heartbeat period).");
ABSL_FLAG(int64_t, max_events_per_job, 100000,
          "Events stored per job before old PROGRESS events are thinned: past it, every second "
          "PROGRESS event of the oldest half of the job's events is deleted (other events are "
          "always kept).");
ABSL_FLAG(int64_t, max_notices_per_generation, 100,
          "NOTICE events one job generation's workers may add (progress notices, skipped or "
          "failed checkpoints); later ones are counted in the job's dropped_notices, and a NOTICE "
          "at the generation's end says how many.");
ABSL_FLAG(int64_t, max_watch_streams, 10000,
          "WatchJob streams open at once, from all clients; one more gets RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_watch_streams_per_peer, 1000,
          "WatchJob streams open at once from one peer host (the client's IP address); one more "
          "gets RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_parked_store_gets, 10000,
          "StoreGets waiting for their key at once, over all jobs; one more that would wait gets "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_store_bytes_per_namespace, 64 << 20,
          "Bytes of keys and values one job generation's rendezvous store may hold; a StoreSet "
          "or StoreAdd past it gets RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_pending_jobs_per_submitter, 1000,
          "PENDING jobs one submitter (its identity's name; without --token_file the client's IP "
          "address) may have at once; its next SubmitJob gets RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_reflection_streams, 64,
          "Server reflection streams open at once; one more gets RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_reflection_requests_per_stream, 4096,
          "Requests one server reflection stream may send; the stream then ends with "
          "RESOURCE_EXHAUSTED (a client opens another).");
ABSL_FLAG(int, max_send_message_bytes, 4 << 20,
          "Largest reply the gRPC server sends; a bigger one gets RESOURCE_EXHAUSTED.");
ABSL_FLAG(absl::Duration, grpc_keepalive_time, absl::Minutes(1),
          "The gRPC server pings a connection that has been quiet this long (keepalive), and "
          "closes it when the ping is unanswered after --grpc_keepalive_timeout.");
ABSL_FLAG(absl::Duration, grpc_keepalive_timeout, absl::Seconds(20),
          "How long a keepalive ping may go unanswered before the connection is closed, "
          "cancelling its calls (a vanished watcher is freed).");
ABSL_FLAG(absl::Duration, grpc_max_connection_idle, absl::Minutes(10),
          "A gRPC connection with no call in progress this long is closed (GOAWAY); clients "
          "reconnect on their next call.");
ABSL_FLAG(std::string, port_file, "",
          "If set, the chosen gRPC and metrics ports are written here (\"grpc metrics\") once "
          "serving.");

namespace {

using zeroshard::coordinator::CoordinatorServer;
using zeroshard::coordinator::CoordinatorServerOptions;

// What the flags ask for, checked: every bad flag is a usage error (exit status 2).
struct ServeConfig {
  CoordinatorServerOptions options;
  // --listen is not loopback: served with TLS, or in plaintext with --insecure.
  bool exposed = false;
};

absl::Status Usage(absl::string_view message) { return absl::InvalidArgumentError(message); }

void ReadLimitFlags(CoordinatorServerOptions& options) {
  options.manager.checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  options.manager.lease.heartbeat_period = absl::GetFlag(FLAGS_heartbeat_period);
  options.manager.lease.missed_heartbeats = absl::GetFlag(FLAGS_missed_heartbeats);
  options.manager.scheduler.max_backfill_wait = absl::GetFlag(FLAGS_max_backfill_wait);
  options.manager.max_events_per_job = absl::GetFlag(FLAGS_max_events_per_job);
  options.manager.max_notices_per_generation = absl::GetFlag(FLAGS_max_notices_per_generation);
  options.manager.max_pending_jobs_per_submitter =
      absl::GetFlag(FLAGS_max_pending_jobs_per_submitter);
  options.service.max_watch_streams = absl::GetFlag(FLAGS_max_watch_streams);
  options.service.max_watch_streams_per_peer = absl::GetFlag(FLAGS_max_watch_streams_per_peer);
  options.service.max_send_message_bytes = absl::GetFlag(FLAGS_max_send_message_bytes);
  options.reflection.max_open_streams = absl::GetFlag(FLAGS_max_reflection_streams);
  options.reflection.max_requests_per_stream =
      absl::GetFlag(FLAGS_max_reflection_requests_per_stream);
  options.rendezvous.max_parked_gets = absl::GetFlag(FLAGS_max_parked_store_gets);
  options.rendezvous.max_bytes_per_namespace = absl::GetFlag(FLAGS_max_store_bytes_per_namespace);
  options.grpc_keepalive_time = absl::GetFlag(FLAGS_grpc_keepalive_time);
  options.grpc_keepalive_timeout = absl::GetFlag(FLAGS_grpc_keepalive_timeout);
  options.grpc_max_connection_idle = absl::GetFlag(FLAGS_grpc_max_connection_idle);
  options.manager.forget_gone_workers_after = absl::GetFlag(FLAGS_dead_worker_retention);
}

absl::Status CheckLimitFlags(CoordinatorServerOptions& options) {
  if (options.manager.forget_gone_workers_after < absl::ZeroDuration()) {
    return Usage("--dead_worker_retention must not be negative");
  }
  if (const absl::Duration window = absl::GetFlag(FLAGS_adoption_window);
      window > absl::ZeroDuration()) {
    options.manager.adoption_window = window;
  } else if (window < absl::ZeroDuration()) {
    return Usage("--adoption_window must not be negative");
  }
  if (const absl::Duration wait = absl::GetFlag(FLAGS_regroup_wait); wait > absl::ZeroDuration()) {
    options.manager.regroup_wait = wait;
  } else if (wait < absl::ZeroDuration()) {
    return Usage("--regroup_wait must not be negative");
  }
  if (options.manager.max_events_per_job < 1) {
    return Usage("--max_events_per_job must be >= 1");
  }
  if (options.manager.max_notices_per_generation < 1) {
    return Usage("--max_notices_per_generation must be >= 1");
  }
  if (options.service.max_watch_streams < 1 || options.service.max_watch_streams_per_peer < 1 ||
      options.rendezvous.max_parked_gets < 1 || options.rendezvous.max_bytes_per_namespace < 1 ||
      options.manager.max_pending_jobs_per_submitter < 1 ||
      options.service.max_send_message_bytes < 1 || options.reflection.max_open_streams < 1 ||
      options.reflection.max_requests_per_stream < 1) {
    return Usage(
        "--max_watch_streams, --max_watch_streams_per_peer, --max_parked_store_gets, "
        "--max_store_bytes_per_namespace, --max_pending_jobs_per_submitter, "
        "--max_send_message_bytes, --max_reflection_streams and "
        "--max_reflection_requests_per_stream must be >= 1");
  }
  if (options.grpc_keepalive_time < absl::Seconds(1) ||
      options.grpc_keepalive_timeout < absl::Seconds(1) ||
      options.grpc_max_connection_idle < absl::Seconds(1)) {
    return Usage(
        "--grpc_keepalive_time, --grpc_keepalive_timeout and --grpc_max_connection_idle must be "
        ">= 1s");
  }
  if (options.manager.lease.heartbeat_period < absl::Milliseconds(10) ||
      options.manager.lease.missed_heartbeats < 1) {
    return Usage("--heartbeat_period must be >= 10ms and --missed_heartbeats >= 1");
  }
  return absl::OkStatus();
}

// --checkpoint_root, when set, is a directory this process can write into: the coordinator writes
// every checkpoint's manifest there, so a root that is missing (a typo, a volume not mounted) or
// read-only would otherwise show only as every checkpoint failing to commit. It is not created:
// the workers must find the same directory, and a wrong path should not become a new one.
absl::Status CheckCheckpointRoot(const std::string& root) {
  if (root.empty()) return absl::OkStatus();
  struct stat info;
  if (::stat(root.c_str(), &info) != 0) {
    const int error = errno;
    return Usage(absl::StrCat("--checkpoint_root=", root, ": ",
                              error == ENOENT ? "the directory does not exist"
                                              : absl::StrCat("cannot stat it: ", strerror(error)),
                              "; create it (the directory every worker's --checkpoint_root names) "
                              "or leave the flag out to run without checkpoints"));
  }
  if (!S_ISDIR(info.st_mode)) {
    return Usage(absl::StrCat("--checkpoint_root=", root, ": not a directory"));
  }
  if (::access(root.c_str(), W_OK | X_OK) != 0) {
    return Usage(absl::StrCat("--checkpoint_root=", root,
                              ": this process cannot write into it: ", strerror(errno)));
  }
  return absl::OkStatus();
}

// TLS and tokens; `exposed` serving needs TLS or --insecure.
absl::Status ReadSecurityFlags(ServeConfig& config) {
  CoordinatorServerOptions& options = config.options;
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key_file);
  options.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  options.tls.require_client_cert = absl::GetFlag(FLAGS_tls_require_client_cert);
  options.token_file = absl::GetFlag(FLAGS_token_file);
  if (options.tls.cert_file.empty() != options.tls.key_file.empty()) {
    return Usage("--tls_cert_file and --tls_key_file go together");
  }
  if (!options.tls.enabled() &&
      (!options.tls.client_ca_file.empty() || options.tls.require_client_cert)) {
    return Usage(
        "--tls_client_ca_file and --tls_require_client_cert need --tls_cert_file and "
        "--tls_key_file");
  }
  if (options.tls.require_client_cert && options.tls.client_ca_file.empty()) {
    return Usage("--tls_require_client_cert needs --tls_client_ca_file");
  }
  bool insecure = absl::GetFlag(FLAGS_insecure);
  if (absl::GetFlag(FLAGS_insecure_bind_any)) {
    ZS_LOG(WARNING) << "--insecure_bind_any is deprecated; use --insecure";
    insecure = true;
  }
  // The same rule as the clients' for sending a token in plaintext (security/loopback.h).
  config.exposed = !zeroshard::security::IsLoopbackTarget(options.listen_address);
  if (config.exposed && !options.tls.enabled() && !insecure) {
    return Usage(absl::StrCat("--listen=", options.listen_address, " is not loopback (",
                              zeroshard::security::kLoopbackRule,
                              "); serve it with TLS (--tls_cert_file, --tls_key_file), or pass "
                              "--insecure to serve it in plaintext"));
  }
  if (config.exposed && options.tls.enabled() && options.token_file.empty()) {
    ZS_LOG(WARNING) << "--listen=" << options.listen_address
                    << " serves TLS without --token_file: anyone who can connect is an admin";
  }
  return absl::OkStatus();
}

absl::StatusOr<ServeConfig> ConfigFromFlags() {
  ServeConfig config;
  CoordinatorServerOptions& options = config.options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.metrics_max_connections = absl::GetFlag(FLAGS_metrics_max_connections);
  options.metrics_idle_timeout = absl::GetFlag(FLAGS_metrics_idle_timeout);
  options.dashboard = absl::GetFlag(FLAGS_dashboard);
  if (const std::string hosts = absl::GetFlag(FLAGS_http_allowed_hosts); !hosts.empty()) {
    absl::StatusOr<std::vector<std::string>> parsed =
        zeroshard::http::ParseAllowedHosts(hosts, "--http_allowed_hosts");
    if (!parsed.ok()) return Usage(parsed.status().message());
    options.http_allowed_hosts = *std::move(parsed);
  }
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  ReadLimitFlags(options);
  ZS_RETURN_IF_ERROR(CheckLimitFlags(options));
  ZS_RETURN_IF_ERROR(CheckCheckpointRoot(options.manager.checkpoint_root));
  ZS_RETURN_IF_ERROR(ReadSecurityFlags(config));
  return config;
}

// Whoever waits for the file would wait forever: a failure to write it is fatal.
absl::Status WritePortFile(const std::string& port_file, const CoordinatorServer& server) {
  const std::string tmp = port_file + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  const bool written =
      f != nullptr && std::fprintf(f, "%d %d\n", server.grpc_port(), server.metrics_port()) > 0;
  const bool closed = f != nullptr && std::fclose(f) == 0;
  if (!written || !closed || std::rename(tmp.c_str(), port_file.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("--port_file=", port_file, ": cannot write it"));
  }
  return absl::OkStatus();
}

// Serves until SIGINT or SIGTERM (`signals` blocked in every thread); SIGHUP reloads the tokens.
// Returns the signal that ended it.
int ServeUntilSignalled(const ServeConfig& config, CoordinatorServer& server,
                        const sigset_t& signals) {
  absl::Notification stopping;
  std::thread insecure_warning;
  if (config.exposed && !config.options.tls.enabled()) {
    const absl::Duration period =
        std::max(absl::Milliseconds(100), absl::GetFlag(FLAGS_insecure_warning_period));
    insecure_warning = std::thread([&stopping, period, address = server.grpc_target()] {
      do {
        ZS_LOG(WARNING) << "serving plaintext gRPC on non-loopback " << address
                        << " (--insecure): tokens and data cross the network unencrypted";
      } while (!stopping.WaitForNotificationWithTimeout(period));
    });
  }
  int signal = 0;
  while (true) {
    sigwait(&signals, &signal);
    if (signal != SIGHUP) break;
    if (config.options.token_file.empty()) {
      ZS_LOG(WARNING) << "SIGHUP: no --token_file to reload (certificates reload only on restart)";
      continue;
    }
    if (const absl::Status reloaded = server.ReloadTokens(); reloaded.ok()) {
      ZS_LOG(INFO) << "token file reloaded: " << server.authenticator()->entries() << " identities";
    } else {
      ZS_LOG(ERROR) << "token file not reloaded, the previous table stays in use: " << reloaded;
    }
  }
  stopping.Notify();
  if (insecure_warning.joinable()) insecure_warning.join();
  return signal;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("zeroshard-coordinator --state_dir=DIR [--listen=HOST:PORT]");
  absl::ParseCommandLine(argc, argv);
  // Debian's abseil checks every Mutex acquisition for lock-order cycles (a lookup in a global
  // graph per lock, about 5% of the CPU under heartbeat load); the tests keep that check, the
  // serving binary skips it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::StatusOr<ServeConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    ZS_LOG(ERROR) << config.status().message();
    return 2;
  }
  // SIGINT, SIGTERM and SIGHUP are blocked in every thread (threads inherit the mask, so block
  // them before any starts) and taken synchronously with sigwait: no handler runs, so nothing
  // has to be async-signal-safe.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto server = CoordinatorServer::Start(config->options);
  if (!server.ok()) {
    ZS_LOG(ERROR) << "cannot start: " << server.status();
    return 1;
  }
  if (const std::string port_file = absl::GetFlag(FLAGS_port_file); !port_file.empty()) {
    if (const absl::Status written = WritePortFile(port_file, **server); !written.ok()) {
      ZS_LOG(ERROR) << written.message();
      (*server)->Shutdown();
      return 1;
    }
  }
  const int signal = ServeUntilSignalled(*config, **server, signals);
  ZS_LOG(INFO) << "shutting down (signal " << signal << ")";
  (*server)->Shutdown();
  return 0;
}

// zeroshard-worker: a worker daemon owning one device. Registers with the coordinator, runs the
// generations it is assigned (Gloo + CPU kernels on `--device=cpu`; NCCL + CUDA kernels on
// `--device=cuda:N` in a build with --config=cuda), and leaves on SIGTERM.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "grpcpp/create_channel.h"
#include "security/coordinator_channel.h"
#include "worker/attach/attach_listener.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/daemon/cuda_support.h"
#include "worker/daemon/engine_training_run.h"
#include "worker/daemon/health_server.h"
#include "worker/daemon/thread_placement.h"
#include "worker/daemon/worker_daemon.h"
#include "worker/engine/engine.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:50051", "Coordinator address host:port.");
ABSL_FLAG(std::string, ca, "",
          "PEM file of the CA that signed the coordinator's certificate: connect with TLS. Empty: "
          "plaintext.");
ABSL_FLAG(std::string, cert, "",
          "PEM client certificate for mTLS (with --key and --ca); the coordinator's token file "
          "maps its CN to the worker role (cert:<CN> worker NAME).");
ABSL_FLAG(std::string, key, "", "PEM private key of --cert.");
ABSL_FLAG(std::string, token_file, "",
          "File whose first line is this worker's token (default: $ZEROSHARD_TOKEN, if set).");
ABSL_FLAG(bool, insecure, false,
          "Send the token even without TLS (no --ca) to a --coordinator that is not loopback "
          "(trusted networks only; also $ZEROSHARD_INSECURE=1). Without it such a token is "
          "refused.");
ABSL_FLAG(std::string, device, "cpu",
          "The device this worker owns: cpu, or cuda:N (CUDA device N; needs a build with "
          "--config=cuda).");
ABSL_FLAG(std::string, name, "", "Worker name ([a-z0-9-], default worker-<pid>).");
ABSL_FLAG(std::string, host, "", "Host name reported to the coordinator (default: hostname).");
ABSL_FLAG(std::string, identity_file, "",
          "File (mode 0600, created if missing) in which the daemon keeps the id and secret of its "
          "latest registration, so that after a restart it proves it is the worker that held "
          "--name and gets the name back at once; a name is held by proof, and without it a "
          "restarted daemon waits until its previous registration has been gone for the "
          "coordinator's --dead_worker_retention. Put it on storage that outlives the process "
          "(e.g. an emptyDir). Empty: none.");
ABSL_FLAG(std::string, listen_host, "127.0.0.1",
          "Address peers reach this worker's collectives at.");
ABSL_FLAG(int, health_port, -1,
          "Plaintext HTTP port for Kubernetes probes: /healthz (200 while the daemon runs, 503 "
          "once the coordinator has refused it a registration for --unregistered_unhealthy_after) "
          "and /readyz (200 while registered with the coordinator and its latest heartbeat "
          "succeeded, else 503 with the reason). -1: off; 0: a free port.");
ABSL_FLAG(absl::Duration, unregistered_unhealthy_after, absl::Minutes(5),
          "/healthz turns 503 once the coordinator has refused this worker a registration "
          "(heartbeats or registrations refused) this long without a break; an unreachable "
          "coordinator does not count.");
ABSL_FLAG(std::string, health_host, "",
          "Address the health port listens on (default: --listen_host).");
ABSL_FLAG(std::string, labels, "", "Labels, comma-separated key=value pairs.");
ABSL_FLAG(absl::Duration, heartbeat_period, absl::Seconds(1),
          "Heartbeat period until the coordinator's registration reply sets it.");
ABSL_FLAG(int, threads, 1, "Threads of the optimizer kernels.");
ABSL_FLAG(std::string, attach_socket, "",
          "Unix socket (absolute path) on which attached PyTorch trainers connect to this worker "
          "(docs/pytorch.md); empty: attached jobs cannot run here.");
ABSL_FLAG(std::string, attach_group, "",
          "A group (name or number) whose processes may attach too: the attach socket is then "
          "mode 0660 and owned by it. Default: only this worker's user (mode 0600), checked "
          "with SO_PEERCRED on every connection.");
ABSL_FLAG(absl::Duration, attach_timeout, absl::Minutes(2),
          "How long an attached run waits for its trainer to connect and say hello; then the "
          "run fails and the job follows its fault policy.");
ABSL_FLAG(std::string, checkpoint_root, "",
          "Directory checkpoints are written to and resumed from: the coordinator's "
          "--checkpoint_root, the same path on every worker (e.g. a shared volume). Empty: no "
          "checkpoints, and jobs cannot resume after a lost worker.");
// Tuning of the gradient reduction on a CPU worker (docs/performance/reduce_scatter.md); the
// defaults are the measured best on the machine of those figures.
ABSL_FLAG(int, bucket_pool_size, zeroshard::engine::EngineConfig().bucket_pool_size,
          "Reduce buffers zero2 keeps in flight (each one bucket).");
ABSL_FLAG(int64_t, memory_limit_bytes, 0,
          "The most bytes this worker's engine may hold at once (its counting allocator: "
          "parameters, gradients, master weights, optimizer state, bucket and gather buffers, "
          "scratch). An allocation past it fails the run with RESOURCE_EXHAUSTED naming the "
          "figures; the coordinator refuses, at submission, a job whose mode needs more per rank "
          "than the smallest limit among the idle workers. 0: no limit. At most 2^50.");
ABSL_FLAG(int64_t, gloo_segment_bytes, zeroshard::comm::GlooCommunicatorOptions().segment_bytes,
          "Pipeline segment of the Gloo rings, bytes.");
ABSL_FLAG(int, gloo_staging_segments, zeroshard::comm::GlooCommunicatorOptions().staging_segments,
          "Segments the Gloo reduce-scatter receives into ahead.");
ABSL_FLAG(int, gloo_lanes, zeroshard::comm::GlooCommunicatorOptions().lanes,
          "Gloo transport lanes (full meshes, each with its event-loop thread), 1 to 8.");
ABSL_FLAG(
    std::string, transport, "auto",
    "What the CPU rings' messages travel on: tcp (Gloo), shm (shared memory; the run fails "
    "unless all its ranks share this host) or auto (shared memory between the ranks that name "
    "the same --host and prove it by mapping their host leader's sealed memfd, else tcp).");
ABSL_FLAG(std::string, thread_pinning, "none",
          "none, training (rank r's training thread on the r-th CPU, mod their count), shared "
          "(its communication thread on that CPU too) or spread (the communication thread on the "
          "next rank's CPU). A host's ranks are contiguous, so its workers get a CPU each while "
          "there are no more of them than CPUs.");
ABSL_FLAG(std::optional<int>, comm_thread_nice, std::nullopt,
          "Nice value of the communication thread (default: inherited).");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("zeroshard-worker --coordinator=HOST:PORT [--device=cpu]");
  absl::ParseCommandLine(argc, argv);
  // Signals are taken by a dedicated thread (sigwait), so every other thread blocks them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // Gloo writes to its TCP pairs with writev: a peer that died (kill -9) must surface as a
  // collective error (EPIPE, then Status), not as a SIGPIPE that kills this worker too.
  signal(SIGPIPE, SIG_IGN);
  // A checkpoint past the file-size limit (RLIMIT_FSIZE) must fail that checkpoint with EFBIG
  // ("File too large": a FAILED commit, the job goes on), not kill the worker with SIGXFSZ.
  signal(SIGXFSZ, SIG_IGN);

  using zeroshard::worker::WorkerDaemonOptions;
  WorkerDaemonOptions options;
  const std::string device = absl::GetFlag(FLAGS_device);
  int cuda_device = -1;
  if (device == "cpu") {
    options.device_kind = zeroshard::v1::CPU;
  } else {
    absl::string_view ordinal = device;
    if (!absl::ConsumePrefix(&ordinal, "cuda:") || !absl::SimpleAtoi(ordinal, &cuda_device) ||
        cuda_device < 0) {
      ZS_LOG(ERROR) << "--device=" << device << ": expected cpu or cuda:N (N >= 0)";
      return 2;
    }
    absl::StatusOr<zeroshard::worker::CudaDeviceInfo> info =
        zeroshard::worker::SelectCudaDevice(cuda_device);
    if (!info.ok()) {
      ZS_LOG(ERROR) << "--device=" << device << ": " << info.status();
      return 2;
    }
    ZS_LOG(INFO) << "device " << device << ": " << info->name << ", " << info->memory_bytes
                 << " bytes";
    options.device_kind = zeroshard::v1::CUDA;
    options.device_memory_bytes = info->memory_bytes;
  }
  options.name = absl::GetFlag(FLAGS_name);
  if (options.name.empty()) options.name = absl::StrCat("worker-", getpid());
  options.host = absl::GetFlag(FLAGS_host);
  if (options.host.empty()) {
    char hostname[256] = {};
    gethostname(hostname, sizeof(hostname) - 1);
    options.host = hostname;
  }
  for (absl::string_view pair :
       absl::StrSplit(absl::GetFlag(FLAGS_labels), ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(pair, absl::MaxSplits('=', 1));
    options.labels[kv.first] = kv.second;
  }
  options.heartbeat_period = absl::GetFlag(FLAGS_heartbeat_period);
  options.identity_file = absl::GetFlag(FLAGS_identity_file);
  options.unregistered_unhealthy_after = absl::GetFlag(FLAGS_unregistered_unhealthy_after);
  std::unique_ptr<zeroshard::attach::AttachListener> attach_listener;
  if (!absl::GetFlag(FLAGS_attach_socket).empty()) {
    absl::StatusOr<std::unique_ptr<zeroshard::attach::AttachListener>> listener =
        zeroshard::attach::AttachListener::Create(absl::GetFlag(FLAGS_attach_socket),
                                                  absl::GetFlag(FLAGS_attach_group));
    if (!listener.ok()) {
      ZS_LOG(ERROR) << "--" << listener.status().message();
      return 2;
    }
    attach_listener = *std::move(listener);
    options.attach_socket = attach_listener->path();
  }
  if (absl::GetFlag(FLAGS_attach_timeout) <= absl::ZeroDuration()) {
    ZS_LOG(ERROR) << "--attach_timeout must be positive";
    return 2;
  }
  if (absl::GetFlag(FLAGS_threads) < 1) {
    ZS_LOG(ERROR) << "--threads must be at least 1";
    return 2;
  }
  if (absl::GetFlag(FLAGS_bucket_pool_size) < 1) {
    ZS_LOG(ERROR) << "--bucket_pool_size must be at least 1";
    return 2;
  }
  // The allocator checks the same range (CountingAllocator::SetLimit); checked here so that a
  // bad value stops the worker at start, not its first run.
  const int64_t memory_limit_bytes = absl::GetFlag(FLAGS_memory_limit_bytes);
  if (memory_limit_bytes < 0 || memory_limit_bytes > zeroshard::engine::kMaxMemoryLimitBytes) {
    ZS_LOG(ERROR) << "--memory_limit_bytes=" << memory_limit_bytes << ": must be in [0, "
                  << zeroshard::engine::kMaxMemoryLimitBytes << "] (0: no limit)";
    return 2;
  }
  options.memory_limit_bytes = memory_limit_bytes;
  absl::StatusOr<zeroshard::worker::ThreadPinning> pinning =
      zeroshard::worker::ParseThreadPinning(absl::GetFlag(FLAGS_thread_pinning));
  if (!pinning.ok()) {
    ZS_LOG(ERROR) << "--" << pinning.status().message();
    return 2;
  }
  // The communicator checks the rest when a run creates it; a bad value fails there.
  zeroshard::comm::GlooCommunicatorOptions gloo;
  gloo.segment_bytes =
      static_cast<size_t>(std::max<int64_t>(0, absl::GetFlag(FLAGS_gloo_segment_bytes)));
  gloo.staging_segments = absl::GetFlag(FLAGS_gloo_staging_segments);
  gloo.lanes = absl::GetFlag(FLAGS_gloo_lanes);
  gloo.thread_nice = absl::GetFlag(FLAGS_comm_thread_nice);
  absl::StatusOr<zeroshard::comm::Transport> transport =
      zeroshard::comm::ParseTransport(absl::GetFlag(FLAGS_transport));
  if (!transport.ok()) {
    ZS_LOG(ERROR) << "--" << transport.status().message();
    return 2;
  }
  gloo.transport = *transport;
  // Same host is judged by the name this daemon reports (--host, else the hostname) and then
  // proven in shared memory (comm/shm_link.h).
  gloo.host = options.host;

  // Reconnect at least every second while the coordinator is away (gRPC's backoff would grow
  // to minutes), so a worker started first, or outliving a coordinator restart, rejoins promptly.
  grpc::ChannelArguments channel_args;
  channel_args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  channel_args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  channel_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  absl::StatusOr<zeroshard::security::ClientCredentials> credentials =
      zeroshard::security::ClientCredentialsFromFlags(
          absl::GetFlag(FLAGS_ca), absl::GetFlag(FLAGS_cert), absl::GetFlag(FLAGS_key),
          absl::GetFlag(FLAGS_token_file));
  if (!credentials.ok()) {
    ZS_LOG(ERROR) << credentials.status().message();
    return 2;
  }
  credentials->insecure |= absl::GetFlag(FLAGS_insecure);
  // One secret per daemon: heartbeats, progress reports, checkpoint commits and the rendezvous
  // store all use this one channel, so all of them present the current registration's secret.
  options.worker_secret = std::make_shared<zeroshard::security::WorkerSecret>();
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      zeroshard::security::CreateCoordinatorChannel(absl::GetFlag(FLAGS_coordinator), *credentials,
                                                    channel_args, options.worker_secret);
  if (!channel.ok()) {
    ZS_LOG(ERROR) << channel.status().message();
    return 2;
  }
  std::shared_ptr<zeroshard::v1::Coordinator::StubInterface> stub =
      zeroshard::v1::Coordinator::NewStub(*std::move(channel));
  zeroshard::worker::WorkerDaemon* daemon_ptr = nullptr;
  zeroshard::worker::WorkerDaemon daemon(
      options, stub, [&](const zeroshard::v1::Assignment& assignment) {
        zeroshard::worker::EngineTrainingRunOptions run_options;
        run_options.stub = stub;
        run_options.worker_id = daemon_ptr->worker_id();
        run_options.worker_name = options.name;
        run_options.listen_host = absl::GetFlag(FLAGS_listen_host);
        run_options.threads = absl::GetFlag(FLAGS_threads);
        run_options.cuda_device = cuda_device;
        run_options.checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
        run_options.bucket_pool_size = absl::GetFlag(FLAGS_bucket_pool_size);
        run_options.memory_limit_bytes = memory_limit_bytes;
        run_options.gloo = gloo;
        run_options.pinning = *pinning;
        run_options.attach_listen_fd = attach_listener != nullptr ? attach_listener->fd() : -1;
        if (attach_listener != nullptr) run_options.attach_peers = attach_listener->peers();
        run_options.attach_timeout = absl::GetFlag(FLAGS_attach_timeout);
        return zeroshard::worker::EngineTrainingRun::Start(assignment, std::move(run_options));
      });
  daemon_ptr = &daemon;
  std::unique_ptr<zeroshard::http::HttpServer> health_server;
  if (absl::GetFlag(FLAGS_health_port) >= 0) {
    zeroshard::worker::HealthServerOptions health;
    health.host = absl::GetFlag(FLAGS_health_host);
    if (health.host.empty()) health.host = absl::GetFlag(FLAGS_listen_host);
    health.port = absl::GetFlag(FLAGS_health_port);
    health.readiness = [&daemon] { return daemon.Readiness(); };
    health.liveness = [&daemon] { return daemon.Liveness(); };
    absl::StatusOr<std::unique_ptr<zeroshard::http::HttpServer>> started =
        zeroshard::worker::StartHealthServer(std::move(health));
    if (!started.ok()) {
      // "port: ..." becomes "health_port: ...": the flag's name.
      ZS_LOG(ERROR) << "--health_" << started.status().message();
      return 2;
    }
    health_server = *std::move(started);
    ZS_LOG(INFO) << "health port " << health_server->port() << " (/healthz, /readyz)";
  }
  std::thread signal_thread([&] {
    int signal = 0;
    sigwait(&signals, &signal);
    ZS_LOG(INFO) << "signal " << signal << ": stopping";
    daemon.Stop();
  });
  const absl::Status status = daemon.Run();
  // Wake the signal thread if Run ended on its own (e.g. bad flags).
  if (!status.ok()) kill(getpid(), SIGTERM);
  signal_thread.join();
  if (!status.ok()) {
    ZS_LOG(ERROR) << "worker stopped: " << status;
    return 1;
  }
  return 0;
}

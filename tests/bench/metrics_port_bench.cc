// Metrics port benchmark: answer times of /healthz and /metrics on an in-process coordinator,
// first with nothing else connected, then while idle connections and slow clients (one byte of
// a request every 1-2 s) are held open against the port, then with them closed again. Prints
// one JSON object per phase and path.
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "apps/coordinator/coordinator_server.h"
#include "http/http_test_client.h"

ABSL_FLAG(int, idle, 64, "Idle connections held open during the loaded phase.");
ABSL_FLAG(int, slow, 64, "Slow clients (one byte every 1-2 s) during the loaded phase.");
ABSL_FLAG(int, probes, 200, "Requests per path and phase.");
ABSL_FLAG(absl::Duration, probe_interval, absl::Milliseconds(10), "Pause between probe pairs.");

namespace zeroshard::bench {
namespace {

using http::testing::HttpReply;

struct PathTimes {
  std::vector<double> latencies_ms;
  int errors = 0;
};

double Quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<size_t>(q * values.size()))];
}

// Alternates GET /healthz and GET /metrics `probes` times each.
void Probe(int port, const char* phase, int idle, int slow) {
  const char* paths[] = {"/healthz", "/metrics"};
  PathTimes times[2];
  const int probes = absl::GetFlag(FLAGS_probes);
  for (int i = 0; i < probes; ++i) {
    for (int p = 0; p < 2; ++p) {
      const absl::Time start = absl::Now();
      absl::StatusOr<HttpReply> reply =
          http::testing::Get(port, paths[p], start + absl::Seconds(10));
      if (reply.ok() && reply->status == 200) {
        times[p].latencies_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
      } else {
        ++times[p].errors;
      }
    }
    absl::SleepFor(absl::GetFlag(FLAGS_probe_interval));
  }
  for (int p = 0; p < 2; ++p) {
    std::printf(
        "{\"bench\":\"metrics_port\",\"phase\":\"%s\",\"path\":\"%s\",\"idle\":%d,\"slow\":%d,"
        "\"probes\":%d,\"errors\":%d,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f}\n",
        phase, paths[p], idle, slow, probes, times[p].errors, Quantile(times[p].latencies_ms, 0.5),
        Quantile(times[p].latencies_ms, 0.99), Quantile(times[p].latencies_ms, 1.0));
    std::fflush(stdout);
  }
}

int Run() {
  char state_template[] = "/tmp/zs-metrics-port-bench-XXXXXX";
  const char* state_dir = mkdtemp(state_template);
  if (state_dir == nullptr) {
    std::perror("metrics_port_bench: mkdtemp");
    return 1;
  }
  coordinator::CoordinatorServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_port = 0;
  options.state_dir = state_dir;
  absl::StatusOr<std::unique_ptr<coordinator::CoordinatorServer>> server =
      coordinator::CoordinatorServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "metrics_port_bench: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const int port = (*server)->metrics_port();
  const int idle_count = absl::GetFlag(FLAGS_idle);
  const int slow_count = absl::GetFlag(FLAGS_slow);

  Probe(port, "quiet", 0, 0);
  {
    std::vector<http::testing::RawConnection> idle;
    for (int i = 0; i < idle_count; ++i) {
      absl::StatusOr<http::testing::RawConnection> connection =
          http::testing::RawConnection::Open(port);
      if (!connection.ok()) {
        std::fprintf(stderr, "metrics_port_bench: %s\n", connection.status().ToString().c_str());
        return 1;
      }
      idle.push_back(*std::move(connection));
    }
    absl::StatusOr<std::unique_ptr<http::testing::SlowClients>> slow =
        http::testing::SlowClients::Open(port, slow_count);
    if (!slow.ok() ||
        !(*slow)->WaitForBytes(2 * int64_t{slow_count}, absl::Now() + absl::Seconds(30))) {
      std::fprintf(stderr, "metrics_port_bench: the slow clients did not start\n");
      return 1;
    }
    Probe(port, "loaded", idle_count, slow_count);
    if ((*slow)->send_errors() != 0) {
      std::fprintf(stderr, "metrics_port_bench: %lld slow-client sends failed\n",
                   static_cast<long long>((*slow)->send_errors()));
    }
  }
  Probe(port, "quiet_again", 0, 0);
  (*server)->Shutdown();
  std::filesystem::remove_all(state_dir);
  return 0;
}

}  // namespace
}  // namespace zeroshard::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return zeroshard::bench::Run();
}

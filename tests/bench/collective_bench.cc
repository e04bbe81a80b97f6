// collective_bench: times our ring reduce-scatter, all-gather, reduce-scatter + all-gather (one
// buffer, and as equal buckets) and all-reduce over each of --transports (loopback TCP, shared
// memory) against a raw gloo::allreduce (ring algorithm) of the same fp32 buffer over loopback
// TCP, with threads as ranks or (--processes) one process per rank. One JSON object per line;
// each time is the median over repetitions of the slowest rank's time; with both transports a
// "collective_transports" line per operation gives shm_ms / tcp_ms (same invocation).
// Run: bazel run -c opt //tests/bench:collective_bench [-- --processes]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "worker/comm/file_store.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/gloo_store_adapter.h"
#include "worker/comm/in_memory_store.h"
#include "worker/comm/rank_processes.h"

ABSL_FLAG(int, world_size, 2, "ranks (threads)");
ABSL_FLAG(int64_t, elements, int64_t{16} << 20, "fp32 elements in the buffer");
ABSL_FLAG(int, repetitions, 7, "timed repetitions per operation (median reported)");
ABSL_FLAG(int, warmup, 2, "untimed repetitions per operation");
ABSL_FLAG(int64_t, segment_bytes, zeroshard::comm::GlooCommunicatorOptions().segment_bytes,
          "GlooCommunicatorOptions::segment_bytes");
ABSL_FLAG(int, staging_segments, zeroshard::comm::GlooCommunicatorOptions().staging_segments,
          "GlooCommunicatorOptions::staging_segments");
ABSL_FLAG(int, buckets, 4, "buckets of the bucketed reduce-scatter + all-gather case");
ABSL_FLAG(int64_t, shm_slot_bytes, zeroshard::comm::GlooCommunicatorOptions().shm_slot_bytes,
          "GlooCommunicatorOptions::shm_slot_bytes");
ABSL_FLAG(int, shm_slots, zeroshard::comm::GlooCommunicatorOptions().shm_slots,
          "GlooCommunicatorOptions::shm_slots");
ABSL_FLAG(std::string, transports, "tcp,shm",
          "comma-separated transports to time (tcp, shm, auto): one communicator each");
ABSL_FLAG(bool, processes, false, "one process per rank (FileStore rendezvous) instead of threads");
ABSL_FLAG(int, rank, -1, "internal: the rank of a child process (-1: launch the children)");
ABSL_FLAG(std::string, store_dir, "", "internal: the children's FileStore directory");

namespace zeroshard::comm {
namespace {

struct Rank {
  int rank = 0;
  // One per --transports entry, in that order; the first also runs the barriers.
  std::vector<std::unique_ptr<GlooCommunicator>> communicators;
  std::shared_ptr<gloo::Context> raw;
  std::vector<float> buffer;
};

void OnEveryRank(int world_size, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) threads.emplace_back(body, rank);
  for (std::thread& thread : threads) thread.join();
}

void CheckOk(const absl::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "collective_bench: %s\n", status.ToString().c_str());
    std::exit(1);
  }
}

// Waits for `work` and returns its run time on the communication thread in milliseconds.
double WaitRunMs(const std::unique_ptr<Work>& work) {
  CheckOk(work->Wait());
  return absl::ToDoubleMilliseconds(work->RunTime().value_or(absl::ZeroDuration()));
}

std::vector<Transport> Transports() {
  std::vector<Transport> transports;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_transports), ',', absl::SkipEmpty())) {
    absl::StatusOr<Transport> transport = ParseTransport(name);
    CheckOk(transport.status());
    transports.push_back(*transport);
  }
  if (transports.empty()) CheckOk(absl::InvalidArgumentError("--transports is empty"));
  return transports;
}

// Our communicators (one per transport) and a raw Gloo context for `rank`, all over `store`.
void SetUpRank(int rank, int world_size, size_t elements, Store& store, Rank& out) {
  out.rank = rank;
  for (Transport transport : Transports()) {
    GlooCommunicatorOptions options;
    options.rank = rank;
    options.world_size = world_size;
    options.store = &store;
    options.store_prefix = absl::StrCat("bench_", TransportName(transport));
    options.transport = transport;
    options.segment_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_segment_bytes));
    options.staging_segments = absl::GetFlag(FLAGS_staging_segments);
    options.shm_slot_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_shm_slot_bytes));
    options.shm_slots = absl::GetFlag(FLAGS_shm_slots);
    auto communicator = GlooCommunicator::Create(options);
    CheckOk(communicator.status());
    out.communicators.push_back(std::move(*communicator));
  }
  if (world_size > 1) {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
    GlooStoreAdapter adapter(&store, "raw", absl::Seconds(60));
    context->connectFullMesh(adapter, device);
    out.raw = context;
  }
  out.buffer.assign(elements, 1.0f + rank);
}

struct Case {
  std::string op;
  // The link our operations ran on ("tcp", "shm"), or "gloo" for raw Gloo.
  std::string transport;
  double traffic_factor;  // bus bytes per buffer byte (nccl-tests convention)
  // Runs the case once on one rank; returns the summed communication-thread run time of our
  // operations in milliseconds (0 for raw Gloo).
  std::function<double(Rank&)> run;
};

// Our cases over communicator `c` of each rank.
std::vector<Case> OurCases(int world_size, size_t piece, size_t c, const std::string& transport) {
  const size_t elements = piece * world_size;
  const double ring = static_cast<double>(world_size - 1) / world_size;
  const int buckets = std::max(1, absl::GetFlag(FLAGS_buckets));
  std::vector<Case> cases = {
      {"reduce_scatter", transport, ring,
       [=](Rank& r) {
         return WaitRunMs(r.communicators[c]->ReduceScatterInPlace(
             r.buffer.data(), piece, ElementType::kFloat32, ReduceOp::kSum));
       }},
      {"all_gather", transport, ring,
       [=](Rank& r) {
         return WaitRunMs(
             r.communicators[c]->AllGatherInPlace(r.buffer.data(), piece, ElementType::kFloat32));
       }},
      {"reduce_scatter+all_gather", transport, 2 * ring,
       [=](Rank& r) {
         auto scatter = r.communicators[c]->ReduceScatterInPlace(
             r.buffer.data(), piece, ElementType::kFloat32, ReduceOp::kSum);
         auto gather =
             r.communicators[c]->AllGatherInPlace(r.buffer.data(), piece, ElementType::kFloat32);
         return WaitRunMs(scatter) + WaitRunMs(gather);
       }},
      // As the engine's zero2 step: every bucket's reduce-scatter, then every bucket's all-gather.
      {absl::StrCat("reduce_scatter+all_gather_", buckets, "_buckets"), transport, 2 * ring,
       [=](Rank& r) {
         const size_t bucket_piece = piece / buckets;
         std::vector<std::unique_ptr<Work>> works;
         for (int phase = 0; phase < 2; ++phase) {
           for (int b = 0; b < buckets; ++b) {
             const size_t count = b + 1 < buckets ? bucket_piece : piece - b * bucket_piece;
             float* data = r.buffer.data() + b * bucket_piece * world_size;
             works.push_back(phase == 0 ? r.communicators[c]->ReduceScatterInPlace(
                                              data, count, ElementType::kFloat32, ReduceOp::kSum)
                                        : r.communicators[c]->AllGatherInPlace(
                                              data, count, ElementType::kFloat32));
           }
         }
         double run_ms = 0;
         for (const auto& work : works) run_ms += WaitRunMs(work);
         return run_ms;
       }},
      {"all_reduce", transport, 2 * ring,
       [=](Rank& r) {
         return WaitRunMs(r.communicators[c]->AllReduce(r.buffer.data(), elements,
                                                        ElementType::kFloat32, ReduceOp::kSum));
       }},
  };
  return cases;
}

std::vector<Case> MakeCases(int world_size, size_t piece) {
  const size_t elements = piece * world_size;
  const double ring = static_cast<double>(world_size - 1) / world_size;
  std::vector<Case> cases;
  const std::vector<Transport> transports = Transports();
  for (size_t c = 0; c < transports.size(); ++c) {
    std::vector<Case> ours = OurCases(world_size, piece, c, TransportName(transports[c]));
    cases.insert(cases.end(), ours.begin(), ours.end());
  }
  if (world_size > 1) {
    cases.push_back({"gloo_allreduce_ring", "gloo", 2 * ring, [=](Rank& r) {
                       gloo::AllreduceOptions options(r.raw);
                       options.setOutput(r.buffer.data(), elements);
                       options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
                       void (*sum)(void*, const void*, const void*, size_t) = &gloo::sum<float>;
                       options.setReduceFunction(sum);
                       options.setTimeout(std::chrono::seconds(120));
                       gloo::allreduce(options);
                       return 0.0;
                     }});
  }
  return cases;
}

// One rank's samples: [case][repetition] wall and run milliseconds. Cases alternate within each
// repetition, so drifting machine load touches all of them alike.
struct Samples {
  std::vector<std::vector<double>> wall;
  std::vector<std::vector<double>> run;
};

Samples TimeCases(Rank& r, const std::vector<Case>& cases) {
  const int repetitions = absl::GetFlag(FLAGS_repetitions);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  Samples samples{std::vector<std::vector<double>>(cases.size()),
                  std::vector<std::vector<double>>(cases.size())};
  for (int i = 0; i < warmup + repetitions; ++i) {
    for (size_t c = 0; c < cases.size(); ++c) {
      CheckOk(r.communicators[0]->Barrier()->Wait());
      const absl::Time start = absl::Now();
      const double run_ms = cases[c].run(r);
      const double elapsed = absl::ToDoubleMilliseconds(absl::Now() - start);
      if (i >= warmup) {
        samples.wall[c].push_back(elapsed);
        samples.run[c].push_back(run_ms);
      }
    }
  }
  return samples;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

// `slowest`: per case and repetition, the slowest rank's samples.
void Print(const std::vector<Case>& cases, const Samples& slowest, int world_size, double bytes,
           bool processes) {
  for (size_t c = 0; c < cases.size(); ++c) {
    const double median = Median(slowest.wall[c]);
    const double busbw = median > 0 ? bytes * cases[c].traffic_factor / (median * 1e-3) / 1e9 : 0.0;
    std::printf(
        "{\"bench\":\"collective\",\"op\":\"%s\",\"transport\":\"%s\",\"ranks_as\":\"%s\","
        "\"world_size\":%d,\"bytes\":%.0f,\"ms\":%.3f,\"run_ms\":%.3f,\"busbw_gbps\":%.3f,"
        "\"repetitions\":%zu}\n",
        cases[c].op.c_str(), cases[c].transport.c_str(), processes ? "processes" : "threads",
        world_size, bytes, median, Median(slowest.run[c]), busbw, slowest.wall[c].size());
  }
  // The same operation over shared memory and over TCP, timed in this one invocation.
  for (size_t t = 0; t < cases.size(); ++t) {
    if (cases[t].transport != "tcp") continue;
    for (size_t m = 0; m < cases.size(); ++m) {
      if (cases[m].transport != "shm" || cases[m].op != cases[t].op) continue;
      const double tcp_ms = Median(slowest.wall[t]);
      const double shm_ms = Median(slowest.wall[m]);
      std::printf(
          "{\"bench\":\"collective_transports\",\"op\":\"%s\",\"ranks_as\":\"%s\","
          "\"world_size\":%d,\"bytes\":%.0f,\"tcp_median_ms\":%.3f,\"shm_median_ms\":%.3f,"
          "\"shm_over_tcp\":%.3f}\n",
          cases[t].op.c_str(), processes ? "processes" : "threads", world_size, bytes, tcp_ms,
          shm_ms, tcp_ms > 0 ? shm_ms / tcp_ms : 0.0);
    }
  }
  std::fflush(stdout);
}

size_t PieceElements(int world_size) {
  return static_cast<size_t>(absl::GetFlag(FLAGS_elements)) / world_size;
}

int RunThreads() {
  const int world_size = absl::GetFlag(FLAGS_world_size);
  const size_t piece = PieceElements(world_size);
  InMemoryStore store;
  std::vector<Rank> ranks(world_size);
  OnEveryRank(world_size, [&](int rank) {
    SetUpRank(rank, world_size, piece * world_size, store, ranks[rank]);
  });
  const std::vector<Case> cases = MakeCases(world_size, piece);
  std::vector<Samples> samples(world_size);
  OnEveryRank(world_size, [&](int rank) { samples[rank] = TimeCases(ranks[rank], cases); });
  Samples slowest = samples[0];
  for (int rank = 1; rank < world_size; ++rank) {
    for (size_t c = 0; c < cases.size(); ++c) {
      for (size_t i = 0; i < slowest.wall[c].size(); ++i) {
        slowest.wall[c][i] = std::max(slowest.wall[c][i], samples[rank].wall[c][i]);
        slowest.run[c][i] = std::max(slowest.run[c][i], samples[rank].run[c][i]);
      }
    }
  }
  Print(cases, slowest, world_size, static_cast<double>(piece * world_size * sizeof(float)),
        /*processes=*/false);
  return 0;
}

// A child process: one rank; the slowest rank's samples come from a kMax all-reduce.
int RunProcessRank() {
  const int world_size = absl::GetFlag(FLAGS_world_size);
  const size_t piece = PieceElements(world_size);
  FileStore store(absl::GetFlag(FLAGS_store_dir));
  Rank r;
  try {
    SetUpRank(absl::GetFlag(FLAGS_rank), world_size, piece * world_size, store, r);
  } catch (const std::exception& error) {
    CheckOk(absl::InternalError(error.what()));
  }
  const std::vector<Case> cases = MakeCases(world_size, piece);
  Samples samples = TimeCases(r, cases);
  std::vector<double> flat;
  for (size_t c = 0; c < cases.size(); ++c) {
    flat.insert(flat.end(), samples.wall[c].begin(), samples.wall[c].end());
    flat.insert(flat.end(), samples.run[c].begin(), samples.run[c].end());
  }
  CheckOk(r.communicators[0]
              ->AllReduce(flat.data(), flat.size(), ElementType::kFloat64, ReduceOp::kMax)
              ->Wait());
  size_t at = 0;
  for (size_t c = 0; c < cases.size(); ++c) {
    for (double& value : samples.wall[c]) value = flat[at++];
    for (double& value : samples.run[c]) value = flat[at++];
  }
  if (r.rank == 0) {
    Print(cases, samples, world_size, static_cast<double>(piece * world_size * sizeof(float)),
          /*processes=*/true);
  }
  return 0;
}

// Starts world_size copies of this binary with its own flags plus --rank and --store_dir.
int LaunchProcesses(const char* self, int argc, char** argv) {
  return RunRankProcesses(self, absl::GetFlag(FLAGS_world_size),
                          std::vector<std::string>(argv + 1, argv + argc), "collective_bench");
}

}  // namespace
}  // namespace zeroshard::comm

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_processes)) return zeroshard::comm::RunThreads();
  if (absl::GetFlag(FLAGS_rank) >= 0) return zeroshard::comm::RunProcessRank();
  return zeroshard::comm::LaunchProcesses("/proc/self/exe", argc, argv);
}

// collective_bench: times our ring reduce-scatter, all-gather, reduce-scatter + all-gather and
// all-reduce against a raw gloo::allreduce (ring algorithm) of the same fp32 buffer, with threads
// as ranks over loopback TCP. One JSON object per line; each time is the median over repetitions
// of the slowest rank's time. Run: bazel run -c opt //worker/comm:collective_bench
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
#include "absl/time/clock.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/gloo_store_adapter.h"
#include "worker/comm/in_memory_store.h"

ABSL_FLAG(int, world_size, 2, "ranks (threads)");
ABSL_FLAG(int64_t, elements, int64_t{16} << 20, "fp32 elements in the buffer");
ABSL_FLAG(int, repetitions, 7, "timed repetitions per operation (median reported)");
ABSL_FLAG(int, warmup, 2, "untimed repetitions per operation");
ABSL_FLAG(int64_t, segment_bytes, zeroshard::comm::GlooCommunicatorOptions().segment_bytes,
          "GlooCommunicatorOptions::segment_bytes");
ABSL_FLAG(int, staging_segments, zeroshard::comm::GlooCommunicatorOptions().staging_segments,
          "GlooCommunicatorOptions::staging_segments");

namespace zeroshard {
namespace comm {
namespace {

struct Rank {
  std::unique_ptr<GlooCommunicator> communicator;
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

int Main() {
  const int world_size = absl::GetFlag(FLAGS_world_size);
  const size_t piece = static_cast<size_t>(absl::GetFlag(FLAGS_elements)) / world_size;
  const size_t elements = piece * world_size;
  const double bytes = static_cast<double>(elements * sizeof(float));
  InMemoryStore store;
  std::vector<Rank> ranks(world_size);
  OnEveryRank(world_size, [&](int rank) {
    GlooCommunicatorOptions options;
    options.rank = rank;
    options.world_size = world_size;
    options.store = &store;
    options.segment_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_segment_bytes));
    options.staging_segments = absl::GetFlag(FLAGS_staging_segments);
    auto communicator = GlooCommunicator::Create(options);
    CheckOk(communicator.status());
    ranks[rank].communicator = std::move(*communicator);
    if (world_size > 1) {
      gloo::transport::tcp::attr attr;
      attr.hostname = "127.0.0.1";
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
      GlooStoreAdapter adapter(&store, "raw", absl::Seconds(60));
      context->connectFullMesh(adapter, device);
      ranks[rank].raw = context;
    }
    ranks[rank].buffer.assign(elements, 1.0f + rank);
  });

  struct Case {
    std::string op;
    double traffic_factor;  // bus bytes per buffer byte (nccl-tests convention)
    std::function<void(Rank&)> run;
  };
  const double ring = static_cast<double>(world_size - 1) / world_size;
  std::vector<Case> cases = {
      {"reduce_scatter", ring,
       [&](Rank& r) {
         CheckOk(r.communicator
                     ->ReduceScatterInPlace(r.buffer.data(), piece, ElementType::kFloat32,
                                            ReduceOp::kSum)
                     ->Wait());
       }},
      {"all_gather", ring,
       [&](Rank& r) {
         CheckOk(r.communicator->AllGatherInPlace(r.buffer.data(), piece, ElementType::kFloat32)
                     ->Wait());
       }},
      {"reduce_scatter+all_gather", 2 * ring,
       [&](Rank& r) {
         auto scatter = r.communicator->ReduceScatterInPlace(r.buffer.data(), piece,
                                                             ElementType::kFloat32, ReduceOp::kSum);
         auto gather =
             r.communicator->AllGatherInPlace(r.buffer.data(), piece, ElementType::kFloat32);
         CheckOk(scatter->Wait());
         CheckOk(gather->Wait());
       }},
      {"all_reduce", 2 * ring,
       [&](Rank& r) {
         CheckOk(r.communicator
                     ->AllReduce(r.buffer.data(), elements, ElementType::kFloat32, ReduceOp::kSum)
                     ->Wait());
       }},
  };
  if (world_size > 1) {
    cases.push_back({"gloo_allreduce_ring", 2 * ring, [&](Rank& r) {
                       gloo::AllreduceOptions options(r.raw);
                       options.setOutput(r.buffer.data(), elements);
                       options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
                       void (*sum)(void*, const void*, const void*, size_t) = &gloo::sum<float>;
                       options.setReduceFunction(sum);
                       options.setTimeout(std::chrono::seconds(120));
                       gloo::allreduce(options);
                     }});
  }

  const int repetitions = absl::GetFlag(FLAGS_repetitions);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  // Cases alternate within each repetition, so drifting machine load touches all of them alike.
  std::vector<std::vector<std::vector<double>>> ms(cases.size(),
                                                   std::vector<std::vector<double>>(world_size));
  OnEveryRank(world_size, [&](int rank) {
    Rank& r = ranks[rank];
    for (int i = 0; i < warmup + repetitions; ++i) {
      for (size_t c = 0; c < cases.size(); ++c) {
        CheckOk(r.communicator->Barrier()->Wait());
        const absl::Time start = absl::Now();
        cases[c].run(r);
        const double elapsed = absl::ToDoubleMilliseconds(absl::Now() - start);
        if (i >= warmup) ms[c][rank].push_back(elapsed);
      }
    }
  });
  for (size_t c = 0; c < cases.size(); ++c) {
    std::vector<double> slowest(repetitions, 0.0);
    for (int i = 0; i < repetitions; ++i) {
      for (int rank = 0; rank < world_size; ++rank) {
        slowest[i] = std::max(slowest[i], ms[c][rank][i]);
      }
    }
    std::sort(slowest.begin(), slowest.end());
    const double median = slowest[repetitions / 2];
    const double busbw = median > 0 ? bytes * cases[c].traffic_factor / (median * 1e-3) / 1e9 : 0.0;
    std::printf(
        "{\"bench\":\"collective\",\"op\":\"%s\",\"world_size\":%d,\"bytes\":%.0f,\"ms\":%.3f,"
        "\"busbw_gbps\":%.3f,\"repetitions\":%d}\n",
        cases[c].op.c_str(), world_size, bytes, median, busbw, repetitions);
  }
  return 0;
}

}  // namespace
}  // namespace comm
}  // namespace zeroshard

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return zeroshard::comm::Main();
}

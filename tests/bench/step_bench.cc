// step_bench: one training step of the engine in ddp, zero1 and zero2, as real processes over
// Gloo on loopback, with a synthetic (memcpy) or a real MLP backward; plus a raw gloo::allreduce
// (ring) of the same buffer in the same run, wall clock against wall clock. One JSON object per
// line (rank 0 prints). Run:
//   bazel run -c opt //tests/bench:step_bench -- --world_size=2 --params=16000000 --steps=9
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "kernels/optimizer.h"
#include "sharding/shard_planner.h"
#include "worker/comm/file_store.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/gloo_store_adapter.h"
#include "worker/comm/rank_processes.h"
#include "worker/engine/engine.h"
#include "worker/workloads/teacher_student_mlp.h"
#include "worker/workloads/workload.h"

ABSL_FLAG(int, world_size, 2, "ranks (one process each)");
ABSL_FLAG(int64_t, params, 16000000,
          "fp32 parameters of the model (about that many with --backward=mlp)");
ABSL_FLAG(std::string, optimizer, "adam", "sgd, adam, adamw, adagrad or lion");
ABSL_FLAG(std::string, mode, "",
          "ddp, zero1 or zero2; empty runs all three, interleaved step by step");
ABSL_FLAG(int, steps, 7, "timed steps per mode (medians reported)");
ABSL_FLAG(int, warmup, 2, "untimed steps per mode");
ABSL_FLAG(int, threads, 1, "optimizer kernel threads per rank");
ABSL_FLAG(int64_t, tensor_elems, int64_t{1} << 20,
          "elements per synthetic tensor (--backward=memcpy)");
ABSL_FLAG(std::string, backward, "memcpy",
          "memcpy: each tensor's gradient is copied from a fixed pattern; mlp: forward and "
          "backward of a teacher-student MLP (--mlp_layers Linear layers of equal width)");
ABSL_FLAG(int, mlp_layers, 3, "Linear layers of the --backward=mlp model");
ABSL_FLAG(int64_t, mlp_batch, 64, "global batch of --backward=mlp (a multiple of world_size)");
ABSL_FLAG(int64_t, segment_bytes, zeroshard::comm::GlooCommunicatorOptions().segment_bytes,
          "the engine communicator's ring segment size");
ABSL_FLAG(int, staging_segments, zeroshard::comm::GlooCommunicatorOptions().staging_segments,
          "the engine communicator's reduce-scatter staging segments");
ABSL_FLAG(int, rank, -1, "internal: the rank of a child process (-1: launch the children)");
ABSL_FLAG(std::string, store_dir, "", "internal: the children's FileStore directory");

namespace zeroshard::bench {
namespace {

void CheckOk(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "step_bench rank %d: %s: %s\n", absl::GetFlag(FLAGS_rank), what,
                 status.ToString().c_str());
    std::exit(1);
  }
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

// Tensors of tensor_elems elements (the last one smaller) adding up to `params`.
std::vector<sharding::TensorSpec> SyntheticTensors(int64_t params, int64_t tensor_elems) {
  std::vector<sharding::TensorSpec> tensors;
  for (int64_t begin = 0; begin < params; begin += tensor_elems) {
    sharding::TensorSpec spec;
    spec.name = absl::StrCat("layer", tensors.size(), ".weight");
    spec.num_elements = std::min(tensor_elems, params - begin);
    spec.shape = {spec.num_elements};
    tensors.push_back(spec);
  }
  return tensors;
}

// The synthetic gradients' values repeat with this period.
constexpr int64_t kPatternPeriod = 17;

// The --backward=memcpy producer: no model, every parameter starts at 0.01. Its forward asks for
// every tensor's parameters in forward order (the tensor list backwards) and computes nothing,
// so it waits for the whole of the previous step's all-gather. Tensor t's gradient at step s on
// rank r is gradient[j] = (((j + offset) % 17) - 8) * 1e-3 with offset = (7 t + 3 s + r) % 17:
// one memcpy from a periodic pattern into a tensor-sized vector, then
// workloads::CopyGradientToSink (a copy per segment). The loss is a constant.
// Thread contract: not thread-safe (one ForwardBackward at a time).
class MemcpyWorkload final : public workloads::Workload {
 public:
  MemcpyWorkload(std::vector<sharding::TensorSpec> tensors, int rank)
      : tensors_(std::move(tensors)), rank_(rank) {
    int64_t largest = 0;
    for (const sharding::TensorSpec& spec : tensors_) {
      largest = std::max(largest, spec.num_elements);
    }
    pattern_.resize(largest + kPatternPeriod);
    for (size_t i = 0; i < pattern_.size(); ++i) {
      pattern_[i] = static_cast<float>(static_cast<int64_t>(i % kPatternPeriod) - 8) * 1e-3f;
    }
    gradient_.reserve(largest);
  }

  absl::Status InitialParameters(int64_t, absl::Span<float> out) const override {
    std::fill(out.begin(), out.end(), 0.01f);
    return absl::OkStatus();
  }

  absl::StatusOr<double> ForwardBackward(int64_t step, workloads::ParameterSource& params,
                                         workloads::GradientSink& sink) override {
    for (int64_t t = static_cast<int64_t>(tensors_.size()) - 1; t >= 0; --t) {
      absl::StatusOr<workloads::StoredParameters> stored = params.Parameters(t);
      if (!stored.ok()) return stored.status();
    }
    for (int64_t t = 0; t < static_cast<int64_t>(tensors_.size()); ++t) {
      gradient_.resize(tensors_[t].num_elements);
      const int64_t offset = (t * 7 + step * 3 + rank_) % kPatternPeriod;
      std::memcpy(gradient_.data(), pattern_.data() + offset, gradient_.size() * sizeof(float));
      absl::Status copied = workloads::CopyGradientToSink(sink, t, gradient_);
      if (!copied.ok()) return copied;
    }
    return 0.5;
  }

  int64_t BufferBytes() const override {
    return static_cast<int64_t>((pattern_.capacity() + gradient_.capacity()) * sizeof(float));
  }

 private:
  const std::vector<sharding::TensorSpec> tensors_;
  const int rank_;
  std::vector<float> pattern_;
  std::vector<float> gradient_;
};

// `layers` + 1 equal layer sizes s whose MLP (layers * (s^2 + s) parameters) comes closest to
// `params`.
std::vector<int64_t> MlpLayerSizes(int64_t params, int layers) {
  const double per_layer = static_cast<double>(params) / layers;
  const int64_t below = std::max<int64_t>(
      1, static_cast<int64_t>(std::floor((std::sqrt(1.0 + 4.0 * per_layer) - 1.0) / 2.0)));
  auto distance = [&](int64_t size) { return std::abs(layers * (size * size + size) - params); };
  const int64_t size = distance(below + 1) < distance(below) ? below + 1 : below;
  return std::vector<int64_t>(layers + 1, size);
}

// The step's gradient producer and the tensors it produces gradients for.
struct GradientProducer {
  std::vector<sharding::TensorSpec> tensors;
  std::unique_ptr<workloads::Workload> workload;
  std::vector<int64_t> mlp_layer_sizes;  // --backward=mlp only
};

GradientProducer MakeGradientProducer(int rank, int world_size) {
  GradientProducer producer;
  const std::string& backward = absl::GetFlag(FLAGS_backward);
  if (backward == "memcpy") {
    producer.tensors =
        SyntheticTensors(absl::GetFlag(FLAGS_params), absl::GetFlag(FLAGS_tensor_elems));
    producer.workload = std::make_unique<MemcpyWorkload>(producer.tensors, rank);
    return producer;
  }
  if (backward != "mlp") {
    CheckOk(absl::InvalidArgumentError("--backward: not memcpy or mlp"), "flags");
  }
  if (absl::GetFlag(FLAGS_mlp_layers) < 1) {
    CheckOk(absl::InvalidArgumentError("--mlp_layers: must be >= 1"), "flags");
  }
  workloads::TeacherStudentMlpOptions options;
  options.layer_sizes = MlpLayerSizes(absl::GetFlag(FLAGS_params), absl::GetFlag(FLAGS_mlp_layers));
  options.seed = 1;
  options.global_batch = absl::GetFlag(FLAGS_mlp_batch);
  options.world_size = world_size;
  options.rank = rank;
  auto mlp = workloads::TeacherStudentMlp::Create(options);
  CheckOk(mlp.status(), "TeacherStudentMlp::Create");
  producer.tensors = (*mlp)->tensors();
  producer.workload = *std::move(mlp);
  producer.mlp_layer_sizes = options.layer_sizes;
  return producer;
}

// Per step, the slowest rank's time of each part (an fp64 kMax all-reduce).
// kMoved = kComm + kAllgatherRun of the same step; kRaw = the raw gloo all-reduce run right after
// it. kCommWall = kReduceWall + kAllgatherRun of the same rank, then the slowest rank's.
enum Field {
  kStep,
  kEngineStep,
  kBackward,
  kComm,
  kExposed,
  kStats,
  kUpdate,
  kAllgather,
  kMoved,
  kRaw,
  // The same collective figures taken from the rank that finished waiting first (see
  // FastestRank): kMovedFastest = that rank's kComm + kAllgatherRun, kRawFastest likewise.
  kMovedFastest,
  kRawFastest,
  kReduceWall,
  kAllgatherRun,
  kParamWait,
  kCommWall,
  kFields
};

std::vector<double> SlowestRank(comm::Communicator& communicator, std::vector<double> values) {
  CheckOk(communicator
              .AllReduce(values.data(), values.size(), comm::ElementType::kFloat64,
                         comm::ReduceOp::kMax)
              ->Wait(),
          "timing all-reduce");
  return values;
}

// Per step, the smallest value over ranks (a kMax all-reduce of the negated values). For a
// collective's run time this is the rank that joined last: it waited for no peer, so its run
// time is the collective's own duration, without the skew between the ranks' arrivals (which
// the slowest rank's figure includes, and which the raw baseline, started after a barrier, never
// has).
std::vector<double> FastestRank(comm::Communicator& communicator, std::vector<double> values) {
  for (double& value : values) value = -value;
  values = SlowestRank(communicator, std::move(values));
  for (double& value : values) value = -value;
  return values;
}

// The baseline: gloo::allreduce with its ring algorithm over a buffer of the plan's size, on its
// own Gloo context (same processes, same loopback).
class RawGlooAllreduce {
 public:
  RawGlooAllreduce(comm::Store& store, comm::Communicator& communicator, int64_t elements)
      : communicator_(communicator), buffer_(elements, 1.0f + communicator.rank()) {
    if (communicator.world_size() == 1) return;
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    context_ =
        std::make_shared<gloo::rendezvous::Context>(communicator.rank(), communicator.world_size());
    comm::GlooStoreAdapter adapter(&store, "raw_allreduce", absl::Seconds(60));
    context_->connectFullMesh(adapter, device);
  }

  struct Times {
    double slowest_ms = 0.0;
    double fastest_ms = 0.0;
  };

  // One all-reduce after a barrier; the slowest and the fastest rank's milliseconds.
  Times Run() {
    if (context_ == nullptr) return {};
    CheckOk(communicator_.Barrier()->Wait(), "barrier");
    const absl::Time start = absl::Now();
    gloo::AllreduceOptions options(context_);
    options.setOutput(buffer_.data(), buffer_.size());
    options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    void (*sum)(void*, const void*, const void*, size_t) = &gloo::sum<float>;
    options.setReduceFunction(sum);
    options.setTimeout(std::chrono::seconds(120));
    try {
      gloo::allreduce(options);
    } catch (const std::exception& error) {
      CheckOk(absl::InternalError(error.what()), "gloo::allreduce");
    }
    const double elapsed = absl::ToDoubleMilliseconds(absl::Now() - start);
    // Refill, so sums do not grow without bound over the repetitions.
    std::fill(buffer_.begin(), buffer_.end(), 1.0f + communicator_.rank());
    return {SlowestRank(communicator_, {elapsed})[0], FastestRank(communicator_, {elapsed})[0]};
  }

 private:
  comm::Communicator& communicator_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::vector<float> buffer_;
};

// The baseline on its own, before the modes: median of the slowest rank's times.
void PrintRawGlooAllreduce(RawGlooAllreduce& raw, comm::Communicator& communicator,
                           int64_t elements) {
  const int world_size = communicator.world_size();
  if (world_size == 1) return;
  std::vector<double> samples;
  const int warmup = absl::GetFlag(FLAGS_warmup);
  for (int i = 0; i < warmup + absl::GetFlag(FLAGS_steps); ++i) {
    const double ms = raw.Run().slowest_ms;
    if (i >= warmup) samples.push_back(ms);
  }
  const double median = Median(samples);
  if (communicator.rank() == 0) {
    const double bytes = static_cast<double>(elements) * 4.0;
    std::printf(
        "{\"bench\":\"step\",\"mode\":\"gloo_allreduce_ring\",\"world_size\":%d,\"params\":%lld,"
        "\"allreduce_ms\":%.3f,\"busbw_gbps\":%.3f}\n",
        world_size, static_cast<long long>(elements), median,
        bytes * 2.0 * (world_size - 1) / world_size / (median * 1e-3) / 1e9);
    std::fflush(stdout);
  }
}

engine::EngineConfig ConfigFor(engine::EngineMode mode) {
  engine::EngineConfig config;
  config.mode = mode;
  kernels::OptimizerConfig optimizer;
  bool known = false;
  for (auto kind :
       {kernels::OptimizerKind::kSgd, kernels::OptimizerKind::kAdam, kernels::OptimizerKind::kAdamW,
        kernels::OptimizerKind::kAdagrad, kernels::OptimizerKind::kLion}) {
    if (absl::GetFlag(FLAGS_optimizer) == kernels::OptimizerKindName(kind)) {
      optimizer.kind = kind;
      known = true;
    }
  }
  if (!known) CheckOk(absl::InvalidArgumentError("unknown --optimizer"), "flags");
  if (optimizer.kind == kernels::OptimizerKind::kSgd) optimizer.momentum = 0.9;
  config.optimizer = optimizer;
  config.threads = absl::GetFlag(FLAGS_threads);
  return config;
}

// One mode's engine and its per-step figures (samples[field][timed step], the slowest rank's).
struct ModeRun {
  engine::EngineMode mode = engine::EngineMode::kDdp;
  std::unique_ptr<engine::Engine> engine;
  std::vector<std::vector<double>> samples = std::vector<std::vector<double>>(kFields);
  engine::StepResult last;
};

// One timed iteration of `run` (its data is step 2 * step + 1): after a barrier, an untimed
// lead-in iteration (step 2 * step), so that the timed one starts as every iteration of a
// training run does, with the previous step's all-gathers still in flight (zero1/zero2) and
// nothing else queued on the communicator; then forward + backward and Step(), timed, then the
// raw all-reduce (whose barrier waits for the timed step's all-gathers).
std::vector<double> TimedStep(ModeRun& run, int64_t step, workloads::Workload& workload,
                              comm::Communicator& communicator, RawGlooAllreduce& raw) {
  engine::Engine& step_engine = *run.engine;
  CheckOk(communicator.Barrier()->Wait(), "barrier");
  absl::StatusOr<double> lead_in = workload.ForwardBackward(2 * step, step_engine, step_engine);
  CheckOk(lead_in.status(), "ForwardBackward (lead-in)");
  CheckOk(step_engine.Step(*lead_in).status(), "Step (lead-in)");
  const absl::Time start = absl::Now();
  absl::StatusOr<double> loss = workload.ForwardBackward(2 * step + 1, step_engine, step_engine);
  CheckOk(loss.status(), "ForwardBackward");
  const absl::Time backward_done = absl::Now();
  auto result = step_engine.Step(*loss);
  CheckOk(result.status(), "Step");
  const absl::Time done = absl::Now();
  run.last = *result;
  const engine::StepTimings& timings = result->timings;
  std::vector<double> values(kFields);
  values[kStep] = absl::ToDoubleMilliseconds(done - start);
  values[kEngineStep] = timings.step_ms;
  values[kBackward] = absl::ToDoubleMilliseconds(backward_done - start);
  values[kComm] = timings.comm_ms;
  values[kExposed] = timings.exposed_comm_ms;
  values[kStats] = timings.grad_stats_ms;
  values[kUpdate] = timings.update_ms;
  values[kAllgather] = timings.allgather_ms;
  values[kReduceWall] = timings.reduce_wall_ms;
  values[kAllgatherRun] = timings.allgather_run_ms;
  values[kParamWait] = timings.param_wait_ms;
  values[kCommWall] = timings.reduce_wall_ms + timings.allgather_run_ms;
  const std::vector<double> fastest =
      FastestRank(communicator, {values[kComm] + values[kAllgatherRun]});
  values = SlowestRank(communicator, values);
  values[kMoved] = values[kComm] + values[kAllgatherRun];
  values[kMovedFastest] = fastest[0];
  const RawGlooAllreduce::Times raw_times = raw.Run();
  values[kRaw] = raw_times.slowest_ms;
  values[kRawFastest] = raw_times.fastest_ms;
  return values;
}

void PrintMode(const ModeRun& run, const ModeRun* ddp, const GradientProducer& producer,
               const sharding::ShardPlan& plan, int world_size) {
  std::vector<double> median(kFields);
  for (int f = 0; f < kFields; ++f) median[f] = Median(run.samples[f]);
  // Each step's step_ms against ddp's step of the same index (run next to it), median over
  // steps; 0 when ddp did not run.
  double step_vs_ddp = 0.0;
  if (ddp != nullptr) {
    std::vector<double> ratios;
    for (size_t s = 0; s < run.samples[kStep].size(); ++s) {
      ratios.push_back(run.samples[kStep][s] / ddp->samples[kStep][s]);
    }
    step_vs_ddp = Median(ratios);
  }
  const double bytes = static_cast<double>(plan.padded_elems()) * 4.0;
  // Gradient reduction and parameter gather together move 2 (W-1)/W of the buffer per rank.
  const double moved_ms = median[kMoved];
  const double raw_allreduce_ms = median[kRaw];
  const double busbw =
      moved_ms > 0 ? bytes * 2.0 * (world_size - 1) / world_size / (moved_ms * 1e-3) / 1e9 : 0.0;
  std::string mlp_fields;
  if (!producer.mlp_layer_sizes.empty()) {
    mlp_fields =
        absl::StrCat(",\"mlp_layer_sizes\":[", absl::StrJoin(producer.mlp_layer_sizes, ","),
                     "],\"global_batch\":", absl::GetFlag(FLAGS_mlp_batch));
  }
  const engine::MemoryReport& memory = run.last.memory;
  using engine::MemoryCategory;
  std::printf(
      "{\"bench\":\"step\",\"mode\":\"%s\",\"world_size\":%d,\"params\":%lld,"
      "\"optimizer\":\"%s\",\"backward\":\"%s\"%s,\"steps\":%d,\"step_ms\":%.3f,"
      "\"step_vs_ddp\":%.3f,\"engine_step_ms\":%.3f,"
      "\"backward_ms\":%.3f,\"comm_ms\":%.3f,\"exposed_comm_ms\":%.3f,\"grad_stats_ms\":%.3f,"
      "\"update_ms\":%.3f,\"allgather_ms\":%.3f,\"allgather_run_ms\":%.3f,"
      "\"param_wait_ms\":%.3f,\"comm_plus_allgather_ms\":%.3f,"
      "\"reduce_wall_ms\":%.3f,\"comm_wall_ms\":%.3f,"
      "\"gloo_allreduce_ms\":%.3f,\"vs_gloo_allreduce_wall\":%.3f,"
      "\"comm_vs_gloo_allreduce\":%.3f,"
      "\"comm_plus_allgather_fastest_rank_ms\":%.3f,\"gloo_allreduce_fastest_rank_ms\":%.3f,"
      "\"comm_vs_gloo_allreduce_fastest_rank\":%.3f,\"busbw_gbps\":%.3f,"
      "\"opt_state_bytes_per_rank\":%lld,\"master_bytes_per_rank\":%lld,"
      "\"grad_bytes_per_rank\":%lld,\"param_bytes_per_rank\":%lld,\"bucket_bytes_per_rank\":%lld,"
      "\"total_bytes_per_rank\":%lld}\n",
      engine::EngineModeName(run.mode), world_size, static_cast<long long>(plan.tensor_elems()),
      absl::GetFlag(FLAGS_optimizer).c_str(), absl::GetFlag(FLAGS_backward).c_str(),
      mlp_fields.c_str(), absl::GetFlag(FLAGS_steps), median[kStep], step_vs_ddp,
      median[kEngineStep], median[kBackward], median[kComm], median[kExposed], median[kStats],
      median[kUpdate], median[kAllgather], median[kAllgatherRun], median[kParamWait], moved_ms,
      median[kReduceWall], median[kCommWall], raw_allreduce_ms,
      raw_allreduce_ms > 0 ? median[kCommWall] / raw_allreduce_ms : 0.0,
      raw_allreduce_ms > 0 ? moved_ms / raw_allreduce_ms : 0.0, median[kMovedFastest],
      median[kRawFastest],
      median[kRawFastest] > 0 ? median[kMovedFastest] / median[kRawFastest] : 0.0, busbw,
      static_cast<long long>(memory.of(MemoryCategory::kOptimizerState)),
      static_cast<long long>(memory.of(MemoryCategory::kMaster)),
      static_cast<long long>(memory.of(MemoryCategory::kGrads)),
      static_cast<long long>(memory.of(MemoryCategory::kParams)),
      static_cast<long long>(memory.of(MemoryCategory::kBuckets)),
      static_cast<long long>(memory.total()));
  std::fflush(stdout);
}

// Every mode's engine at once, stepped in turn: step s runs the modes in an order rotated by s,
// so that load changes on the machine fall on every mode alike.
void RunModes(const std::vector<engine::EngineMode>& modes, const sharding::ShardPlan& plan,
              GradientProducer& producer, comm::Communicator& communicator, RawGlooAllreduce& raw) {
  std::vector<ModeRun> runs;
  for (engine::EngineMode mode : modes) {
    ModeRun run;
    run.mode = mode;
    auto created =
        engine::Engine::Create(plan, communicator.rank(), ConfigFor(mode), &communicator);
    CheckOk(created.status(), "Engine::Create");
    run.engine = *std::move(created);
    CheckOk(run.engine->InitializeParameters([&](int64_t tensor, absl::Span<float> out) {
      return producer.workload->InitialParameters(tensor, out);
    }),
            "InitializeParameters");
    runs.push_back(std::move(run));
  }
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int count = static_cast<int>(runs.size());
  for (int step = 0; step < warmup + steps; ++step) {
    for (int k = 0; k < count; ++k) {
      ModeRun& run = runs[(step + k) % count];
      const std::vector<double> values =
          TimedStep(run, step, *producer.workload, communicator, raw);
      if (step < warmup) continue;
      for (int f = 0; f < kFields; ++f) run.samples[f].push_back(values[f]);
    }
  }
  if (communicator.rank() != 0) return;
  const ModeRun* ddp = nullptr;
  for (const ModeRun& run : runs) {
    if (run.mode == engine::EngineMode::kDdp) ddp = &run;
  }
  for (const ModeRun& run : runs) {
    PrintMode(run, ddp, producer, plan, communicator.world_size());
  }
}

int RunRank() {
  const int rank = absl::GetFlag(FLAGS_rank);
  const int world_size = absl::GetFlag(FLAGS_world_size);
  comm::FileStore store(absl::GetFlag(FLAGS_store_dir));
  comm::GlooCommunicatorOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.store = &store;
  options.store_prefix = "engine";
  options.segment_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_segment_bytes));
  options.staging_segments = absl::GetFlag(FLAGS_staging_segments);
  auto communicator = comm::GlooCommunicator::Create(options);
  CheckOk(communicator.status(), "GlooCommunicator::Create");
  GradientProducer producer = MakeGradientProducer(rank, world_size);
  auto plan = sharding::ShardPlan::Create(producer.tensors, world_size);
  CheckOk(plan.status(), "ShardPlan::Create");
  std::unique_ptr<RawGlooAllreduce> raw;
  try {
    raw = std::make_unique<RawGlooAllreduce>(store, **communicator, plan->padded_elems());
  } catch (const std::exception& error) {
    CheckOk(absl::InternalError(error.what()), "gloo rendezvous");
  }
  PrintRawGlooAllreduce(*raw, **communicator, plan->padded_elems());
  std::vector<engine::EngineMode> modes = {engine::EngineMode::kDdp, engine::EngineMode::kZero1,
                                           engine::EngineMode::kZero2};
  if (!absl::GetFlag(FLAGS_mode).empty()) {
    auto mode = engine::ParseEngineMode(absl::GetFlag(FLAGS_mode));
    CheckOk(mode.status(), "--mode");
    modes = {*mode};
  }
  RunModes(modes, *plan, producer, **communicator, *raw);
  return 0;
}

// Starts world_size copies of this binary with the run's flags plus --rank and --store_dir.
int LaunchRanks(const char* self) {
  const int world_size = absl::GetFlag(FLAGS_world_size);
  std::vector<std::string> args = {
      absl::StrCat("--world_size=", world_size),
      absl::StrCat("--params=", absl::GetFlag(FLAGS_params)),
      absl::StrCat("--optimizer=", absl::GetFlag(FLAGS_optimizer)),
      absl::StrCat("--mode=", absl::GetFlag(FLAGS_mode)),
      absl::StrCat("--steps=", absl::GetFlag(FLAGS_steps)),
      absl::StrCat("--warmup=", absl::GetFlag(FLAGS_warmup)),
      absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads)),
      absl::StrCat("--tensor_elems=", absl::GetFlag(FLAGS_tensor_elems)),
      absl::StrCat("--backward=", absl::GetFlag(FLAGS_backward)),
      absl::StrCat("--mlp_layers=", absl::GetFlag(FLAGS_mlp_layers)),
      absl::StrCat("--mlp_batch=", absl::GetFlag(FLAGS_mlp_batch)),
      absl::StrCat("--segment_bytes=", absl::GetFlag(FLAGS_segment_bytes)),
      absl::StrCat("--staging_segments=", absl::GetFlag(FLAGS_staging_segments)),
  };
  return comm::RunRankProcesses(self, world_size, args, "step_bench");
}

}  // namespace
}  // namespace zeroshard::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_rank) >= 0) return zeroshard::bench::RunRank();
  return zeroshard::bench::LaunchRanks("/proc/self/exe");
}

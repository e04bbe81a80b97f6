// GFLOP/s of every cblas_sgemm call the teacher-student MLP (worker/workloads/
// teacher_student_mlp.cc) makes per rank on a job's shapes, one BLAS thread, for the comparison
// with torch's GEMMs (tests/bench/torch_gemm.py; docs/performance/gemm.md).
// Prints one JSON object per line. Run: bazel run -c opt //tests/bench:gemm_bench
#include <cblas.h>
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "jobspec/job_plan.h"
#include "jobspec/job_spec_defaults.h"
#include "sharding/model_catalog.h"
#include "sharding/shard_planner.h"
#include "worker/workloads/row_blocks.h"
#include "zeroshard/v1/job.pb.h"

ABSL_FLAG(std::vector<std::string>, jobs, std::vector<std::string>({"medium:2", "seed:4"}),
          "preset:world_size pairs; each job's plan is the planner's with the job defaults "
          "(bucket size) at that world size, as tests/bench/e2e_vs_torch.py runs them");
ABSL_FLAG(int64_t, per_rank_batch, 32, "samples per rank (the MLP's local batch)");
ABSL_FLAG(int, reps, 15, "timed passes over every call (at least 10; medians reported)");
ABSL_FLAG(int, warmup, 3, "untimed passes first");
ABSL_FLAG(
    bool, list, false,
    "print the calls (\"bench\":\"gemm_shape\" lines, no timing) for tests/bench/torch_gemm.py");

namespace zeroshard::bench {
namespace {

void CheckOk(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "gemm_bench: %s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

// A float array at a 64-byte boundary, filled with values uniform in [-1, 1) from `seed`
// (xorshift64*: any fixed values do, the timings do not depend on them).
// Thread contract: not thread-safe; the bench runs on one thread.
class Floats {
 public:
  Floats(int64_t count, uint64_t seed)
      : data_(static_cast<float*>(std::aligned_alloc(64, RoundUp(count) * sizeof(float)))),
        count_(count) {
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t k = 0; k < count; ++k) {
      state ^= state >> 12;
      state ^= state << 25;
      state ^= state >> 27;
      const uint64_t bits = state * 0x2545F4914F6CDD1Dull;
      data_.get()[k] = static_cast<float>(static_cast<double>(bits >> 40) / (1 << 23) - 1.0);
    }
  }
  float* data() const { return data_.get(); }
  int64_t size() const { return count_; }

 private:
  static int64_t RoundUp(int64_t count) { return (count + 15) / 16 * 16; }
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  int64_t count_;
};

enum class Kind {
  kForward,               // out = in W^T + b (teacher and student): LinearForward
  kInputGradient,         // previous = delta W: StudentInputGradient
  kWeightGradient,        // dW = delta^T activation in one call (what torch's autograd issues)
  kWeightGradientBlocks,  // the row blocks WeightGradient issues, in order, as one sequence
  kWeightGradientBlock,   // one of those row blocks (a cut row is a one-row call plus a copy)
};

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kForward:
      return "forward";
    case Kind::kInputGradient:
      return "input_grad";
    case Kind::kWeightGradient:
      return "weight_grad";
    case Kind::kWeightGradientBlocks:
      return "weight_grad_blocks";
    case Kind::kWeightGradientBlock:
      return "weight_grad_block";
  }
  return "";
}

// One cblas_sgemm (row-major) exactly as the MLP issues it, with its operands.
struct Gemm {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  float beta = 0.0f;
  const float* a = nullptr;  // already offset by a_offset
  const float* b = nullptr;
  float* c = nullptr;
  int64_t a_offset = 0;  // elements from the start of A's buffer (a row block of delta^T)
  // Forward: every row of C starts from the bias (beta is 1), as LinearForward does.
  const float* bias = nullptr;
  // A cut row: C is the one-row scratch, and `copy_count` of its elements from `copy_from` go to
  // `copy_to`, as WeightGradient does.
  const float* copy_from = nullptr;
  float* copy_to = nullptr;
  int64_t copy_count = 0;

  void Run() const {
    if (bias != nullptr) {
      for (int64_t row = 0; row < m; ++row) std::copy(bias, bias + n, c + row * ldc);
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
                c, static_cast<int>(ldc));
    if (copy_count > 0) std::copy(copy_from, copy_from + copy_count, copy_to);
  }
  double Flops() const { return 2.0 * static_cast<double>(m) * n * k; }
};

// What a JSON line describes: one call, or (kWeightGradientBlocks) the sequence of `calls`.
struct Shape {
  std::string name;
  Kind kind = Kind::kForward;
  int layer = 0;  // Linear layer, forward order, 0-based
  // Times the MLP issues it per iteration: 2 for a forward (the teacher's and the student's).
  int calls_per_iteration = 1;
  std::string group;       // a block's sequence
  int64_t first_row = -1;  // a block's first output row (a cut row: the row)
  bool cut_row = false;
  std::vector<Gemm> calls;             // one, but a sequence's blocks
  int64_t rows_total = 0;              // a sequence's: the weight's rows
  float* gradient = nullptr;           // a sequence's: the whole weight gradient its blocks fill
  std::vector<double> samples_us;      // wall time of each timed run
  std::vector<double> cpu_samples_us;  // this thread's CPU time of the same runs
  double max_error = 0.0;              // against a double-precision product, on sampled elements
  uint64_t result_hash = 0;            // of the output's bits (the teacher's, for a forward)

  // A sequence counts the gradient's work once, though a cut row's call computes its whole row
  // for each of its two parts.
  double Flops() const {
    if (kind != Kind::kWeightGradientBlocks) return calls.front().Flops();
    return 2.0 * static_cast<double>(rows_total) * calls.front().n * calls.front().k;
  }
};

// The job's buffers, as the MLP holds them per rank, and every GEMM the MLP issues on them.
// Thread contract: not thread-safe; the bench runs on one thread.
struct Job {
  std::string preset;
  int64_t world_size = 1;
  std::vector<int64_t> sizes;
  int64_t batch = 0;
  std::vector<std::unique_ptr<Floats>> buffers;
  std::vector<Shape> shapes;  // in the order the MLP issues them (teacher, forward, backward)

  float* NewBuffer(int64_t count) {
    buffers.push_back(std::make_unique<Floats>(count, buffers.size() + 1));
    return buffers.back()->data();
  }
};

Gemm LinearForwardGemm(const float* in, const float* weight, const float* bias, int64_t batch,
                       int64_t in_size, int64_t out_size, float* out) {
  Gemm g;
  g.trans_a = false;
  g.trans_b = true;
  g.m = batch;
  g.n = out_size;
  g.k = in_size;
  g.lda = in_size;
  g.ldb = in_size;
  g.ldc = out_size;
  g.beta = 1.0f;
  g.a = in;
  g.b = weight;
  g.c = out;
  g.bias = bias;
  return g;
}

// WeightGradientRows: rows [first_row, first_row + rows) of delta^T activation into `out`.
Gemm WeightGradientGemm(const float* delta, const float* activation, int64_t batch, int64_t in_size,
                        int64_t out_size, int64_t first_row, int64_t rows, float* out) {
  Gemm g;
  g.trans_a = true;
  g.trans_b = false;
  g.m = rows;
  g.n = in_size;
  g.k = batch;
  g.lda = out_size;
  g.ldb = in_size;
  g.ldc = in_size;
  g.beta = 0.0f;
  g.a = delta + first_row;
  g.a_offset = first_row;
  g.b = activation;
  g.c = out;
  return g;
}

// The segments [begin, end) of tensor `tensor`'s gradient, as Engine::GradSegmentEnd cuts them:
// each ends at the tensor's end or at the end of the bucket holding `begin`.
std::vector<std::pair<int64_t, int64_t>> GradSegments(const sharding::ShardPlan& plan,
                                                      int64_t tensor) {
  const sharding::TensorPlacement& placement = plan.placement(tensor);
  std::vector<std::pair<int64_t, int64_t>> segments;
  for (int64_t begin = 0; begin < placement.num_elements;) {
    const int64_t bucket =
        std::min((placement.flat_offset + begin) / plan.bucket_elems(), plan.num_buckets() - 1);
    const int64_t end =
        std::min(placement.flat_end(), plan.buckets()[bucket].flat_end()) - placement.flat_offset;
    segments.emplace_back(begin, end);
    begin = end;
  }
  return segments;
}

absl::StatusOr<int64_t> TensorIndex(const sharding::ShardPlan& plan, absl::string_view name) {
  for (int64_t t = 0; t < plan.num_tensors(); ++t) {
    if (plan.tensors()[t].name == name) return t;
  }
  return absl::NotFoundError(absl::StrCat("no tensor ", name, " in the plan"));
}

absl::StatusOr<std::unique_ptr<Job>> MakeJob(absl::string_view spec, int64_t batch) {
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  auto job = std::make_unique<Job>();
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &job->world_size)) {
    return absl::InvalidArgumentError(absl::StrCat("jobs: '", spec, "' is not preset:world_size"));
  }
  job->preset = parts[0];
  job->batch = batch;
  v1::JobSpec job_spec;
  job_spec.mutable_workload()->set_preset(job->preset);
  job_spec.set_global_batch(batch * job->world_size);
  job_spec = jobspec::WithDefaults(job_spec);
  ZS_ASSIGN_OR_RETURN(const sharding::ShardPlan plan,
                      jobspec::PlanForJob(job_spec, job->world_size));
  sharding::WorkloadSpec workload;
  workload.preset = job->preset;
  ZS_ASSIGN_OR_RETURN(job->sizes, sharding::ResolveLayerSizes(workload));
  const std::vector<int64_t>& sizes = job->sizes;
  const int layers = static_cast<int>(sizes.size()) - 1;

  std::vector<float*> activations, teacher_out, forward_out, deltas, teacher_w, student_w, biases,
      input_grads, whole_dw, blocked_dw;
  for (int l = 0; l <= layers; ++l) activations.push_back(job->NewBuffer(batch * sizes[l]));
  int64_t max_size = 0;
  for (int l = 0; l < layers; ++l) {
    const int64_t in = sizes[l];
    const int64_t out = sizes[l + 1];
    max_size = std::max({max_size, in, out});
    teacher_w.push_back(job->NewBuffer(out * in));
    student_w.push_back(job->NewBuffer(out * in));
    biases.push_back(job->NewBuffer(out));
    teacher_out.push_back(job->NewBuffer(batch * out));
    forward_out.push_back(job->NewBuffer(batch * out));
    deltas.push_back(job->NewBuffer(batch * out));
    input_grads.push_back(job->NewBuffer(batch * in));
    whole_dw.push_back(job->NewBuffer(out * in));
    blocked_dw.push_back(job->NewBuffer(out * in));
  }
  float* row_scratch = job->NewBuffer(max_size);

  auto add = [&job](std::string name, Kind kind, int layer, Gemm gemm) {
    Shape shape;
    shape.name = std::move(name);
    shape.kind = kind;
    shape.layer = layer;
    shape.calls.push_back(gemm);
    job->shapes.push_back(std::move(shape));
  };
  // LoadMicroBatch's teacher forward, then the student's: the same calls on other weights.
  for (int l = 0; l < layers; ++l) {
    add(absl::StrCat("fwd_l", l), Kind::kForward, l,
        LinearForwardGemm(activations[l], teacher_w[l], biases[l], batch, sizes[l], sizes[l + 1],
                          teacher_out[l]));
  }
  for (int l = 0; l < layers; ++l) {
    add(absl::StrCat("fwd_l", l), Kind::kForward, l,
        LinearForwardGemm(activations[l], student_w[l], biases[l], batch, sizes[l], sizes[l + 1],
                          forward_out[l]));
  }
  for (int l = layers - 1; l >= 0; --l) {
    const int64_t in = sizes[l];
    const int64_t out = sizes[l + 1];
    add(absl::StrCat("dw_l", l), Kind::kWeightGradient, l,
        WeightGradientGemm(deltas[l], activations[l], batch, in, out, 0, out, whole_dw[l]));

    // The blocks WeightGradient issues for this plan's segments.
    ZS_ASSIGN_OR_RETURN(const int64_t tensor, TensorIndex(plan, absl::StrCat(2 * l, ".weight")));
    Shape sequence;
    sequence.name = absl::StrCat("dw_l", l, "_blocked");
    sequence.kind = Kind::kWeightGradientBlocks;
    sequence.layer = l;
    sequence.rows_total = out;
    sequence.gradient = blocked_dw[l];
    std::vector<Shape> blocks;
    for (const auto& [begin, end] : GradSegments(plan, tensor)) {
      float* segment = blocked_dw[l] + begin;
      ZS_RETURN_IF_ERROR(workloads::ForEachRowBlock(
          begin, end, in,
          [&](int64_t row, int64_t from, int64_t to, int64_t offset) {
            Gemm g =
                WeightGradientGemm(deltas[l], activations[l], batch, in, out, row, 1, row_scratch);
            g.copy_from = row_scratch + (from - row * in);
            g.copy_to = segment + offset;
            g.copy_count = to - from;
            Shape block;
            block.cut_row = true;
            block.first_row = row;
            block.calls.push_back(g);
            blocks.push_back(std::move(block));
            return absl::OkStatus();
          },
          [&](int64_t first_row, int64_t rows, int64_t offset) {
            Shape block;
            block.first_row = first_row;
            block.calls.push_back(WeightGradientGemm(deltas[l], activations[l], batch, in, out,
                                                     first_row, rows, segment + offset));
            blocks.push_back(std::move(block));
            return absl::OkStatus();
          }));
    }
    for (size_t b = 0; b < blocks.size(); ++b) {
      blocks[b].name = absl::StrCat("dw_l", l, "_block", b);
      blocks[b].kind = Kind::kWeightGradientBlock;
      blocks[b].layer = l;
      blocks[b].group = sequence.name;
      sequence.calls.push_back(blocks[b].calls.front());
    }
    job->shapes.push_back(std::move(sequence));
    for (Shape& block : blocks) job->shapes.push_back(std::move(block));

    if (l == 0) break;  // the first layer's input needs no gradient
    Gemm dx;
    dx.m = batch;
    dx.n = in;
    dx.k = out;
    dx.lda = out;
    dx.ldb = in;
    dx.ldc = in;
    dx.a = deltas[l];
    dx.b = student_w[l];
    dx.c = input_grads[l];
    add(absl::StrCat("dx_l", l), Kind::kInputGradient, l, dx);
  }
  return job;
}

// The largest |C - A B (+ bias)| over sampled elements of C, each divided by the sum of the
// absolute values of its terms (so about float's epsilon times a small factor when right).
double MaxError(const Gemm& g) {
  double worst = 0.0;
  const int64_t samples = 64;
  for (int64_t s = 0; s < samples; ++s) {
    const int64_t i = (s * 7919) % g.m;
    const int64_t j = (s * 104729) % g.n;
    double sum = g.bias != nullptr ? g.bias[j] : 0.0;
    double magnitude = std::fabs(sum);
    for (int64_t p = 0; p < g.k; ++p) {
      const double a = g.trans_a ? g.a[p * g.lda + i] : g.a[i * g.lda + p];
      const double b = g.trans_b ? g.b[j * g.ldb + p] : g.b[p * g.ldb + j];
      sum += a * b;
      magnitude += std::fabs(a * b);
    }
    if (magnitude > 0.0) worst = std::max(worst, std::fabs(g.c[i * g.ldc + j] - sum) / magnitude);
  }
  return worst;
}

// FNV-1a over the bits of a rows x cols output with row stride `ld`. Every process fills the
// operands with the same values, so equal hashes across runs or libraries mean equal bits.
uint64_t ResultHash(const float* c, int64_t rows, int64_t cols, int64_t ld) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (int64_t i = 0; i < rows; ++i) {
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(c + i * ld);
    for (int64_t b = 0; b < cols * static_cast<int64_t>(sizeof(float)); ++b) {
      hash = (hash ^ bytes[b]) * 0x100000001b3ull;
    }
  }
  return hash;
}

// The library that provides cblas_sgemm to this process (LD_PRELOAD or LD_LIBRARY_PATH may
// swap it), with its version and kernel; "threads" is its thread count where it tells.
struct BlasInfo {
  std::string library;
  std::string path;
  std::string config;
  int threads = -1;
};

BlasInfo DescribeBlas() {
  BlasInfo info;
  Dl_info where;
  void* sgemm = dlsym(RTLD_DEFAULT, "cblas_sgemm");
  if (sgemm == nullptr || dladdr(sgemm, &where) == 0 || where.dli_fname == nullptr) {
    info.library = "unknown";
    return info;
  }
  info.path = where.dli_fname;
  void* handle = dlopen(where.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) {
    info.library = info.path;
    return info;
  }
  using StringFn = const char* (*)();
  using IntFn = int (*)();
  if (auto config = reinterpret_cast<StringFn>(dlsym(handle, "openblas_get_config"))) {
    auto corename = reinterpret_cast<StringFn>(dlsym(handle, "openblas_get_corename"));
    auto threads = reinterpret_cast<IntFn>(dlsym(handle, "openblas_get_num_threads"));
    info.config = config();
    std::vector<std::string> words = absl::StrSplit(info.config, ' ');
    info.library = absl::StrCat(words[0], " ", words.size() > 1 ? words[1] : "", " (",
                                corename != nullptr ? corename() : "?", ")");
    if (threads != nullptr) info.threads = threads();
  } else if (auto version = reinterpret_cast<StringFn>(dlsym(handle, "bli_info_get_version_str"))) {
    using ArchIdFn = int (*)();
    using ArchNameFn = const char* (*)(int);
    auto arch_id = reinterpret_cast<ArchIdFn>(dlsym(handle, "bli_arch_query_id"));
    auto arch_name = reinterpret_cast<ArchNameFn>(dlsym(handle, "bli_arch_string"));
    auto threads = reinterpret_cast<IntFn>(dlsym(handle, "bli_thread_get_num_threads"));
    const char* arch = arch_id != nullptr && arch_name != nullptr ? arch_name(arch_id()) : "?";
    info.library = absl::StrCat("BLIS ", version(), " (", arch, ")");
    info.config = info.library;
    if (threads != nullptr) info.threads = threads();
  } else {
    info.library = info.path;
  }
  dlclose(handle);
  return info;
}

double CpuSeconds(clockid_t clock) {
  timespec t;
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// A point in time on both clocks: wall, and the CPU time of this thread, which other processes
// taking the core do not advance (this machine is shared; the BLAS runs on this thread). Reading
// the CPU clock is a system call: a start reads it before the wall clock and an end after, so
// the wall intervals leave it out (the CPU ones hold about one, a fraction of a microsecond).
struct Stamp {
  std::chrono::steady_clock::time_point wall;
  double cpu_seconds;
  static Stamp Start() {
    const double cpu = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
    return {std::chrono::steady_clock::now(), cpu};
  }
  static Stamp End() {
    const std::chrono::steady_clock::time_point wall = std::chrono::steady_clock::now();
    return {wall, CpuSeconds(CLOCK_THREAD_CPUTIME_ID)};
  }
};

// Appends the interval [from, to) in microseconds, wall and CPU, to `shape`.
void AddSample(const Stamp& from, const Stamp& to, Shape& shape) {
  shape.samples_us.push_back(
      std::chrono::duration<double, std::micro>(to.wall - from.wall).count());
  shape.cpu_samples_us.push_back(1e6 * (to.cpu_seconds - from.cpu_seconds));
}

std::string Bool(bool value) { return value ? "true" : "false"; }

// The fields that say which call a line is about (shared by --list and the timed lines).
std::string ShapeFields(const Job& job, const Shape& shape) {
  const Gemm& g = shape.calls.front();
  const int64_t m = shape.kind == Kind::kWeightGradientBlocks ? shape.rows_total : g.m;
  std::string fields = absl::StrCat(
      "\"job\":\"", job.preset, "\",\"world_size\":", job.world_size, ",\"shape\":\"", shape.name,
      "\",\"kind\":\"", KindName(shape.kind), "\",\"layer\":", shape.layer, ",\"m\":", m,
      ",\"n\":", g.n, ",\"k\":", g.k, ",\"trans_a\":", Bool(g.trans_a),
      ",\"trans_b\":", Bool(g.trans_b), ",\"lda\":", g.lda, ",\"ldb\":", g.ldb, ",\"ldc\":", g.ldc,
      ",\"beta\":", g.beta, ",\"a_offset\":", g.a_offset, ",\"bias\":", Bool(g.bias != nullptr),
      ",\"calls_per_iteration\":", shape.calls_per_iteration);
  if (shape.kind == Kind::kWeightGradientBlocks) {
    absl::StrAppend(&fields, ",\"calls\":", shape.calls.size());
  }
  if (shape.kind == Kind::kWeightGradientBlock) {
    absl::StrAppend(&fields, ",\"group\":\"", shape.group, "\",\"first_row\":", shape.first_row,
                    ",\"rows\":", g.m, ",\"cut_row\":", Bool(shape.cut_row));
  }
  return fields;
}

// Shapes with the same name (the teacher's and the student's forward) make one line.
std::vector<Shape*> DistinctShapes(Job& job) {
  std::vector<Shape*> distinct;
  std::map<std::string, Shape*> by_name;
  for (Shape& shape : job.shapes) {
    auto [it, inserted] = by_name.emplace(shape.name, &shape);
    if (inserted) {
      distinct.push_back(&shape);
    } else {
      it->second->calls_per_iteration += 1;
    }
  }
  return distinct;
}

void RunJob(Job& job, const BlasInfo& blas, int reps, int warmup) {
  using Clock = std::chrono::steady_clock;
  std::vector<Shape*> distinct = DistinctShapes(job);
  std::map<std::string, Shape*> by_name;
  for (Shape* shape : distinct) by_name[shape->name] = shape;
  // A sequence's block lines, by sequence name, in call order.
  std::map<std::string, std::vector<Shape*>> blocks_of;
  for (Shape* shape : distinct) {
    if (shape->kind == Kind::kWeightGradientBlock) blocks_of[shape->group].push_back(shape);
  }

  // Every pass runs the calls in the MLP's order; a layer's whole dW and its blocks alternate
  // which goes first, so neither always finds the other's operands in cache.
  std::vector<Stamp> call_ends;
  call_ends.reserve(job.shapes.size());
  double cpu = 0.0, wall = 0.0;
  for (int pass = 0; pass < warmup + reps; ++pass) {
    const bool timed = pass >= warmup;
    const double cpu_start = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
    const Clock::time_point pass_start = Clock::now();
    std::vector<const Shape*> order;
    for (size_t s = 0; s < job.shapes.size(); ++s) {
      const Shape& shape = job.shapes[s];
      if (shape.kind == Kind::kWeightGradientBlock) continue;  // timed inside their sequence
      const bool swap = pass % 2 == 1 && shape.kind == Kind::kWeightGradient &&
                        s + 1 < job.shapes.size() &&
                        job.shapes[s + 1].kind == Kind::kWeightGradientBlocks;
      if (swap) {
        order.push_back(&job.shapes[s + 1]);
        order.push_back(&shape);
        ++s;
      } else {
        order.push_back(&shape);
      }
    }
    for (const Shape* shape : order) {
      call_ends.clear();
      const Stamp start = Stamp::Start();
      for (const Gemm& call : shape->calls) {
        call.Run();
        call_ends.push_back(Stamp::End());
      }
      if (!timed) continue;
      AddSample(start, call_ends.back(), *by_name[shape->name]);
      if (shape->kind == Kind::kWeightGradientBlocks) {
        const std::vector<Shape*>& blocks = blocks_of[shape->name];
        for (size_t c = 0; c < blocks.size(); ++c) {
          AddSample(c == 0 ? start : call_ends[c - 1], call_ends[c], *blocks[c]);
        }
      }
    }
    if (timed) {
      cpu += CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - cpu_start;
      wall += std::chrono::duration<double>(Clock::now() - pass_start).count();
    }
  }

  for (Shape& shape : job.shapes) {
    Shape* line = by_name[shape.name];
    if (shape.kind == Kind::kWeightGradientBlocks) {
      // The blocks (cut rows through the scratch) filled the whole gradient: check it as one call.
      Gemm whole = by_name[absl::StrCat("dw_l", shape.layer)]->calls.front();
      whole.c = shape.gradient;
      line->max_error = MaxError(whole);
      line->result_hash = ResultHash(whole.c, whole.m, whole.n, whole.ldc);
    } else if (shape.kind != Kind::kWeightGradientBlock) {
      const Gemm& call = shape.calls.front();
      if (line->result_hash == 0) line->result_hash = ResultHash(call.c, call.m, call.n, call.ldc);
      line->max_error = std::max(line->max_error, MaxError(call));
    }
  }

  // Per iteration: the forwards and input gradients, plus the weight gradients either as the
  // blocks the engine's segments make (ours) or as whole calls (torch's autograd); wall and CPU.
  double blocked_us[2] = {0.0, 0.0}, whole_us[2] = {0.0, 0.0}, flops = 0.0;
  for (Shape* shape : distinct) {
    const double median[2] = {Median(shape->samples_us), Median(shape->cpu_samples_us)};
    for (int clock = 0; clock < 2; ++clock) {
      const double per_iteration = shape->calls_per_iteration * median[clock];
      if (shape->kind == Kind::kForward || shape->kind == Kind::kInputGradient) {
        blocked_us[clock] += per_iteration;
        whole_us[clock] += per_iteration;
      } else if (shape->kind == Kind::kWeightGradient) {
        whole_us[clock] += per_iteration;
      } else if (shape->kind == Kind::kWeightGradientBlocks) {
        blocked_us[clock] += per_iteration;
      }
    }
    if (shape->kind == Kind::kForward || shape->kind == Kind::kInputGradient ||
        shape->kind == Kind::kWeightGradient) {
      flops += shape->calls_per_iteration * shape->Flops();
    }
    const bool block = shape->kind == Kind::kWeightGradientBlock;
    std::printf(
        "{\"bench\":\"gemm\",\"library\":\"%s\",%s,\"threads\":%d,\"gflops\":%.2f,"
        "\"median_us\":%.3f,\"min_us\":%.3f,\"gflops_cpu\":%.2f,\"median_cpu_us\":%.3f,"
        "\"reps\":%zu,\"max_rel_error\":%s,\"result_fnv1a\":%s}\n",
        blas.library.c_str(), ShapeFields(job, *shape).c_str(), blas.threads,
        shape->Flops() / median[0] / 1e3, median[0],
        *std::min_element(shape->samples_us.begin(), shape->samples_us.end()),
        shape->Flops() / median[1] / 1e3, median[1], shape->samples_us.size(),
        // A block is checked as part of its sequence's gradient.
        block ? "null" : absl::StrFormat("%.2e", shape->max_error).c_str(),
        block ? "null" : absl::StrFormat("\"%016x\"", shape->result_hash).c_str());
  }
  std::printf(
      "{\"bench\":\"gemm_iteration\",\"library\":\"%s\",\"job\":\"%s\",\"world_size\":%lld,"
      "\"per_rank_batch\":%lld,\"threads\":%d,\"gflop\":%.6f,\"ms_blocked_dw\":%.4f,"
      "\"ms_whole_dw\":%.4f,\"ms_blocked_dw_cpu\":%.4f,\"ms_whole_dw_cpu\":%.4f,"
      "\"cpu_per_wall\":%.3f,\"blas_path\":\"%s\",\"blas_config\":\"%s\"}\n",
      blas.library.c_str(), job.preset.c_str(), static_cast<long long>(job.world_size),
      static_cast<long long>(job.batch), blas.threads, flops / 1e9, blocked_us[0] / 1e3,
      whole_us[0] / 1e3, blocked_us[1] / 1e3, whole_us[1] / 1e3, wall > 0.0 ? cpu / wall : 0.0,
      blas.path.c_str(), blas.config.c_str());
  std::fflush(stdout);
}

}  // namespace
}  // namespace zeroshard::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  namespace bench = zeroshard::bench;
  const int reps = absl::GetFlag(FLAGS_reps);
  if (reps < 10) bench::CheckOk(absl::InvalidArgumentError("at least 10"), "reps");
  // As the MLP does (TeacherStudentMlp::Create): one BLAS thread.
  openblas_set_num_threads(1);
  const bench::BlasInfo blas = bench::DescribeBlas();
  for (const std::string& spec : absl::GetFlag(FLAGS_jobs)) {
    absl::StatusOr<std::unique_ptr<bench::Job>> job =
        bench::MakeJob(spec, absl::GetFlag(FLAGS_per_rank_batch));
    bench::CheckOk(job.status(), "job");
    if (absl::GetFlag(FLAGS_list)) {
      for (bench::Shape* shape : bench::DistinctShapes(**job)) {
        std::printf("{\"bench\":\"gemm_shape\",%s}\n", bench::ShapeFields(**job, *shape).c_str());
      }
      continue;
    }
    bench::RunJob(**job, blas, reps, absl::GetFlag(FLAGS_warmup));
  }
  return 0;
}

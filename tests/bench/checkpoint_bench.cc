// checkpoint_bench: issue 12's checkpoint figures on real processes (tests/integration's
// LocalCluster: a coordinator and W + 1 workers on loopback, checkpoints under its root). Each
// round trains the same job without checkpoints, with one every N steps for each N of
// --every_steps and with one every step, in alternating order; then kills a worker with kill -9
// mid-job while a spare is idle and times the recovery. Run: bazel run -c opt
// //tests/bench:checkpoint_bench (figures in docs/performance/checkpoints.md).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/manifest.h"
#include "sharding/model_catalog.h"
#include "tests/integration/local_cluster.h"
#include "zeroshard/v1/job.pb.h"

ABSL_FLAG(std::string, preset, "medium", "the workload preset (sharding/model_catalog.cc)");
ABSL_FLAG(int, world_size, 2, "workers per job (one more runs as the spare)");
ABSL_FLAG(std::string, mode, "zero2", "ddp, zero1 or zero2");
ABSL_FLAG(std::vector<std::string>, every_steps, std::vector<std::string>({"8", "40"}),
          "checkpoint intervals measured besides every step, comma-separated; the first is the "
          "recovery job's. Choose them no shorter than a checkpoint's write time (the output's "
          "write_s and interval_s say whether they are)");
ABSL_FLAG(int64_t, steps, 46, "training steps per job");
ABSL_FLAG(int64_t, warmup, 5, "steps at the start of each job left out of its step time");
ABSL_FLAG(int, rounds, 2, "rounds of every variant (alternating order) and of the recovery");
ABSL_FLAG(int64_t, global_batch, 64, "samples per step over all ranks");
ABSL_FLAG(int, threads, 1, "each worker's --threads");
ABSL_FLAG(bool, recovery, true, "also time recovery from kill -9 of a worker");
ABSL_FLAG(bool, only_recovery, false,
          "time only the recovery (--rounds kills, with the first --every_steps interval) and "
          "print one checkpoint_recovery summary instead of the checkpoint ones");
ABSL_FLAG(std::string, base_dir, "",
          "the cluster's logs, state and checkpoints, kept (default: a new directory under /tmp, "
          "deleted when the bench succeeds); each job's checkpoints are deleted once it is "
          "measured");

namespace zeroshard::bench {
namespace {

using testing::LocalCluster;

constexpr absl::Duration kJobDeadline = absl::Minutes(10);

void Die(const std::string& message) {
  std::fprintf(stderr, "checkpoint_bench: %s\n", message.c_str());
  std::exit(1);
}

void CheckOk(const absl::Status& status, const std::string& what) {
  if (!status.ok()) Die(absl::StrCat(what, ": ", status.ToString()));
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2.0;
}

double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double one_minute = 0.0;
  in >> one_minute;
  return one_minute;
}

absl::Time EventTime(const v1::JobEvent& event) {
  return absl::FromUnixSeconds(event.time().seconds()) + absl::Nanoseconds(event.time().nanos());
}

std::string JsonNumbers(const std::vector<double>& values, int decimals) {
  std::vector<std::string> parts;
  for (double value : values) parts.push_back(absl::StrFormat("%.*f", decimals, value));
  return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
}

// One rank's CheckpointWriterStats, from the line its worker logs when a run ends.
struct RankWrites {
  int64_t written = 0;
  int64_t skipped = 0;
  int64_t failed = 0;
  int64_t bytes = 0;
  absl::Duration write_time;
  double gbps() const {
    const double seconds = absl::ToDoubleSeconds(write_time);
    return seconds > 0.0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
  }
  // Mean write time of one checkpoint.
  double write_s() const {
    return written > 0 ? absl::ToDoubleSeconds(write_time) / static_cast<double>(written) : 0.0;
  }
};

// Every rank's writer figures for `job_id`, from the logs of every worker process ever started
// (a worker logs "<job> rank <r> checkpoints: N written (B bytes in T), S skipped, F failed").
absl::StatusOr<std::vector<RankWrites>> ReadRankWrites(const LocalCluster& cluster,
                                                       const std::string& job_id, int world_size) {
  const std::regex line_pattern(
      absl::StrCat(job_id, R"( rank (\d+) checkpoints: (\d+) written \((\d+) bytes in ([^)]+)\), )",
                   R"((\d+) skipped, (\d+) failed)"));
  std::map<int, RankWrites> by_rank;
  for (int index = 0; index < cluster.worker_count(); ++index) {
    std::ifstream log(cluster.worker_process(index).log_path);
    for (std::string line; std::getline(log, line);) {
      std::smatch match;
      if (!std::regex_search(line, match, line_pattern)) continue;
      RankWrites writes;
      int rank = -1;
      if (!absl::SimpleAtoi(match[1].str(), &rank) ||
          !absl::SimpleAtoi(match[2].str(), &writes.written) ||
          !absl::SimpleAtoi(match[3].str(), &writes.bytes) ||
          !absl::ParseDuration(match[4].str(), &writes.write_time) ||
          !absl::SimpleAtoi(match[5].str(), &writes.skipped) ||
          !absl::SimpleAtoi(match[6].str(), &writes.failed)) {
        return absl::DataLossError(absl::StrCat("cannot parse \"", line, "\""));
      }
      by_rank[rank] = writes;
    }
  }
  std::vector<RankWrites> ranks;
  for (int rank = 0; rank < world_size; ++rank) {
    auto found = by_rank.find(rank);
    if (found == by_rank.end()) {
      return absl::NotFoundError(
          absl::StrCat(job_id, ": no worker log has rank ", rank, "'s checkpoint figures"));
    }
    ranks.push_back(found->second);
  }
  return ranks;
}

std::vector<v1::JobEvent> Events(LocalCluster& cluster, const std::string& job_id) {
  absl::StatusOr<std::vector<v1::JobEvent>> events = cluster.JobEvents(job_id);
  CheckOk(events.status(), absl::StrCat("watch ", job_id));
  return *std::move(events);
}

v1::Job WaitForJob(LocalCluster& cluster, const std::string& job_id,
                   const std::function<bool(const v1::Job&)>& done, absl::string_view what) {
  v1::Job last;
  CheckOk(cluster.WaitFor(
              [&] {
                absl::StatusOr<v1::Job> job = cluster.client().GetJob(job_id);
                if (!job.ok()) return false;
                last = *std::move(job);
                return done(last) || testing::IsFinalJobState(last.state());
              },
              kJobDeadline, absl::StrCat(job_id, ": ", what)),
          "waiting");
  return last;
}

v1::Job RunToEnd(LocalCluster& cluster, const v1::JobSpec& spec) {
  absl::StatusOr<v1::Job> submitted = cluster.client().SubmitJob(spec);
  CheckOk(submitted.status(), absl::StrCat("submit ", spec.name()));
  v1::Job ended = WaitForJob(
      cluster, submitted->id(), [](const v1::Job&) { return false; }, "ended");
  if (ended.state() != v1::SUCCEEDED) {
    Die(absl::StrCat(ended.id(), " ended ", v1::JobState_Name(ended.state()), ": ", ended.message(),
                     "\n", cluster.LogTails()));
  }
  return ended;
}

// The job's checkpoints: hundreds of MB per job on `medium`.
void DeleteCheckpoints(const LocalCluster& cluster, const v1::Job& job) {
  std::error_code ignored;
  std::filesystem::remove_all(
      checkpoint::JobCheckpointDir(cluster.checkpoint_root(), job.spec().checkpoint().dir()),
      ignored);
}

v1::JobSpec Spec(const std::string& name, int64_t every_steps) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_workload()->set_preset(absl::GetFlag(FLAGS_preset));
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.mutable_optimizer()->set_lr(0.001);
  v1::Mode mode = v1::MODE_UNSPECIFIED;
  if (!v1::Mode_Parse(absl::AsciiStrToUpper(absl::GetFlag(FLAGS_mode)), &mode)) {
    Die(absl::StrCat("unknown --mode ", absl::GetFlag(FLAGS_mode)));
  }
  spec.set_mode(mode);
  spec.set_min_workers(absl::GetFlag(FLAGS_world_size));
  spec.set_max_workers(absl::GetFlag(FLAGS_world_size));
  spec.set_global_batch(absl::GetFlag(FLAGS_global_batch));
  spec.set_steps(absl::GetFlag(FLAGS_steps));
  spec.set_seed(1);
  spec.mutable_checkpoint()->set_every_steps(every_steps);
  spec.mutable_checkpoint()->set_keep(2);
  spec.set_max_attempts(3);
  return spec;
}

// One measured job.
struct JobFigures {
  std::string job_id;
  std::string variant;
  int64_t every_steps = 0;
  int round = 0;
  double load_average = 0.0;
  // The measured steps: (warmup, window_end], a whole number of checkpoint intervals (so each
  // interval's checkpoint counts once) ending before the last step, whose report comes after
  // the final checkpoint is written.
  int64_t window_end = 0;
  // Wall time per measured step, between rank 0's reports of steps `warmup` and `window_end`:
  // the whole loop, staging copies and the writer thread's share of the cores included.
  double wall_ms_per_step = 0.0;
  // StepMetrics.iteration_ms over the same steps: forward + backward + Engine::Step only.
  double iteration_ms = 0.0;
  // Checkpoints due per rank: every `every_steps` steps before the last, and the final one.
  int64_t due = 0;
  int64_t committed = 0;
  std::vector<RankWrites> ranks;

  int64_t Sum(int64_t RankWrites::*field) const {
    int64_t total = 0;
    for (const RankWrites& rank : ranks) total += rank.*field;
    return total;
  }
};

JobFigures MeasureJob(LocalCluster& cluster, const std::string& variant, int64_t every_steps,
                      int round) {
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  const int64_t warmup = absl::GetFlag(FLAGS_warmup);
  JobFigures figures;
  figures.variant = variant;
  figures.every_steps = every_steps;
  figures.round = round;
  figures.load_average = LoadAverage();
  const v1::Job job = RunToEnd(cluster, Spec(absl::StrCat("ckpt-", variant), every_steps));
  figures.job_id = job.id();

  const int64_t interval = std::max<int64_t>(every_steps, 1);
  figures.window_end = warmup + (steps - 1 - warmup) / interval * interval;
  std::map<int64_t, absl::Time> reported;
  std::vector<double> iteration_ms;
  for (const v1::JobEvent& event : Events(cluster, job.id())) {
    if (event.type() == v1::CHECKPOINT_COMMITTED) ++figures.committed;
    if (event.type() != v1::PROGRESS || event.generation() != 1) continue;
    const int64_t step = event.progress().step();
    reported[step] = EventTime(event);
    if (step > warmup && step <= figures.window_end) {
      iteration_ms.push_back(event.progress().iteration_ms());
    }
  }
  if (reported.count(warmup) == 0 || reported.count(figures.window_end) == 0) {
    Die(absl::StrCat(job.id(), ": no progress report of step ", warmup, " or ",
                     figures.window_end));
  }
  figures.wall_ms_per_step =
      absl::ToDoubleMilliseconds(reported[figures.window_end] - reported[warmup]) /
      static_cast<double>(figures.window_end - warmup);
  figures.iteration_ms = Median(iteration_ms);
  figures.due = (every_steps > 0 ? (steps - 1) / every_steps : 0) + 1;
  absl::StatusOr<std::vector<RankWrites>> ranks =
      ReadRankWrites(cluster, job.id(), absl::GetFlag(FLAGS_world_size));
  CheckOk(ranks.status(), "writer figures");
  figures.ranks = *std::move(ranks);
  DeleteCheckpoints(cluster, job);

  std::vector<double> gbps;
  std::vector<double> write_s;
  for (const RankWrites& rank : figures.ranks) {
    gbps.push_back(rank.gbps());
    write_s.push_back(rank.write_s());
  }
  std::printf(
      "{\"bench\":\"checkpoint_run\",\"job\":\"%s\",\"variant\":\"%s\",\"every_steps\":%lld,"
      "\"round\":%d,\"load_average\":%.2f,\"measured_steps\":%lld,\"wall_ms_per_step\":%.1f,"
      "\"iteration_ms\":%.1f,"
      "\"due_per_rank\":%lld,\"written\":%lld,\"skipped\":%lld,\"failed\":%lld,"
      "\"committed\":%lld,\"write_gbps_per_rank\":%s,\"write_s_per_rank\":%s}\n",
      figures.job_id.c_str(), variant.c_str(), static_cast<long long>(every_steps), round,
      figures.load_average, static_cast<long long>(figures.window_end - warmup),
      figures.wall_ms_per_step, figures.iteration_ms, static_cast<long long>(figures.due),
      static_cast<long long>(figures.Sum(&RankWrites::written)),
      static_cast<long long>(figures.Sum(&RankWrites::skipped)),
      static_cast<long long>(figures.Sum(&RankWrites::failed)),
      static_cast<long long>(figures.committed), JsonNumbers(gbps, 3).c_str(),
      JsonNumbers(write_s, 3).c_str());
  std::fflush(stdout);
  return figures;
}

// The workers of the cluster that still run, by name.
std::vector<std::string> LiveWorkerNames(const LocalCluster& cluster) {
  std::vector<std::string> names;
  for (int index = 0; index < cluster.worker_count(); ++index) {
    if (cluster.worker_process(index).running()) {
      names.push_back(cluster.worker_process(index).name);
    }
  }
  return names;
}

struct RecoveryFigures {
  double detect_s = 0.0;      // kill -9 to the job's generation ending (RECOVERING)
  double generation_s = 0.0;  // kill -9 to the next generation's start
  double recovery_s = 0.0;    // kill -9 to the next generation's first completed step
  int64_t last_step_before = 0;
  int64_t resumed_from = 0;
};

// Kills rank 1's worker once the job has committed a checkpoint and run half an interval past
// its latest one; a spare takes its place. Starts a new worker so that the next round has a
// spare too.
RecoveryFigures MeasureRecovery(LocalCluster& cluster, int64_t every_steps, int round,
                                int* next_worker_number) {
  const double load_average = LoadAverage();
  v1::JobSpec spec = Spec("ckpt-recovery", every_steps);
  // Long enough for the kill (after 1.5 to 2 intervals) and a few intervals after it.
  spec.set_steps(std::min(spec.steps(), 4 * every_steps));
  absl::StatusOr<v1::Job> submitted = cluster.client().SubmitJob(spec);
  CheckOk(submitted.status(), "submit the recovery job");
  const v1::Job running = WaitForJob(
      cluster, submitted->id(),
      [&](const v1::Job& job) {
        return job.state() == v1::RUNNING && job.latest_checkpoint().step() >= every_steps &&
               job.progress().step() >= job.latest_checkpoint().step() + every_steps / 2;
      },
      "a committed checkpoint and half an interval more");
  if (running.state() != v1::RUNNING) {
    Die(absl::StrCat(running.id(), " ended before the kill: ", running.message()));
  }
  std::optional<int> victim;
  for (int index = 0; index < cluster.worker_count(); ++index) {
    absl::StatusOr<v1::WorkerInfo> info = cluster.FindWorker(cluster.worker_process(index).name);
    if (info.ok() && info->id() == running.worker_ids(1) &&
        cluster.worker_process(index).running()) {
      victim = index;
    }
  }
  if (!victim.has_value()) Die(absl::StrCat("no local worker is ", running.worker_ids(1)));
  const absl::Time killed_at = absl::Now();
  CheckOk(cluster.KillWorker(*victim, SIGKILL), "kill -9");

  const v1::Job ended = WaitForJob(
      cluster, running.id(), [](const v1::Job&) { return false; }, "ended");
  if (ended.state() != v1::SUCCEEDED) {
    Die(absl::StrCat(ended.id(), " ended ", v1::JobState_Name(ended.state()), ": ", ended.message(),
                     "\n", cluster.LogTails()));
  }
  CheckOk(cluster.WaitForWorkerExit(*victim, absl::Seconds(10)).status(), "reap the killed worker");
  RecoveryFigures figures;
  std::optional<absl::Time> detected;
  std::optional<absl::Time> started;
  std::optional<absl::Time> first_step;
  for (const v1::JobEvent& event : Events(cluster, ended.id())) {
    if (event.type() == v1::STATE_CHANGED && event.state() == v1::RECOVERING && !detected) {
      detected = EventTime(event);
    }
    if (event.type() == v1::GENERATION_STARTED && event.generation() == 2) {
      started = EventTime(event);
    }
    if (event.type() != v1::PROGRESS) continue;
    if (event.generation() == 1) {
      figures.last_step_before = std::max(figures.last_step_before, event.progress().step());
    } else if (event.generation() == 2 && !first_step) {
      first_step = EventTime(event);
      figures.resumed_from = event.progress().step() - 1;
    }
  }
  if (!detected || !started || !first_step) {
    Die(absl::StrCat(ended.id(), ": no recovery to generation 2 in its events"));
  }
  figures.detect_s = absl::ToDoubleSeconds(*detected - killed_at);
  figures.generation_s = absl::ToDoubleSeconds(*started - killed_at);
  figures.recovery_s = absl::ToDoubleSeconds(*first_step - killed_at);
  DeleteCheckpoints(cluster, ended);
  std::printf(
      "{\"bench\":\"checkpoint_recovery_run\",\"job\":\"%s\",\"round\":%d,\"every_steps\":%lld,"
      "\"load_average\":%.2f,\"killed\":\"%s\",\"detect_s\":%.3f,\"generation_s\":%.3f,"
      "\"recovery_s\":%.3f,\"last_step_before\":%lld,\"resumed_from\":%lld,"
      "\"steps_lost\":%lld}\n",
      ended.id().c_str(), round, static_cast<long long>(every_steps), load_average,
      cluster.worker_process(*victim).name.c_str(), figures.detect_s, figures.generation_s,
      figures.recovery_s, static_cast<long long>(figures.last_step_before),
      static_cast<long long>(figures.resumed_from),
      static_cast<long long>(figures.last_step_before - figures.resumed_from));
  std::fflush(stdout);

  CheckOk(cluster.StartWorker(absl::StrCat("worker-", (*next_worker_number)++)).status(),
          "start a new spare");
  CheckOk(cluster.WaitForWorkerStates(LiveWorkerNames(cluster), v1::IDLE, absl::Seconds(60)),
          "the workers idle again");
  return figures;
}

// The summary of one checkpoint interval against the runs without checkpoints.
void PrintSummary(int64_t params, int64_t every_steps, const std::vector<JobFigures>& without,
                  const std::vector<JobFigures>& with, int64_t recovery_every_steps,
                  const std::vector<RecoveryFigures>& recovery) {
  std::vector<double> step_ms;
  std::vector<double> step_ms_with;
  std::vector<double> iteration_ms;
  std::vector<double> iteration_ms_with;
  std::vector<double> ratios;
  std::vector<double> gbps;
  std::vector<double> write_s;
  int64_t due = 0;
  int64_t written = 0;
  int64_t skipped = 0;
  int64_t failed = 0;
  int64_t committed = 0;
  for (size_t i = 0; i < with.size(); ++i) {
    step_ms.push_back(without[i].wall_ms_per_step);
    step_ms_with.push_back(with[i].wall_ms_per_step);
    iteration_ms.push_back(without[i].iteration_ms);
    iteration_ms_with.push_back(with[i].iteration_ms);
    ratios.push_back(with[i].wall_ms_per_step / without[i].wall_ms_per_step);
    for (const RankWrites& rank : with[i].ranks) {
      gbps.push_back(rank.gbps());
      write_s.push_back(rank.write_s());
    }
    due += with[i].due * static_cast<int64_t>(with[i].ranks.size());
    written += with[i].Sum(&RankWrites::written);
    skipped += with[i].Sum(&RankWrites::skipped);
    failed += with[i].Sum(&RankWrites::failed);
    committed += with[i].committed;
  }
  std::vector<double> recovery_s;
  std::vector<double> steps_lost;
  for (const RecoveryFigures& run : recovery) {
    recovery_s.push_back(run.recovery_s);
    steps_lost.push_back(static_cast<double>(run.last_step_before - run.resumed_from));
  }
  const double ratio = Median(ratios);
  const double interval_s = static_cast<double>(every_steps) * Median(step_ms_with) / 1e3;
  const double slowest_write_s =
      write_s.empty() ? 0.0 : *std::max_element(write_s.begin(), write_s.end());
  const bool every_due_written = skipped == 0 && failed == 0 && written == due;
  const bool interval_covers_write = interval_s >= slowest_write_s;
  std::printf(
      "{\"bench\":\"checkpoint\",\"preset\":\"%s\",\"params\":%lld,\"world_size\":%d,"
      "\"mode\":\"%s\",\"every_steps\":%lld,\"rounds\":%zu,\"steps\":%lld,\"warmup\":%lld,"
      "\"write_gbps\":%.3f,\"write_s\":%.3f,\"write_s_max\":%.3f,\"interval_s\":%.3f,"
      "\"step_ms\":%.1f,\"step_ms_with_ckpt\":%.1f,\"ratio\":%.3f,\"ratios\":%s,"
      "\"iteration_ms\":%.1f,\"iteration_ms_with_ckpt\":%.1f,\"due\":%lld,\"written\":%lld,"
      "\"skipped\":%lld,\"failed\":%lld,\"committed\":%lld,\"every_due_written\":%s,"
      "\"interval_covers_write\":%s,\"target_met\":%s,\"recovery_s\":%.3f,"
      "\"recovery_s_runs\":%s,\"recovery_every_steps\":%lld,\"steps_lost_runs\":%s}\n",
      absl::GetFlag(FLAGS_preset).c_str(), static_cast<long long>(params),
      absl::GetFlag(FLAGS_world_size), absl::GetFlag(FLAGS_mode).c_str(),
      static_cast<long long>(every_steps), with.size(),
      static_cast<long long>(absl::GetFlag(FLAGS_steps)),
      static_cast<long long>(absl::GetFlag(FLAGS_warmup)), Median(gbps), Median(write_s),
      slowest_write_s, interval_s, Median(step_ms), Median(step_ms_with), ratio,
      JsonNumbers(ratios, 3).c_str(), Median(iteration_ms), Median(iteration_ms_with),
      static_cast<long long>(due), static_cast<long long>(written), static_cast<long long>(skipped),
      static_cast<long long>(failed), static_cast<long long>(committed),
      every_due_written ? "true" : "false", interval_covers_write ? "true" : "false",
      ratio <= 1.1 && every_due_written && interval_covers_write ? "true" : "false",
      Median(recovery_s), JsonNumbers(recovery_s, 3).c_str(),
      static_cast<long long>(recovery_every_steps), JsonNumbers(steps_lost, 0).c_str());
  std::fflush(stdout);
}

// The summary of the recovery runs alone (--only_recovery).
void PrintRecoverySummary(int64_t every_steps, const std::vector<RecoveryFigures>& recovery) {
  std::vector<double> detect_s;
  std::vector<double> recovery_s;
  std::vector<double> steps_lost;
  for (const RecoveryFigures& run : recovery) {
    detect_s.push_back(run.detect_s);
    recovery_s.push_back(run.recovery_s);
    steps_lost.push_back(static_cast<double>(run.last_step_before - run.resumed_from));
  }
  const double worst_s =
      recovery_s.empty() ? 0.0 : *std::max_element(recovery_s.begin(), recovery_s.end());
  std::printf(
      "{\"bench\":\"checkpoint_recovery\",\"preset\":\"%s\",\"world_size\":%d,\"mode\":\"%s\","
      "\"every_steps\":%lld,\"runs\":%zu,\"detect_s\":%.3f,\"detect_s_runs\":%s,"
      "\"recovery_s\":%.3f,\"recovery_s_max\":%.3f,\"recovery_s_runs\":%s,"
      "\"steps_lost_runs\":%s,\"target_s\":5,\"target_met\":%s}\n",
      absl::GetFlag(FLAGS_preset).c_str(), absl::GetFlag(FLAGS_world_size),
      absl::GetFlag(FLAGS_mode).c_str(), static_cast<long long>(every_steps), recovery.size(),
      Median(detect_s), JsonNumbers(detect_s, 3).c_str(), Median(recovery_s), worst_s,
      JsonNumbers(recovery_s, 3).c_str(), JsonNumbers(steps_lost, 0).c_str(),
      worst_s <= 5.0 ? "true" : "false");
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // LocalCluster finds the coordinator and worker binaries in the runfiles, as under bazel test.
  if (std::getenv("TEST_SRCDIR") == nullptr) {
    const char* runfiles = std::getenv("RUNFILES_DIR");
    const std::string dir = runfiles != nullptr ? runfiles : absl::StrCat(argv[0], ".runfiles");
    setenv("TEST_SRCDIR", dir.c_str(), 1);
  }
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  const int64_t warmup = absl::GetFlag(FLAGS_warmup);
  const int world_size = absl::GetFlag(FLAGS_world_size);
  if (world_size < 2) Die("--world_size must be at least 2 (rank 1 is the one killed)");
  if (warmup < 1 || warmup + 2 > steps) Die("need 1 <= --warmup <= --steps - 2");
  std::vector<int64_t> intervals;
  for (const std::string& text : absl::GetFlag(FLAGS_every_steps)) {
    int64_t every_steps = 0;
    if (!absl::SimpleAtoi(text, &every_steps) || every_steps < 1) {
      Die(absl::StrCat("--every_steps: '", text, "' is not a positive number of steps"));
    }
    if (every_steps > steps - 1 - warmup) {
      Die(absl::StrCat("--every_steps: ", every_steps, " leaves no whole interval in the ",
                       steps - 1 - warmup, " measured steps (--steps - 1 - --warmup)"));
    }
    if (every_steps > 1) intervals.push_back(every_steps);
  }
  if (intervals.empty()) Die("--every_steps: give at least one interval above 1");
  absl::StatusOr<std::vector<sharding::TensorSpec>> tensors =
      sharding::BuildTensorList({absl::GetFlag(FLAGS_preset), {}});
  CheckOk(tensors.status(), "--preset");
  int64_t params = 0;
  for (const sharding::TensorSpec& tensor : *tensors) params += tensor.num_elements;

  testing::LocalClusterOptions options;
  options.worker_threads = absl::GetFlag(FLAGS_threads);
  options.base_dir = absl::GetFlag(FLAGS_base_dir);
  const bool delete_base_dir = options.base_dir.empty();
  if (options.base_dir.empty()) {
    std::string pattern = "/tmp/checkpoint_bench_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) Die("cannot create a directory under /tmp");
    options.base_dir = pattern;
  }
  std::fprintf(stderr, "checkpoint_bench: logs and checkpoints under %s\n",
               options.base_dir.c_str());
  LocalCluster cluster(options);
  // The coordinator's default lease (1 s heartbeats, 3 missed), which recovery_s assumes.
  CheckOk(cluster.Start(world_size + 1), "start the cluster");
  int next_worker_number = world_size + 1;

  // (name, every_steps) of each job of a round: without checkpoints, each interval, every step.
  std::vector<std::pair<std::string, int64_t>> variants = {{"none", 0}};
  for (int64_t every_steps : intervals) {
    variants.emplace_back(absl::StrCat("every-", every_steps), every_steps);
  }
  variants.emplace_back("every-step", 1);
  std::map<int64_t, std::vector<JobFigures>> runs;
  std::vector<RecoveryFigures> recovery;
  if (absl::GetFlag(FLAGS_only_recovery)) {
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      recovery.push_back(MeasureRecovery(cluster, intervals.front(), round, &next_worker_number));
    }
    PrintRecoverySummary(intervals.front(), recovery);
    variants.clear();
  }
  for (int round = 0; !variants.empty() && round < absl::GetFlag(FLAGS_rounds); ++round) {
    std::vector<std::pair<std::string, int64_t>> order = variants;
    if (round % 2 == 1) std::reverse(order.begin(), order.end());
    for (const auto& [name, every_steps] : order) {
      runs[every_steps].push_back(MeasureJob(cluster, name, every_steps, round));
    }
    if (absl::GetFlag(FLAGS_recovery)) {
      recovery.push_back(MeasureRecovery(cluster, intervals.front(), round, &next_worker_number));
    }
  }
  if (!variants.empty()) {
    for (int64_t every_steps : intervals) {
      PrintSummary(params, every_steps, runs[0], runs[every_steps], intervals.front(), recovery);
    }
    PrintSummary(params, 1, runs[0], runs[1], intervals.front(), recovery);
  }
  CheckOk(cluster.StopAll(), "stop the cluster");
  if (delete_base_dir) {
    std::error_code ignored;
    std::filesystem::remove_all(options.base_dir, ignored);
  }
  return 0;
}

}  // namespace
}  // namespace zeroshard::bench

int main(int argc, char** argv) { return zeroshard::bench::Main(argc, argv); }

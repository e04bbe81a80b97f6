// zeroshard: the command-line client of the coordinator (submit, jobs, get, watch, cancel,
// workers, plan, export, fsck). Coordinator errors print as one line on stderr with a non-zero
// exit. Exit codes: 0 done; 1 the coordinator refused or the job did not succeed; 2 bad usage or
// flags; 3 not authenticated or not allowed; 4 coordinator unreachable (incl. a failed TLS
// handshake); 5 a checkpoint is damaged (fsck found a damaged file, or DATA_LOSS).
// The coordinator's address and the credentials may come from the environment the Python client
// and zeroshard-launch read (ZEROSHARD_COORDINATOR, ZEROSHARD_CA, ...); a flag given wins.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "client/export_file.h"
#include "client/job_spec_file.h"
#include "client/progress_view.h"
#include "google/protobuf/repeated_field.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/support/log.h"
#include "security/coordinator_channel.h"

namespace zeroshard::client {

// A string flag that knows whether it was given on the command line (even empty), so that an
// absent one can take its environment variable's value instead.
struct GivenString {
  std::optional<std::string> value;  // nullopt: not given
};

bool AbslParseFlag(absl::string_view text, GivenString* flag, std::string* /*error*/) {
  flag->value = std::string(text);
  return true;
}

std::string AbslUnparseFlag(const GivenString& flag) { return flag.value.value_or(""); }

}  // namespace zeroshard::client

ABSL_FLAG(zeroshard::client::GivenString, coordinator, zeroshard::client::GivenString(),
          "Coordinator address host:port (default: $ZEROSHARD_COORDINATOR, else "
          "127.0.0.1:50051).");
ABSL_FLAG(zeroshard::client::GivenString, ca, zeroshard::client::GivenString(),
          "PEM file of the CA that signed the coordinator's certificate: connect with TLS. Empty: "
          "plaintext. Default: $ZEROSHARD_CA.");
ABSL_FLAG(zeroshard::client::GivenString, cert, zeroshard::client::GivenString(),
          "PEM client certificate for mTLS (with --key and --ca; default: $ZEROSHARD_CERT).");
ABSL_FLAG(zeroshard::client::GivenString, key, zeroshard::client::GivenString(),
          "PEM private key of --cert (default: $ZEROSHARD_KEY).");
ABSL_FLAG(zeroshard::client::GivenString, token_file, zeroshard::client::GivenString(),
          "File whose first line is your token (default: $ZEROSHARD_TOKEN, the token itself; "
          "--token_file= sends none).");
ABSL_FLAG(bool, insecure, false,
          "Send the token even without TLS (no --ca) to a --coordinator that is not loopback "
          "(trusted networks only; also $ZEROSHARD_INSECURE=1). Without it such a token is "
          "refused.");
// submit: each flag that is set overrides the spec file's field.
ABSL_FLAG(std::optional<std::string>, name, std::nullopt, "submit: job name ([a-z0-9-]).");
ABSL_FLAG(std::optional<std::string>, preset, std::nullopt,
          "submit: workload preset (seed, small, medium, large, deep).");
ABSL_FLAG(std::optional<std::string>, layers, std::nullopt,
          "submit: custom MLP layer sizes, comma-separated (e.g. 10,64,10).");
ABSL_FLAG(std::optional<std::string>, optimizer, std::nullopt,
          "submit: sgd, adam, adamw, adagrad or lion.");
ABSL_FLAG(std::optional<double>, lr, std::nullopt, "submit: learning rate.");
ABSL_FLAG(std::optional<double>, weight_decay, std::nullopt, "submit: weight decay.");
ABSL_FLAG(std::optional<std::string>, no_decay, std::nullopt,
          "submit: comma-separated tensor-name patterns (e.g. '*.bias') that take weight decay 0: "
          "a parameter group ahead of the spec file's groups (the first match wins).");
ABSL_FLAG(std::optional<double>, momentum, std::nullopt, "submit: SGD momentum.");
ABSL_FLAG(std::optional<std::string>, mode, std::nullopt, "submit: ddp, zero1, zero2 or zero3.");
ABSL_FLAG(std::optional<int>, workers, std::nullopt,
          "submit: run on exactly this many workers (sets min and max).");
ABSL_FLAG(std::optional<int>, min_workers, std::nullopt, "submit: fewest workers.");
ABSL_FLAG(std::optional<int>, max_workers, std::nullopt, "submit: most workers.");
ABSL_FLAG(std::optional<int64_t>, steps, std::nullopt, "submit: optimizer steps.");
ABSL_FLAG(std::optional<int64_t>, global_batch, std::nullopt, "submit: samples per step.");
ABSL_FLAG(std::optional<int64_t>, dataset_size, std::nullopt, "submit: synthetic samples.");
ABSL_FLAG(std::optional<int64_t>, seed, std::nullopt, "submit: data and init seed.");
ABSL_FLAG(std::optional<double>, clip_grad_norm, std::nullopt, "submit: gradient clipping.");
ABSL_FLAG(std::optional<int64_t>, bucket_elems, std::nullopt, "submit: bucket size, elements.");
ABSL_FLAG(std::optional<int32_t>, gather_pool_buckets, std::nullopt,
          "submit: zero3's gather pool, in buckets (default: twice the most one module spans).");
ABSL_FLAG(std::optional<std::string>, resume_from, std::nullopt,
          "submit: start from a committed checkpoint of an ended job: JOB (its latest) or "
          "JOB@STEP; the job may have had another mode or world size (resume_from).");
ABSL_FLAG(std::optional<int64_t>, checkpoint_every, std::nullopt,
          "submit: checkpoint every this many steps (checkpoint.every_steps; 0: only the final "
          "one).");
ABSL_FLAG(std::optional<int>, checkpoint_keep, std::nullopt,
          "submit: committed checkpoints kept (checkpoint.keep).");
ABSL_FLAG(std::optional<int>, max_attempts, std::nullopt,
          "submit: generations the job may start before it fails (max_attempts).");
ABSL_FLAG(std::optional<std::string>, param_dtype, std::nullopt,
          "submit: float32, bfloat16 or float16.");
ABSL_FLAG(bool, watch, false, "submit: watch the job until it ends.");
ABSL_FLAG(absl::Duration, reconnect_for, absl::Minutes(2),
          "watch, submit --watch: while the coordinator is unreachable (a restart), keep "
          "reconnecting this long, then exit 4; the watch goes on after the last event seen.");
ABSL_FLAG(std::string, state, "", "jobs/workers: only this state (e.g. running, idle).");
ABSL_FLAG(int, limit, 100, "jobs: at most this many, newest first (0: all; fetched in pages).");
ABSL_FLAG(std::string, reason, "", "cancel: why (recorded in the job).");
ABSL_FLAG(std::string, output, "",
          "get/submit: 'json' prints the job as JSON; watch: 'json' prints one event per line; "
          "export: the file to write (safetensors), or '-' for stdout; fsck: 'json' prints the "
          "report as JSON.");
ABSL_FLAG(std::optional<int64_t>, step, std::nullopt,
          "export: the committed checkpoint's step (default: the job's final state; an attached "
          "job's latest committed checkpoint); fsck: the "
          "committed checkpoint's step (default: the job's latest committed checkpoint).");

namespace zeroshard::client {
namespace {

constexpr char kUsage[] =
    R"(zeroshard [--coordinator=HOST:PORT] [--ca=CA.pem [--cert=C.pem --key=K.pem]]
          [--token_file=FILE] [--insecure] COMMAND [ARGS]

Commands:
  submit [SPEC_FILE] [flags]   submit a job (JSON or YAML spec file, and/or flags); --watch to follow it
  jobs [--state=S]             list jobs, newest first
  get JOB_ID                   show one job (--output=json for all fields)
  watch JOB_ID                 follow a job's progress until it ends
  cancel JOB_ID [--reason=R]   cancel a job
  workers [--state=S]          list workers
  plan JOB_ID [--output=json]  show the shard map (the running generation, or an ended job's last);
                               json: rank 0's plan with the ZeRO formula's bytes per rank
  export JOB_ID --output=PATH|- [--step=N]
                               write the job's final weights (or checkpoint N's; an attached
                               job's latest checkpoint) as fp32 safetensors that torch loads,
                               tied weights under each name, to PATH or stdout
  fsck JOB_ID [--step=N] [--output=json]
                               admin: the coordinator reads every file of the job's latest
                               committed checkpoint (or checkpoint N's) and checks its size and
                               CRC32C against the manifest; one line per file, then a summary

Environment (as the Python client and zeroshard-launch read it; a flag given on the command
line wins, even empty: --ca= is plaintext; an empty variable counts as unset):
  ZEROSHARD_COORDINATOR        --coordinator (else 127.0.0.1:50051)
  ZEROSHARD_CA, ZEROSHARD_CERT, ZEROSHARD_KEY
                               --ca, --cert, --key
  ZEROSHARD_TOKEN              the token itself (--token_file names a file holding it)
  ZEROSHARD_INSECURE=1         --insecure

Exit codes: 0 done (fsck: every file OK); 1 the coordinator refused, or the job did not
succeed; 2 bad usage or flags; 3 not authenticated or not allowed; 4 the coordinator is
unreachable; 5 a checkpoint is damaged (fsck found a file that is not OK, or DATA_LOSS).
)";

// The variables that stand in for the flags of the same meaning (python/zeroshard/_channel.py).
constexpr char kCoordinatorEnv[] = "ZEROSHARD_COORDINATOR";
constexpr char kCaEnv[] = "ZEROSHARD_CA";
constexpr char kCertEnv[] = "ZEROSHARD_CERT";
constexpr char kKeyEnv[] = "ZEROSHARD_KEY";
constexpr char kTokenEnv[] = "ZEROSHARD_TOKEN";

constexpr char kDefaultCoordinator[] = "127.0.0.1:50051";

// `flag`'s value when it is on the command line (empty included), else $`env` when set and not
// empty (appending `env` to `*from_environment` when given), else `fallback`.
std::string FlagOrEnv(const absl::Flag<GivenString>& flag, const char* env,
                      std::vector<std::string>* from_environment = nullptr,
                      const std::string& fallback = "") {
  const std::optional<std::string> given = absl::GetFlag(flag).value;
  if (given.has_value()) return *given;
  const char* value = std::getenv(env);
  if (value == nullptr || *value == '\0') return fallback;
  if (from_environment != nullptr) from_environment->push_back(env);
  return value;
}

std::string CoordinatorAddress(std::vector<std::string>* from_environment = nullptr) {
  return FlagOrEnv(FLAGS_coordinator, kCoordinatorEnv, from_environment, kDefaultCoordinator);
}

constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitNotAllowed = 3;
constexpr int kExitUnreachable = 4;
constexpr int kExitDamaged = 5;

int Fail(const absl::Status& status) {
  std::string hint;
  int exit_code = kExitFailed;
  switch (status.code()) {
    case absl::StatusCode::kUnauthenticated:
      hint = " (pass --token_file, set ZEROSHARD_TOKEN, or --cert/--key)";
      exit_code = kExitNotAllowed;
      break;
    case absl::StatusCode::kPermissionDenied:
      hint = " (your token's role does not allow this)";
      exit_code = kExitNotAllowed;
      break;
    case absl::StatusCode::kUnavailable:
      hint = absl::StrCat(" (is the coordinator at ", CoordinatorAddress(),
                          " up, and does --ca match its certificate?)");
      exit_code = kExitUnreachable;
      break;
    case absl::StatusCode::kDataLoss:
      hint = " (the checkpoint is damaged)";
      exit_code = kExitDamaged;
      break;
    default:
      break;
  }
  std::fprintf(stderr, "zeroshard: error: %s: %s%s\n",
               absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str(), hint.c_str());
  return exit_code;
}

int Usage(const std::string& problem) {
  std::fprintf(stderr, "zeroshard: error: %s\n\n%s", problem.c_str(), kUsage);
  return kExitUsage;
}

// A flag whose file is missing or unusable (the message names the flag): one line, no usage.
int BadFlag(const absl::Status& status) {
  std::fprintf(stderr, "zeroshard: error: %s\n", std::string(status.message()).c_str());
  return kExitUsage;
}

template <typename Enum, typename ParseFn>
absl::Status ParseEnumFlag(const std::string& flag, const std::string& value, ParseFn parse,
                           Enum* out) {
  if (!parse(absl::AsciiStrToUpper(value), out)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": unknown value '", value, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JobSpec> SpecFromArgs(const std::vector<char*>& args) {
  v1::JobSpec spec;
  if (args.size() > 3) return absl::InvalidArgumentError("submit: at most one spec file");
  if (args.size() == 3) {
    absl::StatusOr<v1::JobSpec> from_file = ReadJobSpecFile(args[2]);
    if (!from_file.ok()) return from_file.status();
    spec = *std::move(from_file);
  }
  if (auto v = absl::GetFlag(FLAGS_name)) spec.set_name(*v);
  if (auto v = absl::GetFlag(FLAGS_preset)) {
    spec.mutable_workload()->clear_layer_sizes();
    spec.mutable_workload()->set_preset(*v);
  }
  if (auto v = absl::GetFlag(FLAGS_layers)) {
    spec.mutable_workload()->clear_preset();
    spec.mutable_workload()->clear_layer_sizes();
    for (absl::string_view part : absl::StrSplit(*v, ',')) {
      int64_t size;
      if (!absl::SimpleAtoi(part, &size)) {
        return absl::InvalidArgumentError(absl::StrCat("--layers: '", part, "' is not a number"));
      }
      spec.mutable_workload()->add_layer_sizes(size);
    }
  }
  v1::OptimizerSpec& optimizer = *spec.mutable_optimizer();
  if (auto v = absl::GetFlag(FLAGS_optimizer)) {
    v1::OptimizerKind kind;
    absl::Status parsed = ParseEnumFlag("optimizer", *v, v1::OptimizerKind_Parse, &kind);
    if (!parsed.ok()) return parsed;
    optimizer.set_kind(kind);
  }
  if (auto v = absl::GetFlag(FLAGS_lr)) optimizer.set_lr(*v);
  if (auto v = absl::GetFlag(FLAGS_weight_decay)) optimizer.set_weight_decay(*v);
  if (auto v = absl::GetFlag(FLAGS_no_decay)) {
    // First in the list, so the flag overrides the spec file's groups for the tensors it matches.
    google::protobuf::RepeatedPtrField<v1::ParamGroup> groups;
    v1::ParamGroup& no_decay = *groups.Add();
    for (absl::string_view pattern : absl::StrSplit(*v, ',')) {
      no_decay.add_patterns(std::string(pattern));
    }
    no_decay.set_weight_decay(0);
    for (const v1::ParamGroup& group : spec.param_groups()) *groups.Add() = group;
    spec.mutable_param_groups()->Swap(&groups);
  }
  if (auto v = absl::GetFlag(FLAGS_momentum)) optimizer.set_momentum(*v);
  if (auto v = absl::GetFlag(FLAGS_mode)) {
    v1::Mode mode;
    absl::Status parsed = ParseEnumFlag("mode", *v, v1::Mode_Parse, &mode);
    if (!parsed.ok()) return parsed;
    spec.set_mode(mode);
  }
  if (auto v = absl::GetFlag(FLAGS_workers)) {
    spec.set_min_workers(*v);
    spec.set_max_workers(*v);
  }
  if (auto v = absl::GetFlag(FLAGS_min_workers)) spec.set_min_workers(*v);
  if (auto v = absl::GetFlag(FLAGS_max_workers)) spec.set_max_workers(*v);
  if (auto v = absl::GetFlag(FLAGS_steps)) spec.set_steps(*v);
  if (auto v = absl::GetFlag(FLAGS_global_batch)) spec.set_global_batch(*v);
  if (auto v = absl::GetFlag(FLAGS_dataset_size)) spec.mutable_workload()->set_dataset_size(*v);
  if (auto v = absl::GetFlag(FLAGS_seed)) spec.set_seed(static_cast<uint64_t>(*v));
  if (auto v = absl::GetFlag(FLAGS_clip_grad_norm)) spec.set_clip_grad_norm(*v);
  if (auto v = absl::GetFlag(FLAGS_bucket_elems)) spec.set_bucket_elems(*v);
  if (auto v = absl::GetFlag(FLAGS_gather_pool_buckets)) spec.set_gather_pool_buckets(*v);
  if (auto v = absl::GetFlag(FLAGS_resume_from)) {
    const std::vector<std::string> parts = absl::StrSplit(*v, absl::MaxSplits('@', 1));
    spec.mutable_resume_from()->set_job_id(parts[0]);
    if (parts.size() == 2) {
      int64_t step = 0;
      if (!absl::SimpleAtoi(parts[1], &step)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--resume_from: \"", *v, "\" is not JOB or JOB@STEP (STEP a whole number)"));
      }
      spec.mutable_resume_from()->set_step(step);
    }
  }
  if (auto v = absl::GetFlag(FLAGS_checkpoint_every)) {
    spec.mutable_checkpoint()->set_every_steps(*v);
  }
  if (auto v = absl::GetFlag(FLAGS_checkpoint_keep)) spec.mutable_checkpoint()->set_keep(*v);
  if (auto v = absl::GetFlag(FLAGS_max_attempts)) spec.set_max_attempts(*v);
  if (auto v = absl::GetFlag(FLAGS_param_dtype)) {
    v1::DType dtype;
    absl::Status parsed = ParseEnumFlag("param_dtype", *v, v1::DType_Parse, &dtype);
    if (!parsed.ok()) return parsed;
    spec.mutable_precision()->set_param_dtype(dtype);
  }
  return spec;
}

void PrintJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  std::cout << json;
}

void PrintJobJson(const v1::Job& job) { PrintJson(job); }

// Jobs from a coordinator that authenticates no one (or from before submitters were recorded)
// have none.
std::string Submitter(const v1::Job& job) {
  return job.submitter().empty() ? "-" : job.submitter();
}

void PrintJobSummary(const v1::Job& job) {
  std::cout << absl::StrFormat(
      "%s  %s  name=%s  submitter=%s  generation=%d  workers=%d  step=%s  loss=%.6g\n", job.id(),
      v1::JobState_Name(job.state()), job.spec().name(), Submitter(job), job.generation(),
      job.worker_ids_size(), StepOfTotal(job.progress().step(), job.spec().steps()),
      job.progress().loss());
  if (!job.message().empty()) std::cout << "  " << job.message() << "\n";
}

int Watch(CoordinatorClient& client, const std::string& job_id) {
  absl::StatusOr<v1::Job> job = client.GetJob(job_id);
  if (!job.ok()) return Fail(job.status());
  // With --output=json, scripts get one event per line and the view only tracks the state.
  const bool json = absl::GetFlag(FLAGS_output) == "json";
  std::ostringstream discarded;
  ProgressView view(job_id, job->spec().steps(), !json && isatty(STDOUT_FILENO) == 1,
                    json ? &discarded : &std::cout);
  int64_t last_sequence = 0;
  absl::Status status;
  std::optional<absl::Time> unreachable_since;
  absl::Duration reconnect_wait;
  while (true) {
    const int64_t resumed_after = last_sequence;
    status = client.WatchJob(job_id, resumed_after, [&](const v1::JobEvent& event) {
      last_sequence = event.sequence();
      view.OnEvent(event);
      if (json) {
        std::string line;
        google::protobuf::util::JsonPrintOptions options;
        options.preserve_proto_field_names = true;
        (void)google::protobuf::util::MessageToJsonString(event, &line, options);
        std::cout << line << "\n" << std::flush;
      }
    });
    // A watcher that fell behind the live events (a slow terminal) resumes where it stopped;
    // only while it makes progress, so a stream refused outright is not retried forever.
    if (status.code() == absl::StatusCode::kResourceExhausted && last_sequence != resumed_after) {
      continue;
    }
    // The coordinator went away (a restart: the job trains on without it): reconnect, with a
    // growing wait, for --reconnect_for since the stream was last up.
    if (status.code() != absl::StatusCode::kUnavailable) break;
    const absl::Time now = absl::Now();
    if (last_sequence != resumed_after || !unreachable_since.has_value()) {
      unreachable_since = now;
      reconnect_wait = absl::Milliseconds(100);
      std::cerr << "zeroshard: " << status.message() << "; reconnecting (up to "
                << absl::FormatDuration(absl::GetFlag(FLAGS_reconnect_for)) << ")\n";
    }
    if (now - *unreachable_since >= absl::GetFlag(FLAGS_reconnect_for)) break;
    absl::SleepFor(reconnect_wait);
    reconnect_wait = std::min(reconnect_wait * 2, absl::Seconds(2));
  }
  view.Close();
  if (!status.ok()) return Fail(status);
  return view.final_state() == v1::SUCCEEDED ? 0 : 1;
}

// The state's name without its prefix: "OK", "CRC_MISMATCH".
std::string ShortStateName(v1::CheckpointFileState state) {
  return std::string(absl::StripPrefix(v1::CheckpointFileState_Name(state), "CHECKPOINT_FILE_"));
}

// `zeroshard fsck`: one line per file, then a summary line; exit 0 when every file is OK.
int Fsck(CoordinatorClient& client, const std::string& job_id) {
  absl::StatusOr<v1::VerifyCheckpointResponse> report =
      client.VerifyCheckpoint(job_id, absl::GetFlag(FLAGS_step));
  if (!report.ok()) return Fail(report.status());
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::string json;
    google::protobuf::util::JsonPrintOptions options;
    options.add_whitespace = true;
    options.preserve_proto_field_names = true;
    options.always_print_primitive_fields = true;
    (void)google::protobuf::util::MessageToJsonString(*report, &json, options);
    std::cout << json;
    return report->ok() ? 0 : kExitDamaged;
  }
  const v1::CheckpointRecord& checkpoint = report->checkpoint();
  std::cout << absl::StrFormat("%s step %d (generation %d, world size %d): %s\n", job_id,
                               checkpoint.step(), checkpoint.generation(), checkpoint.world_size(),
                               checkpoint.manifest_path());
  std::map<std::string, int> damaged_by_state;
  for (const v1::CheckpointFileVerification& file : report->files()) {
    const std::string state = ShortStateName(file.state());
    std::cout << absl::StrFormat("%-18s rank %-5d %s", state, file.rank(), file.path());
    if (file.state() == v1::CHECKPOINT_FILE_OK) {
      std::cout << absl::StrFormat("  %d bytes, CRC32C 0x%08x\n", file.expected_bytes(),
                                   file.expected_crc32c());
    } else {
      // The message names the file on the coordinator's volume and both values where they
      // differ.
      ++damaged_by_state[state];
      std::cout << ": " << file.message() << "\n";
    }
  }
  if (report->ok()) {
    std::cout << absl::StrFormat("%s step %d: all %d files OK\n", job_id, checkpoint.step(),
                                 report->files_size());
    return 0;
  }
  std::vector<std::string> counts;
  for (const auto& [state, count] : damaged_by_state) {
    counts.push_back(absl::StrCat(count, " ", state));
  }
  std::cout << absl::StrFormat("%s step %d: %d of %d files damaged (%s)\n", job_id,
                               checkpoint.step(), report->damaged_files(), report->files_size(),
                               absl::StrJoin(counts, ", "));
  return kExitDamaged;
}

int Run(std::vector<char*> args) {
  if (args.size() < 2) return Usage("no command");
  const std::string command = args[1];
  // An empty --token_file on the command line sends no token: $ZEROSHARD_TOKEN is ignored.
  // (Still one thread: nothing reads the environment concurrently.)
  const std::optional<std::string> token_file = absl::GetFlag(FLAGS_token_file).value;
  if (token_file.has_value() && token_file->empty()) unsetenv(kTokenEnv);
  // Which settings came from the environment: an unusable one is named as such.
  std::vector<std::string> from_environment;
  const std::string ca = FlagOrEnv(FLAGS_ca, kCaEnv, &from_environment);
  const std::string cert = FlagOrEnv(FLAGS_cert, kCertEnv, &from_environment);
  const std::string key = FlagOrEnv(FLAGS_key, kKeyEnv, &from_environment);
  const std::string coordinator = CoordinatorAddress(&from_environment);
  auto bad_setting = [&](const absl::Status& status) {
    if (from_environment.empty()) return BadFlag(status);
    return BadFlag(
        absl::Status(status.code(), absl::StrCat(status.message(), " (from the environment: ",
                                                 absl::StrJoin(from_environment, ", "), ")")));
  };
  absl::StatusOr<security::ClientCredentials> credentials =
      security::ClientCredentialsFromFlags(ca, cert, key, token_file.value_or(""));
  if (!credentials.ok()) return bad_setting(credentials.status());
  credentials->insecure |= absl::GetFlag(FLAGS_insecure);
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> created =
      CoordinatorClient::Create(coordinator, *credentials);
  if (!created.ok()) return bad_setting(created.status());
  CoordinatorClient& client = **created;
  auto need_id = [&]() -> std::optional<std::string> {
    if (args.size() != 3) return std::nullopt;
    return std::string(args[2]);
  };
  if (command == "submit") {
    absl::StatusOr<v1::JobSpec> spec = SpecFromArgs(args);
    if (!spec.ok()) return Fail(spec.status());
    absl::StatusOr<v1::Job> job = client.SubmitJob(*spec);
    if (!job.ok()) return Fail(job.status());
    if (absl::GetFlag(FLAGS_output) == "json") {
      PrintJobJson(*job);
    } else {
      std::cout << job->id() << "\n";
    }
    return absl::GetFlag(FLAGS_watch) ? Watch(client, job->id()) : 0;
  }
  if (command == "jobs") {
    v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
    if (!absl::GetFlag(FLAGS_state).empty()) {
      absl::Status parsed =
          ParseEnumFlag("state", absl::GetFlag(FLAGS_state), v1::JobState_Parse, &state);
      if (!parsed.ok()) return Fail(parsed);
    }
    absl::StatusOr<std::vector<v1::Job>> jobs = client.ListJobs(state, absl::GetFlag(FLAGS_limit));
    if (!jobs.ok()) return Fail(jobs.status());
    std::cout << absl::StrFormat("%-12s %-11s %-4s %-7s %-13s %-12s %-16s %s\n", "ID", "STATE",
                                 "GEN", "WORKERS", "STEP", "LOSS", "SUBMITTER", "NAME");
    for (const v1::Job& job : *jobs) {
      std::cout << absl::StrFormat("%-12s %-11s %-4d %-7d %-13s %-12.6g %-16s %s\n", job.id(),
                                   v1::JobState_Name(job.state()), job.generation(),
                                   job.worker_ids_size(),
                                   StepOfTotal(job.progress().step(), job.spec().steps()),
                                   job.progress().loss(), Submitter(job), job.spec().name());
    }
    return 0;
  }
  if (command == "get") {
    auto id = need_id();
    if (!id) return Usage("get: expected JOB_ID");
    absl::StatusOr<v1::Job> job = client.GetJob(*id);
    if (!job.ok()) return Fail(job.status());
    if (absl::GetFlag(FLAGS_output) == "json") {
      PrintJobJson(*job);
    } else {
      PrintJobSummary(*job);
    }
    return 0;
  }
  if (command == "watch") {
    auto id = need_id();
    if (!id) return Usage("watch: expected JOB_ID");
    return Watch(client, *id);
  }
  if (command == "cancel") {
    auto id = need_id();
    if (!id) return Usage("cancel: expected JOB_ID");
    absl::StatusOr<v1::Job> job = client.CancelJob(*id, absl::GetFlag(FLAGS_reason));
    if (!job.ok()) return Fail(job.status());
    PrintJobSummary(*job);
    return 0;
  }
  if (command == "workers") {
    v1::WorkerState state = v1::WORKER_STATE_UNSPECIFIED;
    if (!absl::GetFlag(FLAGS_state).empty()) {
      absl::Status parsed =
          ParseEnumFlag("state", absl::GetFlag(FLAGS_state), v1::WorkerState_Parse, &state);
      if (!parsed.ok()) return Fail(parsed);
    }
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client.ListWorkers(state);
    if (!workers.ok()) return Fail(workers.status());
    std::cout << absl::StrFormat("%-14s %-14s %-12s %-5s %-6s %-12s %-11s %-12s %s\n", "ID", "NAME",
                                 "HOST", "KIND", "STATE", "JOB", "RANK", "MEMORY_LIMIT",
                                 "ATTACH_SOCKET");
    for (const v1::WorkerInfo& worker : *workers) {
      const bool running = worker.assignment().kind() == v1::ASSIGNMENT_RUN;
      std::cout << absl::StrFormat(
          "%-14s %-14s %-12s %-5s %-6s %-12s %-11s %-12s %s\n", worker.id(), worker.name(),
          worker.host(), v1::DeviceKind_Name(worker.device_kind()),
          v1::WorkerState_Name(worker.state()), running ? worker.assignment().job_id() : "-",
          running ? absl::StrCat(worker.assignment().rank(), "/", worker.assignment().world_size())
                  : "-",
          // --memory_limit_bytes, in MiB; "-" for none.
          worker.memory_limit_bytes() == 0
              ? std::string("-")
              : absl::StrFormat("%.1fMiB", worker.memory_limit_bytes() / 1048576.0),
          worker.attach_socket().empty() ? "-" : worker.attach_socket());
    }
    return 0;
  }
  if (command == "plan") {
    auto id = need_id();
    if (!id) return Usage("plan: expected JOB_ID");
    absl::StatusOr<v1::ShardPlan> plan =
        client.GetShardPlan(*id, /*generation=*/0, /*rank=*/0, /*include_layout=*/true);
    if (!plan.ok()) return Fail(plan.status());
    // Scripts (tools/demo.py, tools/compare.py) read rank 0's view, with the ZeRO formula.
    if (absl::GetFlag(FLAGS_output) == "json") {
      PrintJson(*plan);
      return 0;
    }
    std::vector<v1::ShardPlan> ranks = {*plan};
    // The other ranks' views come from rank 0's generation: if the job moved on meanwhile, the
    // coordinator refuses (FAILED_PRECONDITION) rather than mixing two generations' maps.
    for (int rank = 1; rank < plan->world_size(); ++rank) {
      absl::StatusOr<v1::ShardPlan> view =
          client.GetShardPlan(*id, plan->generation(), rank, /*include_layout=*/false);
      if (!view.ok()) return Fail(view.status());
      ranks.push_back(*std::move(view));
    }
    PrintShardMap(ranks, &std::cout);
    return 0;
  }
  if (command == "export") {
    auto id = need_id();
    if (!id) return Usage("export: expected JOB_ID");
    const std::string output = absl::GetFlag(FLAGS_output);
    if (output.empty()) return Usage("export: --output=PATH (or - for stdout) is required");
    const std::optional<int64_t> step = absl::GetFlag(FLAGS_step);
    absl::StatusOr<ExportSummary> summary;
    if (output == "-") {
      if (isatty(STDOUT_FILENO) == 1) {
        return Usage("export: stdout is a terminal; redirect it or pass --output=PATH");
      }
      summary = ExportToDescriptor(client, *id, step, STDOUT_FILENO);
    } else {
      summary = ExportToFile(client, *id, step, output);
    }
    if (!summary.ok()) return Fail(summary.status());
    // Without --step an attached job's export is its latest committed checkpoint: the step says
    // which.
    const char* which = summary->final_state ? "final"
                        : step.has_value()   ? "checkpoint"
                                             : "latest checkpoint";
    std::fprintf(stderr, "zeroshard: exported %s step %lld (%s): %d tensors, %lld bytes to %s\n",
                 id->c_str(), static_cast<long long>(summary->step), which, summary->tensor_count,
                 static_cast<long long>(summary->bytes), output == "-" ? "stdout" : output.c_str());
    return 0;
  }
  if (command == "fsck") {
    auto id = need_id();
    if (!id) return Usage("fsck: expected JOB_ID");
    const std::string output = absl::GetFlag(FLAGS_output);
    if (!output.empty() && output != "json") {
      return Usage(absl::StrCat("fsck: --output must be json or unset, not '", output, "'"));
    }
    return Fsck(client, *id);
  }
  return Usage(absl::StrCat("unknown command '", command, "'"));
}

}  // namespace
}  // namespace zeroshard::client

int main(int argc, char** argv) {
  // gRPC core's own lines (e.g. "Handshake failed ...") would come on top of the one-line error,
  // which carries the same cause.
  gpr_set_log_function([](gpr_log_func_args*) {});
  absl::SetProgramUsageMessage(zeroshard::client::kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  return zeroshard::client::Run(args);
}

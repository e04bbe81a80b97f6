// The defaults documented in job.proto's comments are the ones WithDefaults applies, and a
// JobSpec round-trips through protobuf JSON.
#include "jobspec/job_spec_defaults.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace zeroshard::jobspec {
namespace {

using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::Message;
using ::google::protobuf::Reflection;
using ::zeroshard::v1::JobSpec;

// One field of job.proto with the text after "Default:" in its comment.
struct DocumentedDefault {
  std::string message;  // e.g. "OptimizerSpec"
  std::string field;    // e.g. "lr"
  std::string text;     // e.g. "0.001 (ADAMW: 0.01)."
};

std::string ReadJobProto() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string path =
      std::string(srcdir ? srcdir : ".") + "/zeroshard/proto/zeroshard/v1/job.proto";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<DocumentedDefault> ParseDocumentedDefaults(const std::string& proto) {
  std::vector<DocumentedDefault> out;
  const std::regex message_re(R"(^message (\w+) \{)");
  const std::regex field_re(R"(^\s+(?:optional |repeated )?[\w.]+ (\w+) = \d+;)");
  std::string message, comment;
  std::istringstream lines(proto);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, message_re)) {
      message = m[1];
      comment.clear();
    } else if (line.find("//") != std::string::npos) {
      comment += " " + line.substr(line.find("//") + 2);
    } else if (std::regex_search(line, m, field_re)) {
      const size_t at = comment.find("Default:");
      if (at != std::string::npos) {
        // Collapse whitespace, then cut at the sentence's end.
        std::string text = std::regex_replace(comment.substr(at + 8), std::regex(R"(\s+)"), " ");
        text = text.substr(0, text.find(". "));
        while (!text.empty() && (text.back() == '.' || text.back() == ' ')) text.pop_back();
        while (!text.empty() && text.front() == ' ') text.erase(0, 1);
        out.push_back({message, m[1], text});
      }
      comment.clear();
    } else {
      comment.clear();
    }
  }
  return out;
}

// The message inside `spec` that holds fields of proto message `name`.
Message* SubMessage(JobSpec& spec, const std::string& name) {
  if (name == "JobSpec") return &spec;
  if (name == "WorkloadSpec") return spec.mutable_workload();
  if (name == "OptimizerSpec") return spec.mutable_optimizer();
  if (name == "PrecisionSpec") return spec.mutable_precision();
  if (name == "CheckpointPolicy") return spec.mutable_checkpoint();
  if (name == "ResumeFrom") return spec.mutable_resume_from();
  ADD_FAILURE() << "no JobSpec path to message " << name;
  return &spec;
}

std::string FormatNumber(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

// The applied value of a scalar field as text comparable with the documented literal.
std::string AppliedValue(const Message& msg, const FieldDescriptor* field) {
  const Reflection* r = msg.GetReflection();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return FormatNumber(r->GetDouble(msg, field));
    case FieldDescriptor::CPPTYPE_INT32:
      return std::to_string(r->GetInt32(msg, field));
    case FieldDescriptor::CPPTYPE_INT64:
      return std::to_string(r->GetInt64(msg, field));
    case FieldDescriptor::CPPTYPE_UINT64:
      return std::to_string(r->GetUInt64(msg, field));
    case FieldDescriptor::CPPTYPE_BOOL:
      return r->GetBool(msg, field) ? "true" : "false";
    case FieldDescriptor::CPPTYPE_ENUM:
      return r->GetEnum(msg, field)->name();
    case FieldDescriptor::CPPTYPE_STRING:
      return r->GetString(msg, field);
    default:
      return "<message>";
  }
}

std::string Normalize(const std::string& literal) {
  char* end = nullptr;
  const double value = std::strtod(literal.c_str(), &end);
  if (end != literal.c_str() && *end == '\0') return FormatNumber(value);
  return literal;
}

v1::OptimizerKind KindNamed(const std::string& name) {
  v1::OptimizerKind kind;
  EXPECT_TRUE(v1::OptimizerKind_Parse(name, &kind)) << name;
  return kind;
}

TEST(JobSpecDefaultsTest, DocumentedDefaultsAreApplied) {
  const std::vector<DocumentedDefault> documented = ParseDocumentedDefaults(ReadJobProto());
  ASSERT_GE(documented.size(), 25u);
  const std::regex literal_re(R"(^([\w.+-]+)(?: \((\w+): ([\w.+-]+)\))?$)");
  std::set<std::string> checked_elsewhere;
  int literal_checks = 0;
  for (const DocumentedDefault& doc : documented) {
    const std::string where = doc.message + "." + doc.field + " (Default: " + doc.text + ")";
    JobSpec empty;
    empty.mutable_optimizer()->set_kind(v1::SGD);
    JobSpec applied = WithDefaults(empty);
    Message* msg = SubMessage(applied, doc.message);
    const FieldDescriptor* field = msg->GetDescriptor()->FindFieldByName(doc.field);
    ASSERT_NE(field, nullptr) << where;
    std::smatch m;
    if (!std::regex_match(doc.text, m, literal_re) ||
        field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      checked_elsewhere.insert(doc.message + "." + doc.field);
      continue;
    }
    const std::string expected = m[1];
    const FieldDescriptor* sibling = msg->GetDescriptor()->FindFieldByName(expected);
    if (sibling != nullptr) {  // "Default: min_workers": equal to another field.
      EXPECT_EQ(AppliedValue(*msg, field), AppliedValue(*msg, sibling)) << where;
    } else {
      EXPECT_EQ(AppliedValue(*msg, field), Normalize(expected)) << where;
    }
    if (field->has_presence()) {
      EXPECT_TRUE(msg->GetReflection()->HasField(*msg, field)) << where;
    }
    ++literal_checks;
    if (m[2].matched) {  // "(ADAMW: 0.01)": the value for that optimizer kind.
      JobSpec special;
      special.mutable_optimizer()->set_kind(KindNamed(m[2]));
      JobSpec special_applied = WithDefaults(special);
      Message* special_msg = SubMessage(special_applied, doc.message);
      EXPECT_EQ(AppliedValue(*special_msg, field), Normalize(m[3])) << where;
    }
  }
  EXPECT_GE(literal_checks, 20);
  // The defaults that are not literals are exactly these, each checked below.
  EXPECT_EQ(checked_elsewhere,
            (std::set<std::string>{"PrecisionSpec.grad_dtype", "PrecisionSpec.initial_loss_scale",
                                   "PrecisionSpec.dynamic_loss_scale", "CheckpointPolicy.dir",
                                   "JobSpec.precision", "JobSpec.checkpoint",
                                   "JobSpec.gather_pool_buckets", "ResumeFrom.step"}));
}

TEST(JobSpecDefaultsTest, ConditionalDefaults) {
  JobSpec fp16;
  fp16.mutable_precision()->set_param_dtype(v1::FLOAT16);
  const JobSpec applied = WithDefaults(fp16, "job-000001");
  EXPECT_EQ(applied.precision().grad_dtype(), v1::FLOAT16);
  EXPECT_EQ(applied.precision().initial_loss_scale(), 65536.0);
  EXPECT_TRUE(applied.precision().dynamic_loss_scale());
  EXPECT_EQ(applied.precision().reduce_dtype(), v1::FLOAT32);
  EXPECT_EQ(applied.checkpoint().dir(), "job-000001");
  EXPECT_EQ(applied.checkpoint().every_steps(), 0);

  const JobSpec plain = WithDefaults(JobSpec(), "job-000002");
  EXPECT_EQ(plain.precision().param_dtype(), v1::FLOAT32);
  EXPECT_EQ(plain.precision().grad_dtype(), v1::FLOAT32);
  EXPECT_EQ(plain.precision().initial_loss_scale(), 1.0);
  EXPECT_FALSE(plain.precision().dynamic_loss_scale());
  // zero3's pool depends on the plan (twice the most buckets one module spans): left unset for
  // the engine, which sizes it from the plan of each generation's W.
  JobSpec zero3;
  zero3.set_mode(v1::ZERO3);
  EXPECT_FALSE(WithDefaults(zero3, "job-000003").has_gather_pool_buckets());
  // resume_from.step's default is the other job's latest committed checkpoint: the coordinator
  // resolves it at submission (JobManager), so defaults leave it unset.
  JobSpec resumed;
  resumed.mutable_resume_from()->set_job_id("job-000001");
  EXPECT_FALSE(WithDefaults(resumed, "job-000004").resume_from().has_step());
}

TEST(JobSpecDefaultsTest, ExplicitValuesAreKept) {
  JobSpec spec;
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.mutable_optimizer()->set_weight_decay(0.0);  // explicit 0, not "unset"
  spec.set_min_workers(4);
  spec.set_max_workers(8);
  spec.set_steps(0);  // invalid, but defaults must not hide it from validation
  spec.set_mode(v1::DDP);
  const JobSpec applied = WithDefaults(spec);
  EXPECT_EQ(applied.optimizer().weight_decay(), 0.0);
  EXPECT_EQ(applied.min_workers(), 4);
  EXPECT_EQ(applied.max_workers(), 8);
  EXPECT_EQ(applied.steps(), 0);
  EXPECT_EQ(applied.mode(), v1::DDP);
}

TEST(JobSpecDefaultsTest, AttachedJobsGetNoDataStepsOrBatchAndTheirPinnedWorkerCount) {
  JobSpec spec;
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  v1::AttachedModel& attached = *spec.mutable_workload()->mutable_attached();
  attached.add_tensors()->set_name("w");
  for (const char* name : {"node-c", "node-a", "node-b"}) attached.add_workers(name);
  const JobSpec applied = WithDefaults(spec, "job-000003");
  EXPECT_FALSE(applied.workload().has_dataset_size());
  EXPECT_FALSE(applied.has_global_batch());
  EXPECT_TRUE(applied.has_steps());
  EXPECT_EQ(applied.steps(), 0);
  EXPECT_EQ(applied.min_workers(), 3);
  EXPECT_EQ(applied.max_workers(), 3);
  // Everything else as for built-in models.
  JobSpec builtin = spec;
  builtin.mutable_workload()->clear_attached();
  builtin.mutable_workload()->set_preset("seed");
  const JobSpec builtin_applied = WithDefaults(builtin, "job-000003");
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(applied.optimizer(),
                                                                 builtin_applied.optimizer()));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(applied.precision(),
                                                                 builtin_applied.precision()));
  EXPECT_EQ(applied.mode(), builtin_applied.mode());
  EXPECT_EQ(applied.bucket_elems(), builtin_applied.bucket_elems());
  // In zero3 the bucket is the model's elements / 32, within [65536, 4194304]: w is a scalar (one
  // element), so 65536; 40 tensors of 2^20 elements make 1310720; 200 of them, 4194304.
  JobSpec zero3 = spec;
  zero3.set_mode(v1::ZERO3);
  EXPECT_EQ(WithDefaults(zero3).bucket_elems(), 65536);
  for (int t = 0; t < 40; ++t) {
    v1::AttachedTensor& tensor = *zero3.mutable_workload()->mutable_attached()->add_tensors();
    tensor.set_name("t" + std::to_string(t));
    tensor.add_shape(1024);
    tensor.add_shape(1024);
  }
  EXPECT_EQ(WithDefaults(zero3).bucket_elems(), (40 * 1048576 + 1 + 31) / 32);
  for (int t = 40; t < 200; ++t) {
    v1::AttachedTensor& tensor = *zero3.mutable_workload()->mutable_attached()->add_tensors();
    tensor.set_name("t" + std::to_string(t));
    tensor.add_shape(1024);
    tensor.add_shape(1024);
  }
  EXPECT_EQ(WithDefaults(zero3).bucket_elems(), 4194304);
  // Set by the user, kept.
  zero3.set_bucket_elems(2048);
  EXPECT_EQ(WithDefaults(zero3).bucket_elems(), 2048);
  EXPECT_EQ(applied.checkpoint().dir(), "job-000003");
  EXPECT_EQ(applied.max_attempts(), builtin_applied.max_attempts());
  // Applying the defaults again changes nothing.
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(WithDefaults(applied), applied));

  // Explicit values are kept for validation to judge.
  spec.set_steps(5);
  spec.set_global_batch(64);
  spec.set_min_workers(2);
  spec.mutable_workload()->set_dataset_size(10);
  const JobSpec explicit_values = WithDefaults(spec);
  EXPECT_EQ(explicit_values.steps(), 5);
  EXPECT_EQ(explicit_values.global_batch(), 64);
  EXPECT_EQ(explicit_values.min_workers(), 2);
  EXPECT_EQ(explicit_values.max_workers(), 3);
  EXPECT_EQ(explicit_values.workload().dataset_size(), 10);
}

TEST(JobSpecJsonTest, RoundTripsThroughJson) {
  JobSpec spec;
  spec.set_name("seed-adamw");
  spec.mutable_workload()->set_preset("seed");
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.mutable_optimizer()->set_lr(0.003);
  spec.mutable_optimizer()->set_weight_decay(0.0);
  spec.set_mode(v1::ZERO1);
  spec.mutable_precision()->set_param_dtype(v1::BFLOAT16);
  spec.set_clip_grad_norm(1.5);
  spec.set_min_workers(2);
  spec.set_max_workers(4);
  spec.set_steps(80);
  spec.set_seed(18446744073709551615ull);
  spec.mutable_workload()->add_layer_sizes(10);

  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(spec, &json).ok());
  EXPECT_NE(json.find("\"weightDecay\":0"), std::string::npos) << json;  // presence kept
  JobSpec parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(spec, parsed));
  EXPECT_TRUE(parsed.optimizer().has_weight_decay());
  EXPECT_FALSE(parsed.optimizer().has_momentum());

  JobSpec from_snake;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  R"({"name":"a","mode":"DDP","optimizer":{"kind":"SGD","lr":0.01},
                      "global_batch":"128","workload":{"preset":"seed"}})",
                  &from_snake)
                  .ok());
  EXPECT_EQ(from_snake.mode(), v1::DDP);
  EXPECT_EQ(from_snake.global_batch(), 128);
  EXPECT_FALSE(
      google::protobuf::util::JsonStringToMessage(R"({"mode":"ZERO9"})", &from_snake).ok());
}

}  // namespace
}  // namespace zeroshard::jobspec

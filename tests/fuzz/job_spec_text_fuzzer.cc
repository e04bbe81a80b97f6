// libFuzzer target for the CLI's job spec files: arbitrary text through the YAML/JSON parser and,
// when it parses, through defaults and validation as the coordinator would judge it.
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/job_spec_file.h"
#include "jobspec/job_spec_defaults.h"
#include "jobspec/job_spec_validation.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::StatusOr<zeroshard::v1::JobSpec> spec =
      zeroshard::client::ParseJobSpec(absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!spec.ok()) return 0;
  // The result is irrelevant: the fuzzer looks for crashes, hangs and sanitizer reports.
  (void)zeroshard::jobspec::ValidateJobSpec(zeroshard::jobspec::WithDefaults(*spec));
  return 0;
}

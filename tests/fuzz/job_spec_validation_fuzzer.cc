// libFuzzer target for JobSpec validation: the input is a serialized JobSpec (any field values
// the wire format can carry), validated as the coordinator does, with and without a job id.
#include <cstddef>
#include <cstdint>

#include "jobspec/job_spec_defaults.h"
#include "jobspec/job_spec_validation.h"
#include "zeroshard/v1/job.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zeroshard::v1::JobSpec spec;
  if (!spec.ParseFromArray(data, static_cast<int>(size))) return 0;
  // The results are irrelevant: the fuzzer looks for crashes, hangs and sanitizer reports.
  (void)zeroshard::jobspec::ValidateJobSpec(zeroshard::jobspec::WithDefaults(spec));
  (void)zeroshard::jobspec::ValidateJobSpec(zeroshard::jobspec::WithDefaults(spec, "job-000001"));
  (void)zeroshard::jobspec::ValidateCheckpointPath(spec.checkpoint().dir(), "checkpoint.dir");
  return 0;
}

// Reads a JobSpec from a JSON or YAML file (the CLI's `submit FILE`). YAML is mapped to JSON
// and then parsed by protobuf's JSON parser, so both accept the same field names (snake_case
// or lowerCamelCase) and enum names.
#ifndef ZEROSHARD_CLIENT_JOB_SPEC_FILE_H_
#define ZEROSHARD_CLIENT_JOB_SPEC_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "zeroshard/v1/job.pb.h"

namespace zeroshard::client {

// Parses `text` as JSON when it starts with '{', else as YAML. INVALID_ARGUMENT naming the
// problem (and the field, where the parser knows it) on malformed input.
absl::StatusOr<v1::JobSpec> ParseJobSpec(absl::string_view text);

// Reads and parses `path`. NOT_FOUND when it cannot be read.
absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path);

}  // namespace zeroshard::client

#endif  // ZEROSHARD_CLIENT_JOB_SPEC_FILE_H_

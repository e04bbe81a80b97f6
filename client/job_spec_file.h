// Reads a JobSpec from a JSON or YAML file (the CLI's `submit FILE`). YAML is mapped to JSON
// and then parsed by protobuf's JSON parser, so both accept the same field names (snake_case
// or lowerCamelCase) and enum names.
#ifndef ZEROSHARD_CLIENT_JOB_SPEC_FILE_H_
#define ZEROSHARD_CLIENT_JOB_SPEC_FILE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "zeroshard/v1/job.pb.h"

namespace zeroshard::client {

// How many YAML nodes a spec may map to beyond one per byte of its text. Written out, every node
// takes at least a byte; an alias stands for its anchor's whole node, so nested aliases can make a
// few lines stand for billions of nodes. Past this the spec is refused rather than expanded.
inline constexpr size_t kYamlSpecExtraNodes = 4096;

// Parses `text` as JSON when it starts with '{', else as YAML. INVALID_ARGUMENT naming the
// problem (and the field, where the parser knows it) on malformed input, and on YAML whose
// aliases expand it to more than text.size() + kYamlSpecExtraNodes nodes.
absl::StatusOr<v1::JobSpec> ParseJobSpec(absl::string_view text);

// Reads and parses `path`. NOT_FOUND when it cannot be read.
absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path);

}  // namespace zeroshard::client

#endif  // ZEROSHARD_CLIENT_JOB_SPEC_FILE_H_

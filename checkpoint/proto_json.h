// The JSON form of checkpoint records (shard headers, fragment tables, manifests): protobuf's
// JSON mapping with the proto's field names, every field printed.
#ifndef ZEROSHARD_CHECKPOINT_PROTO_JSON_H_
#define ZEROSHARD_CHECKPOINT_PROTO_JSON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace zeroshard::checkpoint {

enum class JsonStyle {
  kCompact,   // one line: metadata values inside a shard file
  kIndented,  // for people: manifest.json
};

// Fields print under their proto names ("job_id"), zeros and empty lists included; 64-bit
// integers print as strings and enums by name, as protobuf's JSON mapping does. Thread-safe.
std::string ToJson(const google::protobuf::Message& message, JsonStyle style = JsonStyle::kCompact);

// Parses what ToJson wrote into `message` (cleared first). Unknown fields are ignored, so a
// newer writer may add fields an older reader can do without (the records' format_version says
// when it may not). DATA_LOSS naming `what` when the text is not such JSON. Thread-safe.
absl::Status FromJson(absl::string_view json, absl::string_view what,
                      google::protobuf::Message* message);

}  // namespace zeroshard::checkpoint

#endif  // ZEROSHARD_CHECKPOINT_PROTO_JSON_H_

// Checkpoint records as JSON, through protobuf's JSON utilities.
#include "checkpoint/proto_json.h"

#include "absl/strings/str_cat.h"
#include "common/dcheck.h"
#include "google/protobuf/util/json_util.h"

namespace zeroshard::checkpoint {

std::string ToJson(const google::protobuf::Message& message, JsonStyle style) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  options.add_whitespace = style == JsonStyle::kIndented;
  std::string json;
  // Printing fails only for an Any whose type cannot be resolved; these records have none.
  const auto printed = google::protobuf::util::MessageToJsonString(message, &json, options);
  ZS_DCHECK(printed.ok()) << printed.ToString();
  return json;
}

absl::Status FromJson(absl::string_view json, absl::string_view what,
                      google::protobuf::Message* message) {
  message->Clear();
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(std::string(json), message, options);
  if (!parsed.ok()) return absl::DataLossError(absl::StrCat(what, ": ", parsed.ToString()));
  return absl::OkStatus();
}

}  // namespace zeroshard::checkpoint

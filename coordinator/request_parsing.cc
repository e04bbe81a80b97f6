// Parsing of raw Coordinator requests and serialization of their responses (see the header).
#include "coordinator/request_parsing.h"

#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/common.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/impl/codegen/proto_utils.h"

namespace zeroshard::coordinator {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

// How deep DescribeParseFailure follows nested messages; the parser's own recursion limit is 100.
constexpr int kMaxDiagnosisDepth = 100;

// The first problem in `fields` (a message of `type` parsed without its schema), or none.
std::optional<std::string> FindProblem(const UnknownFieldSet& fields,
                                       const google::protobuf::Descriptor& type,
                                       const std::string& path, int depth) {
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& field = fields.field(i);
    // A field the schema does not know, or one with another wire type, is kept as unknown by
    // the parser: neither makes a request unparseable.
    const FieldDescriptor* descriptor = type.FindFieldByNumber(field.number());
    if (descriptor == nullptr || field.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const std::string field_path = absl::StrCat(path, path.empty() ? "" : ".", descriptor->name());
    const std::string& value = field.length_delimited();
    if (descriptor->type() == FieldDescriptor::TYPE_STRING) {
      // The parser's own check, so that the diagnosis agrees with it.
      if (!google::protobuf::internal::IsStructurallyValidUTF8(value.data(),
                                                               static_cast<int>(value.size()))) {
        return absl::StrCat(field_path, ": holds invalid UTF-8 (string fields must be UTF-8)");
      }
    } else if (descriptor->type() == FieldDescriptor::TYPE_MESSAGE && depth < kMaxDiagnosisDepth) {
      UnknownFieldSet nested;
      if (!nested.ParseFromString(value)) {
        return absl::StrCat(field_path, ": not protobuf wire format");
      }
      if (std::optional<std::string> problem =
              FindProblem(nested, *descriptor->message_type(), field_path, depth + 1)) {
        return problem;
      }
    }
  }
  return std::nullopt;
}

}  // namespace

std::string DescribeParseFailure(absl::string_view bytes,
                                 const google::protobuf::Descriptor& type) {
  UnknownFieldSet fields;
  if (!fields.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return "the bytes are not protobuf wire format";
  }
  if (std::optional<std::string> problem = FindProblem(fields, type, "", 0)) return *problem;
  return "it does not parse (nested too deeply, or a field's value is out of range)";
}

absl::Status ParseRequest(const grpc::ByteBuffer& request, google::protobuf::Message* message) {
  message->Clear();
  // Deserialize consumes its buffer; the copy shares the request's slices.
  grpc::ByteBuffer consumed(request);
  if (grpc::SerializationTraits<google::protobuf::Message>::Deserialize(&consumed, message).ok()) {
    return absl::OkStatus();
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (request.Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  const google::protobuf::Descriptor& type = *message->GetDescriptor();
  message->Clear();
  return absl::InvalidArgumentError(absl::StrCat("request: not a valid ", type.full_name(), ": ",
                                                 DescribeParseFailure(bytes, type)));
}

absl::Status SerializeResponse(const google::protobuf::Message& message,
                               grpc::ByteBuffer* response) {
  bool own_buffer = false;
  const grpc::Status status = grpc::SerializationTraits<google::protobuf::Message>::Serialize(
      message, response, &own_buffer);
  if (status.ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("response: cannot serialize ",
                                          message.GetDescriptor()->full_name(), ": ",
                                          status.error_message()));
}

}  // namespace zeroshard::coordinator

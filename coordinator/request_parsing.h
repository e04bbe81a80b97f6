// Parsing of Coordinator requests received as raw bytes: a request that is not a valid message of
// its type gets INVALID_ARGUMENT saying why, where gRPC's own parsing answers a bare UNIMPLEMENTED.
#ifndef ZEROSHARD_COORDINATOR_REQUEST_PARSING_H_
#define ZEROSHARD_COORDINATOR_REQUEST_PARSING_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace zeroshard::coordinator {

// Parses `request` into `message` (cleared first). When it does not parse: INVALID_ARGUMENT
// "request: not a valid <full type name>: <DescribeParseFailure>", which quotes no request bytes.
absl::Status ParseRequest(const grpc::ByteBuffer& request, google::protobuf::Message* message);

// Why `bytes`, which failed to parse as `type`, is not a valid message of it, for an error
// message: "the bytes are not protobuf wire format", or "<field path>: holds invalid UTF-8 (string
// fields must be UTF-8)" naming the first such string field (depth-first, in wire order, through
// nested messages and map entries), or "<field path>: not protobuf wire format" for a nested
// message. Anything else (a nesting too deep, say) gets a general reason.
std::string DescribeParseFailure(absl::string_view bytes, const google::protobuf::Descriptor& type);

// Serializes `message` into `response`; INTERNAL when it cannot be (it is over 2 GiB).
absl::Status SerializeResponse(const google::protobuf::Message& message,
                               grpc::ByteBuffer* response);

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_REQUEST_PARSING_H_

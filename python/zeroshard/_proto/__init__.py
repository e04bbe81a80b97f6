# Home of the generated protobuf/gRPC stubs (zeroshard._proto.zeroshard.v1), written by
# python/generate_stubs.sh: by Bazel's //python:proto_stubs, or by hand outside Bazel.

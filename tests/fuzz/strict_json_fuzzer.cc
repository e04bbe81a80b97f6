// libFuzzer target for the strict JSON parser of safetensors headers (checkpoint/strict_json.h):
// a header read from an untrusted file goes through it before anything else looks at it.
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/strict_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  // The results are irrelevant: the fuzzer looks for crashes, hangs and sanitizer reports.
  (void)zeroshard::checkpoint::ParseStrictJson(text);
  (void)zeroshard::checkpoint::IsValidUtf8(text);
  return 0;
}

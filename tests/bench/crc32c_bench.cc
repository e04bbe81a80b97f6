// Benchmark of CRC32C, which checkpoint writes and loads run over every byte: GB/s of the
// portable slicing-by-8 path and the SSE4.2 path, interleaved in one run. One JSON line.
// Run: bazel run -c opt //tests/bench:crc32c_bench
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "checkpoint/crc32c.h"

ABSL_FLAG(int64_t, bytes, int64_t{64} << 20, "bytes checksummed per repetition");
ABSL_FLAG(int, reps, 7, "timed repetitions of each path (medians are reported)");

namespace zeroshard::checkpoint {
namespace {

using Extend = uint32_t (*)(uint32_t, const void*, size_t);

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

int Run() {
  const size_t bytes = static_cast<size_t>(absl::GetFlag(FLAGS_bytes));
  const int reps = absl::GetFlag(FLAGS_reps);
  std::vector<unsigned char> data(bytes);
  std::mt19937_64 rng(1);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  const bool has_sse42 = crc32c_internal::HasSse42();
  std::vector<Extend> paths = {&crc32c_internal::ExtendPortable};
  if (has_sse42) paths.push_back(&crc32c_internal::ExtendSse42);
  std::vector<std::vector<double>> seconds(paths.size());
  std::vector<uint32_t> results(paths.size());
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t p = 0; p < paths.size(); ++p) {
      const auto start = std::chrono::steady_clock::now();
      results[p] = paths[p](0, data.data(), data.size());
      seconds[p].push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  if (has_sse42 && results[0] != results[1]) {
    std::fprintf(stderr, "the paths disagree: 0x%08x vs 0x%08x\n", results[0], results[1]);
    return 1;
  }
  const double portable_gbps = bytes / Median(seconds[0]) / 1e9;
  const double sse42_gbps = has_sse42 ? bytes / Median(seconds[1]) / 1e9 : 0.0;
  std::printf(
      "{\"bench\":\"crc32c\",\"bytes\":%zu,\"reps\":%d,\"portable_gbps\":%.3f,"
      "\"sse42_gbps\":%.3f,\"ratio\":%.2f}\n",
      bytes, reps, portable_gbps, sse42_gbps, has_sse42 ? sse42_gbps / portable_gbps : 0.0);
  return 0;
}

}  // namespace
}  // namespace zeroshard::checkpoint

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return zeroshard::checkpoint::Run();
}

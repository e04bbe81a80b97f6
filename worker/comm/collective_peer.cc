// collective_peer: one rank of a multi-process Gloo test, launched by gloo_multiprocess_test.
// Modes: "check" runs every collective (collective_checks) and exits 0 when all match;
// "join_and_hang" connects, marks "<prefix>/joined/<rank>" in the store and waits to be killed;
// "allgather_forever" connects, marks it too, then all-gathers pieces of the first
// --piece_counts fp32 elements until a collective fails (its peer's test kills it mid-transfer).
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/comm/collective_checks.h"
#include "worker/comm/file_store.h"
#include "worker/comm/gloo_communicator.h"

ABSL_FLAG(std::string, store_dir, "", "FileStore directory shared by the ranks");
ABSL_FLAG(std::string, prefix, "gloo", "store key prefix of this group");
ABSL_FLAG(int, rank, 0, "this process's rank");
ABSL_FLAG(int, world_size, 1, "number of ranks");
ABSL_FLAG(std::string, mode, "check", "check | join_and_hang | allgather_forever");
ABSL_FLAG(int64_t, segment_bytes, 64 * 1024, "GlooCommunicatorOptions::segment_bytes");
ABSL_FLAG(std::string, piece_counts, "0,1,1001", "comma-separated piece sizes to check");
ABSL_FLAG(std::string, types, "fp32,bf16", "comma-separated element types to check");
ABSL_FLAG(std::string, transport, "tcp", "GlooCommunicatorOptions::transport: tcp | shm | auto");
ABSL_FLAG(int64_t, shm_slot_bytes, zeroshard::comm::GlooCommunicatorOptions().shm_slot_bytes,
          "GlooCommunicatorOptions::shm_slot_bytes");
ABSL_FLAG(int, shm_slots, zeroshard::comm::GlooCommunicatorOptions().shm_slots,
          "GlooCommunicatorOptions::shm_slots");
ABSL_FLAG(std::string, host, "",
          "GlooCommunicatorOptions::host (empty: this machine's name); ranks naming different "
          "hosts never share memory");

namespace zeroshard::comm {
namespace {

bool ParseType(absl::string_view name, ElementType* type) {
  for (ElementType candidate :
       {ElementType::kFloat64, ElementType::kFloat32, ElementType::kBFloat16, ElementType::kFloat16,
        ElementType::kInt32, ElementType::kInt64}) {
    if (name == ElementTypeName(candidate)) {
      *type = candidate;
      return true;
    }
  }
  return false;
}

int Main() {
  const int rank = absl::GetFlag(FLAGS_rank);
  FileStore store(absl::GetFlag(FLAGS_store_dir));
  GlooCommunicatorOptions options;
  options.rank = rank;
  options.world_size = absl::GetFlag(FLAGS_world_size);
  options.store = &store;
  options.store_prefix = absl::GetFlag(FLAGS_prefix);
  options.rendezvous_timeout = absl::Seconds(60);
  options.segment_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_segment_bytes));
  absl::StatusOr<Transport> transport = ParseTransport(absl::GetFlag(FLAGS_transport));
  if (!transport.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, transport.status().ToString().c_str());
    return 2;
  }
  options.transport = *transport;
  options.shm_slot_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_shm_slot_bytes));
  options.shm_slots = absl::GetFlag(FLAGS_shm_slots);
  options.host = absl::GetFlag(FLAGS_host);
  auto communicator = GlooCommunicator::Create(options);
  if (!communicator.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, communicator.status().ToString().c_str());
    return 1;
  }
  if (absl::GetFlag(FLAGS_mode) == "join_and_hang") {
    if (!store.Set(absl::StrCat(options.store_prefix, "/joined/", rank), "1").ok()) return 1;
    while (true) ::pause();
  }
  if (absl::GetFlag(FLAGS_mode) == "allgather_forever") {
    size_t piece_count = 0;
    const std::vector<std::string> counts = absl::StrSplit(absl::GetFlag(FLAGS_piece_counts), ',');
    if (!absl::SimpleAtoi(counts.front(), &piece_count)) return 2;
    std::vector<float> gathered(piece_count * options.world_size, 1.0f);
    if (!store.Set(absl::StrCat(options.store_prefix, "/joined/", rank), "1").ok()) return 1;
    while (true) {
      absl::Status status =
          (*communicator)
              ->AllGatherInPlace(gathered.data(), piece_count, ElementType::kFloat32)
              ->Wait(absl::Minutes(5));
      if (!status.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, status.ToString().c_str());
        return 1;
      }
    }
  }
  uint64_t seed = 1000;
  for (absl::string_view type_name : absl::StrSplit(absl::GetFlag(FLAGS_types), ',')) {
    ElementType type;
    if (!ParseType(type_name, &type)) {
      std::fprintf(stderr, "unknown type %s\n", std::string(type_name).c_str());
      return 2;
    }
    for (absl::string_view count_text : absl::StrSplit(absl::GetFlag(FLAGS_piece_counts), ',')) {
      size_t piece_count;
      if (!absl::SimpleAtoi(count_text, &piece_count)) return 2;
      absl::Status status = CheckAllCollectives(**communicator, piece_count, type, ++seed);
      if (!status.ok()) {
        std::fprintf(stderr, "rank %d, %s, piece_count %zu: %s\n", rank,
                     std::string(type_name).c_str(), piece_count, status.ToString().c_str());
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace zeroshard::comm

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return zeroshard::comm::Main();
}

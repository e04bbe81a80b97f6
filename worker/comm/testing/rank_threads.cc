// RunOnRankThreads: one std::thread per rank, every status kept until all have joined.
#include "worker/comm/testing/rank_threads.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace zeroshard::comm::testing {

absl::Status RunOnRankThreads(int world_size, absl::FunctionRef<absl::Status(int rank)> body) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world_size ", world_size, " is below 1"));
  }
  // Each thread writes only its own element; join() orders the writes before the reads below.
  std::vector<absl::Status> statuses(world_size);
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&statuses, body, rank] { statuses[rank] = body(rank); });
  }
  for (std::thread& thread : threads) thread.join();

  absl::StatusCode code = absl::StatusCode::kOk;
  std::string message;
  for (int rank = 0; rank < world_size; ++rank) {
    if (statuses[rank].ok()) continue;
    if (code == absl::StatusCode::kOk) {
      code = statuses[rank].code();
    } else {
      absl::StrAppend(&message, "; ");
    }
    absl::StrAppend(&message, "rank ", rank, ": ", statuses[rank].message());
  }
  if (code == absl::StatusCode::kOk) return absl::OkStatus();
  return absl::Status(code, message);
}

}  // namespace zeroshard::comm::testing

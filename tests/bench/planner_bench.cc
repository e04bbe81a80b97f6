// Planner benchmark binary: prints RunPlannerBench's JSON line (tests/bench/planner_bench_lib.h).
#include <cstdio>

#include "tests/bench/planner_bench_lib.h"

int main() {
  const absl::StatusOr<std::string> line = zeroshard::bench::RunPlannerBench();
  if (!line.ok()) {
    std::fprintf(stderr, "planner_bench: %s\n", line.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", line->c_str());
  return 0;
}

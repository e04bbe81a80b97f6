// The planner benchmark as a function, shared by planner_bench and coordinator_load: the global
// layout of 100,000 tensors (10^12 elements) plus one rank's view at W = 1024.
#ifndef ZEROSHARD_TESTS_BENCH_PLANNER_BENCH_LIB_H_
#define ZEROSHARD_TESTS_BENCH_PLANNER_BENCH_LIB_H_

#include <string>

#include "absl/status/statusor.h"

namespace zeroshard::bench {

// Runs the repetitions and returns the result as one JSON object ("bench":"planner"), no newline.
absl::StatusOr<std::string> RunPlannerBench();

}  // namespace zeroshard::bench

#endif  // ZEROSHARD_TESTS_BENCH_PLANNER_BENCH_LIB_H_

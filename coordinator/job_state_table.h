// The allowed changes of a job's state (v1::JobState), kept as data in this one list: JobManager
// refuses any change not in it. The numbered diagram above JobManager explains each edge.
#ifndef ZEROSHARD_COORDINATOR_JOB_STATE_TABLE_H_
#define ZEROSHARD_COORDINATOR_JOB_STATE_TABLE_H_

#include "zeroshard/v1/job.pb.h"

namespace zeroshard::coordinator {

struct JobStateEdge {
  v1::JobState from;
  v1::JobState to;
};

// Constant data, safe to read from any thread. kJobStateEdges[i] is edge (i + 1) of the diagram
// in job_manager.h: a new edge goes here, in the diagram, and in the tests' expected matrix.
inline constexpr JobStateEdge kJobStateEdges[] = {
    {v1::PENDING, v1::RUNNING},       // (1)
    {v1::PENDING, v1::FAILED},        // (2)
    {v1::PENDING, v1::CANCELLED},     // (3)
    {v1::RUNNING, v1::SUCCEEDED},     // (4)
    {v1::RUNNING, v1::RECOVERING},    // (5)
    {v1::RUNNING, v1::FAILED},        // (6)
    {v1::RUNNING, v1::CANCELLED},     // (7)
    {v1::RECOVERING, v1::RUNNING},    // (8)
    {v1::RECOVERING, v1::FAILED},     // (9)
    {v1::RECOVERING, v1::CANCELLED},  // (10)
    // The one edge from a state to itself: a generation adopted after a coordinator restart
    // (JobManager takes it only while adopting).
    {v1::RUNNING, v1::RUNNING},  // (11)
};

// Whether `from` -> `to` is in kJobStateEdges. No state but RUNNING changes to itself.
constexpr bool IsAllowedJobStateEdge(v1::JobState from, v1::JobState to) {
  for (const JobStateEdge& edge : kJobStateEdges) {
    if (edge.from == from && edge.to == to) return true;
  }
  return false;
}

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_JOB_STATE_TABLE_H_

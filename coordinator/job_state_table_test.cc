// Checks the job state table against the diagram above JobManager (job_manager.h): the expected
// edges here are written from the diagram, not read from the table.
#include "coordinator/job_state_table.h"

#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace zeroshard::coordinator {
namespace {

constexpr v1::JobState kStates[] = {v1::PENDING,   v1::RUNNING, v1::RECOVERING,
                                    v1::SUCCEEDED, v1::FAILED,  v1::CANCELLED};

// kExpected[i][j] is 1 when a job may go from kStates[i] to kStates[j]. Rows: from; columns: to.
// clang-format off
constexpr int kExpected[6][6] = {
    //                PENDING RUNNING RECOVERING SUCCEEDED FAILED CANCELLED
    /* PENDING    */ {0,      1,      0,         0,        1,     1},
    /* RUNNING    */ {0,      1,      1,         1,        1,     1},
    /* RECOVERING */ {0,      1,      0,         0,        1,     1},
    /* SUCCEEDED  */ {0,      0,      0,         0,        0,     0},
    /* FAILED     */ {0,      0,      0,         0,        0,     0},
    /* CANCELLED  */ {0,      0,      0,         0,        0,     0},
};
// clang-format on

using Edge = std::pair<v1::JobState, v1::JobState>;

std::string EdgeName(v1::JobState from, v1::JobState to) {
  return v1::JobState_Name(from) + " -> " + v1::JobState_Name(to);
}

TEST(JobStateTableTest, TableHoldsExactlyTheEdgesOfTheDiagram) {
  std::set<Edge> expected;
  for (int from = 0; from < 6; ++from) {
    for (int to = 0; to < 6; ++to) {
      if (kExpected[from][to]) expected.insert({kStates[from], kStates[to]});
    }
  }
  std::set<Edge> in_table;
  for (const JobStateEdge& edge : kJobStateEdges) {
    EXPECT_TRUE(in_table.insert({edge.from, edge.to}).second)
        << "listed twice: " << EdgeName(edge.from, edge.to);
  }
  for (const Edge& edge : expected) {
    EXPECT_EQ(in_table.count(edge), 1u) << "missing: " << EdgeName(edge.first, edge.second);
  }
  for (const Edge& edge : in_table) {
    EXPECT_EQ(expected.count(edge), 1u)
        << "not in the diagram: " << EdgeName(edge.first, edge.second);
  }
}

TEST(JobStateTableTest, EdgesAreInTheDiagramsNumbering) {
  // (1) to (11), as listed under the diagram.
  const std::vector<Edge> numbered = {
      {v1::PENDING, v1::RUNNING},      {v1::PENDING, v1::FAILED},     {v1::PENDING, v1::CANCELLED},
      {v1::RUNNING, v1::SUCCEEDED},    {v1::RUNNING, v1::RECOVERING}, {v1::RUNNING, v1::FAILED},
      {v1::RUNNING, v1::CANCELLED},    {v1::RECOVERING, v1::RUNNING}, {v1::RECOVERING, v1::FAILED},
      {v1::RECOVERING, v1::CANCELLED}, {v1::RUNNING, v1::RUNNING},
  };
  std::vector<Edge> in_table;
  for (const JobStateEdge& edge : kJobStateEdges) in_table.push_back({edge.from, edge.to});
  EXPECT_EQ(in_table, numbered);
}

TEST(JobStateTableTest, IsAllowedAgreesWithTheDiagramForEveryPair) {
  for (int from = 0; from < 6; ++from) {
    for (int to = 0; to < 6; ++to) {
      EXPECT_EQ(IsAllowedJobStateEdge(kStates[from], kStates[to]), kExpected[from][to] == 1)
          << EdgeName(kStates[from], kStates[to]);
    }
  }
  // Not a state a job is ever in: no edge leads to or from it.
  for (v1::JobState state : kStates) {
    EXPECT_FALSE(IsAllowedJobStateEdge(v1::JOB_STATE_UNSPECIFIED, state));
    EXPECT_FALSE(IsAllowedJobStateEdge(state, v1::JOB_STATE_UNSPECIFIED));
  }
}

}  // namespace
}  // namespace zeroshard::coordinator

// GlooCommunicator with threads as ranks over an InMemoryStore: every collective for world sizes
// 1..5 over both transports (TCP and shared memory) and for a group spanning two hosts (both at
// once), sizes 0, 1, odd and large, every element type; Abort (of Create too) and timeouts; how
// the transport is chosen.
#include "worker/comm/gloo_communicator.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/comm/abort_signal.h"
#include "worker/comm/collective_checks.h"
#include "worker/comm/in_memory_store.h"
#include "worker/comm/testing/rank_threads.h"

namespace zeroshard::comm {
namespace {

using ::zeroshard::comm::testing::RunOnRankThreads;

// Creates `world_size` communicators concurrently (one thread per rank) over one store, each
// with `tuning`'s segment_bytes, staging_segments, lanes, thread_cpus and thread_nice, and the
// host `host_of(rank)` when given.
std::vector<std::unique_ptr<GlooCommunicator>> CreateGroup(
    int world_size, Store* store, const GlooCommunicatorOptions& tuning,
    std::function<std::string(int)> host_of = nullptr) {
  std::vector<std::unique_ptr<GlooCommunicator>> group(world_size);
  const absl::Status status = RunOnRankThreads(world_size, [&](int rank) -> absl::Status {
    GlooCommunicatorOptions options = tuning;
    if (host_of != nullptr) options.host = host_of(rank);
    options.rank = rank;
    options.world_size = world_size;
    options.store = store;
    options.rendezvous_timeout = absl::Seconds(30);
    auto communicator = GlooCommunicator::Create(options);
    if (!communicator.ok()) return communicator.status();
    group[rank] = std::move(*communicator);
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return group;
}

std::vector<std::unique_ptr<GlooCommunicator>> CreateGroup(
    int world_size, Store* store, size_t segment_bytes = GlooCommunicatorOptions().segment_bytes,
    Transport transport = Transport::kTcp) {
  GlooCommunicatorOptions tuning;
  tuning.segment_bytes = segment_bytes;
  tuning.transport = transport;
  return CreateGroup(world_size, store, tuning);
}

// Shared-memory tuning that makes messages cross chunk boundaries: chunks that do not divide the
// segments, and a ring of three, so it wraps many times per operation.
GlooCommunicatorOptions SmallChunks(size_t segment_bytes) {
  GlooCommunicatorOptions tuning;
  tuning.segment_bytes = segment_bytes;
  tuning.transport = Transport::kShm;
  tuning.shm_slot_bytes = 192;
  tuning.shm_slots = 3;
  return tuning;
}

std::string TransportTestName(Transport transport) { return TransportName(transport); }

constexpr ElementType kEveryType[] = {ElementType::kFloat32,  ElementType::kFloat64,
                                      ElementType::kBFloat16, ElementType::kFloat16,
                                      ElementType::kInt32,    ElementType::kInt64};

// What /dev/shm holds whose name starts with "zeroshard-<this pid>-", and this process's
// descriptors that point into /dev/shm.
std::vector<std::string> SharedMemoryLeftovers() {
  std::vector<std::string> found;
  const std::string mine = absl::StrCat("zeroshard-", getpid(), "-");
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    if (entry.path().filename().string().rfind(mine, 0) == 0) found.push_back(entry.path());
  }
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::filesystem::path target = std::filesystem::read_symlink(entry.path(), error);
    if (!error && target.string().rfind("/dev/shm/", 0) == 0) {
      found.push_back(absl::StrCat(entry.path().string(), " -> ", target.string()));
    }
  }
  return found;
}

// The thread ids of this process whose /proc status line `key` reads `value` exactly.
std::vector<std::string> ThreadsWhoseStatusReads(const std::string& key, const std::string& value) {
  std::vector<std::string> matching;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream status(task.path() / "status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind(key + ":", 0) != 0) continue;
      std::string field = line.substr(key.size() + 1);
      field.erase(0, field.find_first_not_of(" \t"));
      if (field == value) matching.push_back(task.path().filename().string());
    }
  }
  return matching;
}

// The nice value of each thread of this process (field 19 of /proc/self/task/<tid>/stat).
std::vector<int> ThreadNiceValues() {
  std::vector<int> values;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream stat(task.path() / "stat");
    std::string line;
    std::getline(stat, line);
    // A thread that ended since the directory was listed has no stat left to read.
    const size_t name_end = line.rfind(')');
    if (name_end == std::string::npos || name_end + 2 > line.size()) continue;
    // The command name may hold spaces: fields are counted after its closing parenthesis.
    std::istringstream fields(line.substr(name_end + 2));
    std::string field;
    // After the name: state (3) ... nice (19).
    for (int index = 3; index <= 19 && fields >> field; ++index) {
      if (index == 19) values.push_back(std::stoi(field));
    }
  }
  return values;
}

class GlooTransportTest : public ::testing::TestWithParam<Transport> {};

class GlooCollectivesTest : public ::testing::TestWithParam<std::tuple<int, Transport>> {};

TEST_P(GlooCollectivesTest, EveryCollectiveMatchesTheReference) {
  const auto [world_size, transport] = GetParam();
  InMemoryStore store;
  // Small segments so even the odd sizes cross several pipeline segments (and, over shared
  // memory, several chunks of a small ring).
  GlooCommunicatorOptions tuning;
  tuning.segment_bytes = 1024;
  if (transport == Transport::kShm) tuning = SmallChunks(1024);
  auto group = CreateGroup(world_size, &store, tuning);
  ASSERT_EQ(group.size(), static_cast<size_t>(world_size));
  for (const auto& communicator : group) ASSERT_NE(communicator, nullptr);
  for (const auto& communicator : group) {
    EXPECT_EQ(communicator->transport(), world_size > 1 ? transport : Transport::kTcp);
  }
  uint64_t seed = 1;
  for (ElementType type : kEveryType) {
    for (size_t piece_count : {size_t{0}, size_t{1}, size_t{1001}}) {
      ++seed;
      const absl::Status status = RunOnRankThreads(world_size, [&](int rank) {
        return CheckAllCollectives(*group[rank], piece_count, type, seed);
      });
      EXPECT_TRUE(status.ok()) << "type " << ElementTypeName(type) << ", piece_count "
                               << piece_count << ": " << status;
    }
  }
}

TEST_P(GlooCollectivesTest, LargeBucketWithDefaultSegments) {
  const auto [world_size, transport] = GetParam();
  if (world_size > 3) GTEST_SKIP() << "large sizes run at W <= 3 to keep the test fast";
  InMemoryStore store;
  auto group = CreateGroup(world_size, &store, GlooCommunicatorOptions().segment_bytes, transport);
  for (const auto& communicator : group) ASSERT_NE(communicator, nullptr);
  const size_t piece_count = (size_t{1} << 20) / world_size;
  const absl::Status status = RunOnRankThreads(world_size, [&](int rank) {
    return CheckAllCollectives(*group[rank], piece_count, ElementType::kFloat32, /*seed=*/77);
  });
  EXPECT_TRUE(status.ok()) << status;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooCollectivesTest,
                         ::testing::Combine(::testing::Range(1, 6),
                                            ::testing::Values(Transport::kTcp, Transport::kShm)),
                         [](const ::testing::TestParamInfo<std::tuple<int, Transport>>& info) {
                           return absl::StrCat("W", std::get<0>(info.param), "_",
                                               TransportTestName(std::get<1>(info.param)));
                         });

// The bits do not depend on the transport, nor on the shared-memory chunking.
TEST(GlooCommunicatorTest, SharedMemoryAndTcpGiveTheSameBits) {
  constexpr int kWorldSize = 3;
  constexpr size_t kPieceCount = 20011;
  const ElementType types[] = {ElementType::kFloat32, ElementType::kBFloat16, ElementType::kFloat16,
                               ElementType::kFloat64};
  for (ElementType type : types) {
    std::vector<std::vector<std::vector<char>>> results;
    std::vector<GlooCommunicatorOptions> tunings(3);
    tunings[0].segment_bytes = 4096;
    tunings[1] = SmallChunks(4096);
    tunings[2].segment_bytes = 4096;
    tunings[2].transport = Transport::kShm;
    for (const GlooCommunicatorOptions& tuning : tunings) {
      InMemoryStore store;
      auto group = CreateGroup(kWorldSize, &store, tuning);
      for (const auto& communicator : group) ASSERT_NE(communicator, nullptr);
      std::vector<std::vector<char>> buffers(kWorldSize);
      const absl::Status status = RunOnRankThreads(kWorldSize, [&](int rank) {
        std::vector<char>& buffer = buffers[rank];
        buffer = MakeInput(type, rank, kWorldSize * kPieceCount, 11);
        return group[rank]
            ->AllReduce(buffer.data(), kWorldSize * kPieceCount, type, ReduceOp::kSum)
            ->Wait(absl::Seconds(60));
      });
      ASSERT_TRUE(status.ok()) << status;
      results.push_back(buffers);
    }
    for (size_t run = 1; run < results.size(); ++run) {
      for (int rank = 0; rank < kWorldSize; ++rank) {
        EXPECT_TRUE(results[run][rank] == results[0][rank])
            << ElementTypeName(type) << ": run " << run << ", rank " << rank;
      }
    }
  }
}

TEST(GlooCommunicatorTest, AutoChoosesSharedMemoryOnOneHostAndTcpAcrossHosts) {
  for (bool one_host : {true, false}) {
    InMemoryStore store;
    std::vector<std::unique_ptr<GlooCommunicator>> group(3);
    const absl::Status status = RunOnRankThreads(3, [&](int rank) -> absl::Status {
      GlooCommunicatorOptions options;
      options.rank = rank;
      options.world_size = 3;
      options.store = &store;
      options.transport = Transport::kAuto;
      options.host = one_host ? "here" : (rank == 2 ? "there" : "here");
      auto communicator = GlooCommunicator::Create(options);
      if (!communicator.ok()) return communicator.status();
      group[rank] = std::move(*communicator);
      return CheckAllCollectives(*group[rank], 1001, ElementType::kFloat32, 3);
    });
    ASSERT_TRUE(status.ok()) << status;
    for (const auto& communicator : group) {
      EXPECT_EQ(communicator->transport(), one_host ? Transport::kShm : Transport::kTcp);
    }
    // Across hosts, ranks 0 and 1 still share memory; rank 2, alone on its host, uses TCP only.
    const std::vector<std::vector<int>> shared =
        one_host ? std::vector<std::vector<int>>{{1, 2}, {0, 2}, {0, 1}}
                 : std::vector<std::vector<int>>{{1}, {0}, {}};
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_EQ(group[rank]->SharedMemoryPeers(), shared[rank]) << "rank " << rank;
    }
  }
}

// Ranks 0, 1 on host "a" and 2, 3 on "b": the ring's hops 0 -> 1 and 2 -> 3 are shared memory,
// 1 -> 2 and 3 -> 0 TCP. Tiny chunks keep the shared-memory rings full, so sends wait for room
// while their rank waits on TCP. Every collective matches the reference and gives TCP's bits.
TEST(GlooCommunicatorTest, AGroupSpanningTwoHostsMixesLinksAndGivesTheSameBits) {
  constexpr int kWorldSize = 4;
  auto two_hosts = [](int rank) { return rank < 2 ? std::string("a") : std::string("b"); };
  GlooCommunicatorOptions mixed = SmallChunks(1024);
  mixed.transport = Transport::kAuto;
  InMemoryStore mixed_store;
  auto group = CreateGroup(kWorldSize, &mixed_store, mixed, two_hosts);
  for (const auto& communicator : group) ASSERT_NE(communicator, nullptr);
  for (int rank = 0; rank < kWorldSize; ++rank) {
    EXPECT_EQ(group[rank]->transport(), Transport::kTcp);
    EXPECT_EQ(group[rank]->SharedMemoryPeers(), std::vector<int>{rank ^ 1}) << "rank " << rank;
  }
  uint64_t seed = 100;
  for (ElementType type : kEveryType) {
    for (size_t piece_count : {size_t{0}, size_t{1}, size_t{1001}, size_t{40000}}) {
      ++seed;
      const absl::Status status = RunOnRankThreads(kWorldSize, [&](int rank) {
        return CheckAllCollectives(*group[rank], piece_count, type, seed);
      });
      EXPECT_TRUE(status.ok()) << "type " << ElementTypeName(type) << ", piece_count "
                               << piece_count << ": " << status;
    }
  }
  InMemoryStore tcp_store;
  GlooCommunicatorOptions tcp;
  tcp.segment_bytes = 1024;
  auto tcp_group = CreateGroup(kWorldSize, &tcp_store, tcp);
  for (const auto& communicator : tcp_group) ASSERT_NE(communicator, nullptr);
  constexpr size_t kCount = kWorldSize * 20011;
  for (ElementType type : {ElementType::kFloat32, ElementType::kBFloat16}) {
    std::vector<std::vector<char>> over_mixed(kWorldSize), over_tcp(kWorldSize);
    for (auto* run : {&group, &tcp_group}) {
      auto& results = run == &group ? over_mixed : over_tcp;
      const absl::Status status = RunOnRankThreads(kWorldSize, [&](int rank) {
        results[rank] = MakeInput(type, rank, kCount, 11);
        return (*run)[rank]
            ->AllReduce(results[rank].data(), kCount, type, ReduceOp::kSum)
            ->Wait(absl::Seconds(60));
      });
      ASSERT_TRUE(status.ok()) << status;
    }
    for (int rank = 0; rank < kWorldSize; ++rank) {
      EXPECT_TRUE(over_mixed[rank] == over_tcp[rank]) << ElementTypeName(type) << ", rank " << rank;
    }
  }
}

// Rank 0 (sharing memory with rank 1, reaching rank 2 over TCP) blocks in an all-reduce its peers
// never issue, its sends to rank 1 queued behind a full ring: an abort ends it within 2 s.
TEST(GlooCommunicatorTest, AbortEndsAWaitInAGroupSpanningHosts) {
  InMemoryStore store;
  GlooCommunicatorOptions tuning = SmallChunks(4096);
  tuning.transport = Transport::kAuto;
  auto group = CreateGroup(3, &store, tuning, [](int rank) { return rank < 2 ? "a" : "b"; });
  for (const auto& communicator : group) ASSERT_NE(communicator, nullptr);
  ASSERT_EQ(group[0]->SharedMemoryPeers(), std::vector<int>{1});
  std::vector<float> bucket(1 << 16, 1.0f);
  CollectiveOptions options;
  options.timeout = absl::Minutes(10);
  std::unique_ptr<Work> work = group[0]->AllReduce(bucket.data(), bucket.size(),
                                                   ElementType::kFloat32, ReduceOp::kSum, options);
  EXPECT_EQ(work->Wait(absl::Milliseconds(50)).code(), absl::StatusCode::kDeadlineExceeded);
  const absl::Time aborted_at = absl::Now();
  group[0]->Abort();
  const absl::Status status = work->Wait(absl::Seconds(30));
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_LT(absl::Now() - aborted_at, absl::Seconds(2));
  // The peers learn of it instead of waiting out their timeouts.
  for (int rank : {1, 2}) {
    const absl::Time start = absl::Now();
    EXPECT_FALSE(group[rank]->Barrier(options)->Wait(absl::Seconds(60)).ok()) << "rank " << rank;
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "rank " << rank;
  }
}

TEST(GlooCommunicatorTest, ShmFailsClearlyWhenRanksAreOnDifferentHosts) {
  InMemoryStore store;
  std::vector<absl::Status> results(2);
  ASSERT_TRUE(RunOnRankThreads(2, [&](int rank) {
                GlooCommunicatorOptions options;
                options.rank = rank;
                options.world_size = 2;
                options.store = &store;
                options.transport = Transport::kShm;
                options.host = absl::StrCat("host-", rank);
                results[rank] = GlooCommunicator::Create(options).status();
                return absl::OkStatus();
              }).ok());
  for (const absl::Status& status : results) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_NE(status.message().find("transport=shm"), std::string::npos) << status;
    EXPECT_NE(status.message().find("host-1"), std::string::npos) << status;
  }
}

TEST(GlooCommunicatorTest, SharedMemoryLeavesNoSegmentNorDescriptor) {
  InMemoryStore store;
  auto group = CreateGroup(3, &store, GlooCommunicatorOptions().segment_bytes, Transport::kShm);
  for (const auto& communicator : group) ASSERT_NE(communicator, nullptr);
  // Unlinked once every rank mapped it, with every descriptor closed: only the mappings remain.
  EXPECT_TRUE(SharedMemoryLeftovers().empty()) << absl::StrJoin(SharedMemoryLeftovers(), ", ");
  const absl::Status status = RunOnRankThreads(3, [&](int rank) {
    return CheckAllCollectives(*group[rank], 4097, ElementType::kFloat32, 5);
  });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_TRUE(SharedMemoryLeftovers().empty()) << absl::StrJoin(SharedMemoryLeftovers(), ", ");
}

TEST(GlooCommunicatorTest, ParseTransportNamesTheAcceptedValues) {
  EXPECT_EQ(*ParseTransport("auto"), Transport::kAuto);
  EXPECT_EQ(*ParseTransport("tcp"), Transport::kTcp);
  EXPECT_EQ(*ParseTransport("shm"), Transport::kShm);
  const absl::Status bad = ParseTransport("rdma").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("auto, tcp, shm"), std::string::npos) << bad;
}

TEST(GlooCommunicatorTest, SeparateRunsAndSegmentSizesGiveTheSameBits) {
  constexpr int kWorldSize = 3;
  constexpr size_t kPieceCount = 20000;
  std::vector<std::vector<std::vector<char>>> results;
  for (size_t segment_bytes :
       {size_t{256}, size_t{4096}, GlooCommunicatorOptions().segment_bytes}) {
    InMemoryStore store;
    auto group = CreateGroup(kWorldSize, &store, segment_bytes);
    for (const auto& communicator : group) ASSERT_NE(communicator, nullptr);
    std::vector<std::vector<char>> buffers(kWorldSize);
    const absl::Status status = RunOnRankThreads(kWorldSize, [&](int rank) {
      std::vector<char>& buffer = buffers[rank];
      buffer = MakeInput(ElementType::kFloat32, rank, kWorldSize * kPieceCount, 5);
      return group[rank]
          ->AllReduce(buffer.data(), kWorldSize * kPieceCount, ElementType::kFloat32,
                      ReduceOp::kSum)
          ->Wait(absl::Seconds(60));
    });
    ASSERT_TRUE(status.ok()) << status;
    results.push_back(buffers);
  }
  for (size_t run = 1; run < results.size(); ++run) {
    for (int rank = 0; rank < kWorldSize; ++rank) {
      EXPECT_TRUE(results[run][rank] == results[0][rank]) << "run " << run << ", rank " << rank;
    }
  }
  for (int rank = 1; rank < kWorldSize; ++rank) {
    EXPECT_TRUE(results[0][rank] == results[0][0]) << "ranks disagree: " << rank;
  }
}

TEST(GlooCommunicatorTest, EveryLaneCountGivesTheSameBits) {
  constexpr int kWorldSize = 3;
  constexpr size_t kPieceCount = 20000;
  std::vector<std::vector<std::vector<char>>> results;
  for (int lanes : {1, kDefaultLanes, 3}) {
    InMemoryStore store;
    GlooCommunicatorOptions tuning;
    tuning.segment_bytes = 4096;
    tuning.lanes = lanes;
    auto group = CreateGroup(kWorldSize, &store, tuning);
    for (const auto& communicator : group) ASSERT_NE(communicator, nullptr);
    std::vector<std::vector<char>> buffers(kWorldSize);
    const absl::Status status = RunOnRankThreads(kWorldSize, [&](int rank) {
      std::vector<char>& buffer = buffers[rank];
      buffer = MakeInput(ElementType::kFloat32, rank, kWorldSize * kPieceCount, 9);
      return group[rank]
          ->AllReduce(buffer.data(), kWorldSize * kPieceCount, ElementType::kFloat32,
                      ReduceOp::kSum)
          ->Wait(absl::Seconds(60));
    });
    ASSERT_TRUE(status.ok()) << "lanes " << lanes << ": " << status;
    results.push_back(buffers);
  }
  for (size_t run = 1; run < results.size(); ++run) {
    for (int rank = 0; rank < kWorldSize; ++rank) {
      EXPECT_TRUE(results[run][rank] == results[0][rank]) << "run " << run << ", rank " << rank;
    }
  }
}

TEST(GlooCommunicatorTest, CreateRejectsBadLaneAndThreadOptionsNamingTheField) {
  struct Case {
    const char* field;
    void (*set)(GlooCommunicatorOptions&);
  };
  const Case cases[] = {
      {"lanes", [](GlooCommunicatorOptions& o) { o.lanes = 0; }},
      {"lanes", [](GlooCommunicatorOptions& o) { o.lanes = kMaxLanes + 1; }},
      {"thread_cpus",
       [](GlooCommunicatorOptions& o) {
         o.thread_cpus = {0, -1};
       }},
      {"thread_cpus", [](GlooCommunicatorOptions& o) { o.thread_cpus = {CPU_SETSIZE}; }},
      {"thread_nice", [](GlooCommunicatorOptions& o) { o.thread_nice = 20; }},
      {"thread_nice", [](GlooCommunicatorOptions& o) { o.thread_nice = -21; }},
  };
  for (const Case& c : cases) {
    GlooCommunicatorOptions options;
    c.set(options);
    const auto communicator = GlooCommunicator::Create(options);
    ASSERT_FALSE(communicator.ok()) << c.field;
    EXPECT_EQ(communicator.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(communicator.status().message().find(c.field), absl::string_view::npos)
        << communicator.status();
  }
}

TEST(GlooCommunicatorTest, ThreadCpusPinTheCommunicationThread) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  int last_cpu = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) last_cpu = cpu;
  }
  if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "needs 2 CPUs to tell a pinned thread apart";
  const std::string pinned = std::to_string(last_cpu);
  ASSERT_TRUE(ThreadsWhoseStatusReads("Cpus_allowed_list", pinned).empty());
  InMemoryStore store;
  GlooCommunicatorOptions tuning;
  tuning.thread_cpus = {last_cpu};
  auto group = CreateGroup(1, &store, tuning);
  ASSERT_NE(group[0], nullptr);
  // Create returned after the thread pinned itself: exactly one thread is now on that CPU alone.
  EXPECT_EQ(ThreadsWhoseStatusReads("Cpus_allowed_list", pinned).size(), 1u);
  group.clear();
  EXPECT_TRUE(ThreadsWhoseStatusReads("Cpus_allowed_list", pinned).empty());
}

TEST(GlooCommunicatorTest, ThreadNiceSetsTheCommunicationThreadsNiceValue) {
  constexpr int kNice = 7;
  auto count = [&](const std::vector<int>& values) {
    return std::count(values.begin(), values.end(), kNice);
  };
  const std::vector<int> before = ThreadNiceValues();
  ASSERT_FALSE(before.empty());
  InMemoryStore store;
  GlooCommunicatorOptions tuning;
  tuning.thread_nice = kNice;
  auto group = CreateGroup(1, &store, tuning);
  ASSERT_NE(group[0], nullptr);
  EXPECT_EQ(count(ThreadNiceValues()), count(before) + 1);
}

TEST(GlooCommunicatorTest, ThreadCpuTimeGrowsWithTheCollectivesAndStaysWithinTheWall) {
  constexpr int kWorldSize = 2;
  InMemoryStore store;
  auto group = CreateGroup(kWorldSize, &store);
  for (const auto& communicator : group) ASSERT_NE(communicator, nullptr);
  std::vector<int64_t> before;
  for (const auto& communicator : group) before.push_back(communicator->stats().thread_cpu_ns);
  const absl::Time start = absl::Now();
  const size_t piece_count = size_t{1} << 20;
  const absl::Status status = RunOnRankThreads(kWorldSize, [&](int rank) -> absl::Status {
    std::vector<float> bucket(kWorldSize * piece_count, 1.0f);
    for (int repeat = 0; repeat < 4; ++repeat) {
      const absl::Status reduced = group[rank]
                                       ->ReduceScatterInPlace(bucket.data(), piece_count,
                                                              ElementType::kFloat32, ReduceOp::kSum)
                                       ->Wait();
      if (!reduced.ok()) return reduced;
    }
    return absl::OkStatus();
  });
  const int64_t wall_ns = absl::ToInt64Nanoseconds(absl::Now() - start);
  ASSERT_TRUE(status.ok()) << status;
  for (int rank = 0; rank < kWorldSize; ++rank) {
    const int64_t used = group[rank]->stats().thread_cpu_ns - before[rank];
    // Summing 4 MiB four times takes CPU time; one thread cannot use more than the wall.
    EXPECT_GT(used, 0) << "rank " << rank;
    EXPECT_LE(used, wall_ns) << "rank " << rank;
  }
}

TEST_P(GlooTransportTest, StatsCountTheRingTraffic) {
  const Transport transport = GetParam();
  InMemoryStore store;
  auto group = CreateGroup(4, &store, GlooCommunicatorOptions().segment_bytes, transport);
  for (const auto& communicator : group) ASSERT_NE(communicator, nullptr);
  const size_t piece_count = 1000;
  const absl::Status status = RunOnRankThreads(4, [&](int rank) {
    std::vector<float> bucket(4 * piece_count, 1.0f);
    return group[rank]
        ->ReduceScatterInPlace(bucket.data(), piece_count, ElementType::kFloat32, ReduceOp::kSum)
        ->Wait();
  });
  ASSERT_TRUE(status.ok()) << status;
  for (const auto& communicator : group) {
    // (W-1)/W of the bucket each way.
    EXPECT_EQ(communicator->stats().bytes_sent, 3 * piece_count * sizeof(float));
    EXPECT_EQ(communicator->stats().bytes_received, 3 * piece_count * sizeof(float));
    EXPECT_EQ(communicator->stats().operations_completed, 1);
  }
}

TEST(GlooCommunicatorTest, StatsCountTheStagingAndScratchItHolds) {
  constexpr int kWorldSize = 2;
  constexpr size_t kSegmentBytes = 1024;
  const int staging_segments = GlooCommunicatorOptions().staging_segments;
  InMemoryStore store;
  auto group = CreateGroup(kWorldSize, &store, kSegmentBytes);
  for (const auto& communicator : group) ASSERT_NE(communicator, nullptr);
  for (const auto& communicator : group) EXPECT_EQ(communicator->stats().scratch_bytes, 0);
  const size_t piece_count = 10000;  // many segments per piece
  const size_t piece_bytes = piece_count * sizeof(float);
  auto in_place = [&](int rank) {
    std::vector<float> bucket(kWorldSize * piece_count, 1.0f);
    return group[rank]
        ->ReduceScatterInPlace(bucket.data(), piece_count, ElementType::kFloat32, ReduceOp::kSum)
        ->Wait();
  };
  ASSERT_TRUE(RunOnRankThreads(kWorldSize, in_place).ok());
  std::vector<int64_t> staged;
  for (const auto& communicator : group) {
    // The staging ring of segments, not a piece-sized buffer.
    const int64_t bytes = communicator->stats().scratch_bytes;
    EXPECT_GE(bytes, staging_segments * int64_t{kSegmentBytes} / 2);
    EXPECT_LE(bytes, staging_segments * int64_t{kSegmentBytes});
    staged.push_back(bytes);
  }
  // Out of place, the reduce-scatter works in a scratch copy of the whole input.
  const absl::Status out_of_place = RunOnRankThreads(kWorldSize, [&](int rank) {
    std::vector<float> input(kWorldSize * piece_count, 1.0f);
    std::vector<float> output(piece_count);
    return group[rank]
        ->ReduceScatter(input.data(), output.data(), piece_count, ElementType::kFloat32,
                        ReduceOp::kSum)
        ->Wait();
  });
  ASSERT_TRUE(out_of_place.ok()) << out_of_place;
  for (int rank = 0; rank < kWorldSize; ++rank) {
    EXPECT_GE(group[rank]->stats().scratch_bytes,
              staged[rank] + static_cast<int64_t>(kWorldSize * piece_bytes));
  }
  // Kept, not grown, by a repeat.
  std::vector<int64_t> held;
  for (const auto& communicator : group) held.push_back(communicator->stats().scratch_bytes);
  ASSERT_TRUE(RunOnRankThreads(kWorldSize, in_place).ok());
  for (int rank = 0; rank < kWorldSize; ++rank) {
    EXPECT_EQ(group[rank]->stats().scratch_bytes, held[rank]);
  }
}

TEST(GlooCommunicatorTest, InvalidCallsFailWithoutEndingTheCommunicator) {
  InMemoryStore store;
  auto group = CreateGroup(1, &store);
  ASSERT_NE(group[0], nullptr);
  float value = 2.0f;
  EXPECT_EQ(group[0]->Broadcast(&value, 1, ElementType::kFloat32, /*root=*/1)->Wait().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(group[0]->AllReduce(nullptr, 3, ElementType::kFloat32, ReduceOp::kSum)->Wait().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      group[0]->AllReduce(&value, 1, static_cast<ElementType>(42), ReduceOp::kSum)->Wait().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(group[0]->AllReduce(&value, 1, ElementType::kFloat32, ReduceOp::kSum)->Wait().ok());
  EXPECT_EQ(value, 2.0f);
}

TEST(GlooCommunicatorTest, CreateFailsWhenAPeerNeverJoins) {
  InMemoryStore store;
  GlooCommunicatorOptions options;
  options.rank = 0;
  options.world_size = 2;
  options.store = &store;
  options.rendezvous_timeout = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  auto communicator = GlooCommunicator::Create(options);
  EXPECT_EQ(communicator.status().code(), absl::StatusCode::kDeadlineExceeded)
      << communicator.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(GlooCommunicatorTest, AbortDuringCreateEndsTheRendezvousWithCancelled) {
  InMemoryStore store;
  AbortSignal signal;
  GlooCommunicatorOptions options;
  options.rank = 0;
  options.world_size = 3;
  options.store = &store;
  options.rendezvous_timeout = absl::Seconds(60);
  options.abort_signal = &signal;
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> communicator =
      absl::UnknownError("not returned");
  absl::Time returned_at;
  absl::Notification returned;
  std::thread creator([&] {
    communicator = GlooCommunicator::Create(options);
    returned_at = absl::Now();
    returned.Notify();
  });
  // Its peers never show up, so it stays in the rendezvous.
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  const absl::Time aborted_at = absl::Now();
  signal.Abort();
  const bool ended = returned.WaitForNotificationWithTimeout(absl::Seconds(60));
  creator.join();
  ASSERT_TRUE(ended);
  EXPECT_EQ(communicator.status().code(), absl::StatusCode::kCancelled) << communicator.status();
  EXPECT_LT(returned_at - aborted_at, absl::Seconds(2));
}

TEST_P(GlooTransportTest, OperationTimesOutWhenAPeerNeverIssuesIt) {
  const Transport transport = GetParam();
  InMemoryStore store;
  auto group = CreateGroup(2, &store, GlooCommunicatorOptions().segment_bytes, transport);
  for (const auto& communicator : group) ASSERT_NE(communicator, nullptr);
  std::vector<float> bucket(64, 1.0f);
  CollectiveOptions options;
  options.timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::Status status =
      group[0]
          ->AllReduce(bucket.data(), bucket.size(), ElementType::kFloat32, ReduceOp::kSum, options)
          ->Wait(absl::Seconds(30));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // The communicator is over: later calls fail at once.
  EXPECT_EQ(group[0]->Barrier()->Wait(absl::Seconds(5)).code(), absl::StatusCode::kAborted);
  // The peer sees the closed connections instead of waiting for its own long timeout.
  absl::Status peer = group[1]->Barrier()->Wait(absl::Seconds(30));
  EXPECT_FALSE(peer.ok());
}

TEST_P(GlooTransportTest, AbortFromAnotherThreadUnblocksAPendingWait) {
  const Transport transport = GetParam();
  InMemoryStore store;
  auto group = CreateGroup(2, &store, GlooCommunicatorOptions().segment_bytes, transport);
  for (const auto& communicator : group) ASSERT_NE(communicator, nullptr);
  std::vector<float> bucket(1 << 16, 1.0f);
  CollectiveOptions options;
  options.timeout = absl::Minutes(10);
  // Rank 1 never issues the all-reduce, so rank 0's stays pending.
  std::unique_ptr<Work> work = group[0]->AllReduce(bucket.data(), bucket.size(),
                                                   ElementType::kFloat32, ReduceOp::kSum, options);
  std::unique_ptr<Work> queued = group[0]->Barrier(options);
  EXPECT_EQ(work->Wait(absl::Milliseconds(50)).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(work->Done());
  absl::Time aborted_at;
  std::thread aborter([&] {
    aborted_at = absl::Now();
    group[0]->Abort();
  });
  absl::Status status = work->Wait(absl::Seconds(30));
  const absl::Time finished_at = absl::Now();
  aborter.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_LT(finished_at - aborted_at, absl::Seconds(2));
  EXPECT_TRUE(work->Done());
  EXPECT_EQ(queued->Wait(absl::Seconds(5)).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(queued->RunTime(), absl::ZeroDuration());
  EXPECT_EQ(group[0]->Barrier()->Wait(absl::Seconds(5)).code(), absl::StatusCode::kAborted);
  group[0]->Abort();  // idempotent
}

TEST_P(GlooTransportTest, AnAbortedPeerFailsTheOthersButIsNotLost) {
  const Transport transport = GetParam();
  // Its process lives on (a run that failed or was told to abort): the others' communicators end,
  // and none of them lists it among the peers that died.
  InMemoryStore store;
  auto group = CreateGroup(3, &store, GlooCommunicatorOptions().segment_bytes, transport);
  for (const auto& communicator : group) ASSERT_NE(communicator, nullptr);
  group[1]->Abort();
  CollectiveOptions options;
  options.timeout = absl::Minutes(10);
  for (int rank : {0, 2}) {
    const absl::Time start = absl::Now();
    const absl::Status status = group[rank]->Barrier(options)->Wait(absl::Seconds(60));
    EXPECT_FALSE(status.ok()) << "rank " << rank;
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "rank " << rank << ": " << status;
    EXPECT_TRUE(group[rank]->LostPeers().empty()) << "rank " << rank << ": " << status;
  }
  EXPECT_TRUE(group[1]->LostPeers().empty());
}

TEST(GlooCommunicatorTest, RunTimeCountsFromStartOfExecutionNotFromIssue) {
  InMemoryStore store;
  auto group = CreateGroup(2, &store);
  for (const auto& communicator : group) ASSERT_NE(communicator, nullptr);
  std::vector<float> first0(1 << 10, 1.0f), first1(1 << 10, 2.0f);
  std::vector<float> second0(1 << 10, 1.0f), second1(1 << 10, 2.0f);
  // Rank 0 issues both operations at once; rank 1 issues them only once rank 0's first has been
  // seen pending for kPeerAbsent, so rank 0's first runs (waiting for its peer) at least that
  // long and its second sits queued meanwhile.
  constexpr absl::Duration kPeerAbsent = absl::Milliseconds(300);
  const absl::Time issued = absl::Now();
  std::unique_ptr<Work> first =
      group[0]->AllReduce(first0.data(), first0.size(), ElementType::kFloat32, ReduceOp::kSum);
  std::unique_ptr<Work> second =
      group[0]->AllReduce(second0.data(), second0.size(), ElementType::kFloat32, ReduceOp::kSum);
  EXPECT_FALSE(second->RunTime().has_value());
  EXPECT_EQ(first->Wait(kPeerAbsent).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(second->Done());
  const absl::Time peer_issued = absl::Now();
  std::unique_ptr<Work> peer_first =
      group[1]->AllReduce(first1.data(), first1.size(), ElementType::kFloat32, ReduceOp::kSum);
  std::unique_ptr<Work> peer_second =
      group[1]->AllReduce(second1.data(), second1.size(), ElementType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(first->Wait(absl::Seconds(30)).ok());
  ASSERT_TRUE(second->Wait(absl::Seconds(30)).ok());
  const absl::Time finished = absl::Now();
  ASSERT_TRUE(peer_first->Wait(absl::Seconds(30)).ok());
  ASSERT_TRUE(peer_second->Wait(absl::Seconds(30)).ok());
  ASSERT_TRUE(first->RunTime().has_value());
  ASSERT_TRUE(second->RunTime().has_value());
  // The first ran from about its issue until after the peer issued it; the bound leaves half of
  // kPeerAbsent for the communication thread to pick it up on a loaded machine.
  EXPECT_GE(*first->RunTime(), (peer_issued - issued) / 2);
  EXPECT_LE(*first->RunTime(), finished - issued);
  // The second could not start before the peer issued the first, so its queued time (at least
  // kPeerAbsent) is not in its run time.
  EXPECT_GT(*second->RunTime(), absl::ZeroDuration());
  EXPECT_LE(*second->RunTime(), finished - peer_issued);
  EXPECT_LE(*first->RunTime() + *second->RunTime(), finished - issued);
  // Work that finished without running reports zero.
  std::unique_ptr<Work> invalid =
      group[0]->AllReduce(nullptr, 4, ElementType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(invalid->Wait().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(invalid->RunTime(), absl::ZeroDuration());
}

TEST_P(GlooTransportTest, DestroyingWithAPendingOperationAbortsIt) {
  const Transport transport = GetParam();
  InMemoryStore store;
  auto group = CreateGroup(2, &store, GlooCommunicatorOptions().segment_bytes, transport);
  for (const auto& communicator : group) ASSERT_NE(communicator, nullptr);
  std::vector<float> bucket(128, 1.0f);
  std::unique_ptr<Work> work =
      group[0]->AllReduce(bucket.data(), bucket.size(), ElementType::kFloat32, ReduceOp::kSum);
  const absl::Time start = absl::Now();
  group[0].reset();
  EXPECT_EQ(work->Wait(absl::Seconds(5)).code(), absl::StatusCode::kAborted);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

INSTANTIATE_TEST_SUITE_P(Transports, GlooTransportTest,
                         ::testing::Values(Transport::kTcp, Transport::kShm),
                         [](const ::testing::TestParamInfo<Transport>& info) {
                           return TransportTestName(info.param);
                         });

}  // namespace
}  // namespace zeroshard::comm

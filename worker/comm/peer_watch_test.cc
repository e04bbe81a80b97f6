// PeerWatch with threads as ranks over an InMemoryStore and real loopback sockets: a peer that
// goes without a word is reported (once, naming it) and listed as lost, also when only Stop sees
// it; one that says farewell is not reported; one that says it is leaving is reported but not
// lost; Connect ends on abort and at its deadline; bad options and a bad rank are refused.
#include "worker/comm/peer_watch.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/comm/abort_signal.h"
#include "worker/comm/in_memory_store.h"

namespace zeroshard::comm {
namespace {

// What on_lost saw, for polling from the test thread.
struct LostLog {
  absl::Mutex mu;
  std::vector<absl::Status> reports ABSL_GUARDED_BY(mu);

  PeerWatch::PeerLost Callback() {
    return [this](absl::Status why) {
      absl::MutexLock lock(&mu);
      reports.push_back(std::move(why));
    };
  }
  // Waits (up to 10 s) until `count` reports came; returns them.
  std::vector<absl::Status> Await(size_t count) {
    absl::MutexLock lock(&mu);
    auto enough = [this, count]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return reports.size() >= count; };
    mu.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return reports;
  }
};

// Connects `world_size` watches, one thread per rank.
std::vector<std::unique_ptr<PeerWatch>> ConnectAll(InMemoryStore& store, int world_size) {
  std::vector<std::unique_ptr<PeerWatch>> watches(world_size);
  std::vector<absl::Status> statuses(world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      PeerWatchOptions options;
      options.rank = rank;
      options.world_size = world_size;
      options.store = &store;
      options.deadline = absl::Now() + absl::Seconds(30);
      absl::StatusOr<std::unique_ptr<PeerWatch>> watch = PeerWatch::Connect(options);
      statuses[rank] = watch.status();
      if (watch.ok()) watches[rank] = *std::move(watch);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int rank = 0; rank < world_size; ++rank) {
    EXPECT_TRUE(statuses[rank].ok()) << "rank " << rank << ": " << statuses[rank];
  }
  return watches;
}

// Polls `condition` until it holds or 10 s pass.
template <typename Condition>
bool Eventually(Condition condition) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return condition();
}

TEST(PeerWatchTest, PeerGoneWithoutAWordIsReportedOnceByEveryOtherRankAndListedAsLost) {
  InMemoryStore store;
  std::vector<std::unique_ptr<PeerWatch>> watches = ConnectAll(store, 4);
  ASSERT_EQ(watches.size(), 4u);
  std::vector<LostLog> logs(3);
  for (int rank = 0; rank < 3; ++rank) watches[rank]->Start(logs[rank].Callback());
  watches[3]->Start([](absl::Status) {});
  watches[3]->Stop(PeerWatch::Parting::kSilent);  // as when its process is killed
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<absl::Status> reports = logs[rank].Await(1);
    ASSERT_EQ(reports.size(), 1u) << "rank " << rank;
    EXPECT_TRUE(absl::IsUnavailable(reports[0])) << reports[0];
    EXPECT_NE(reports[0].message().find("lost peer rank 3"), std::string::npos) << reports[0];
    EXPECT_EQ(watches[rank]->lost_ranks(), std::vector<int>{3}) << "rank " << rank;
  }
  // A second peer going reports nothing more (on_lost runs once), but is listed too.
  watches[2]->Stop(PeerWatch::Parting::kSilent);
  ASSERT_TRUE(Eventually([&] { return watches[0]->ended().lost == 2; }));
  EXPECT_EQ(watches[0]->lost_ranks(), (std::vector<int>{3, 2}));
  absl::MutexLock lock(&logs[0].mu);
  EXPECT_EQ(logs[0].reports.size(), 1u);
}

TEST(PeerWatchTest, PeerThatSaysFarewellIsNotReported) {
  InMemoryStore store;
  std::vector<std::unique_ptr<PeerWatch>> watches = ConnectAll(store, 3);
  ASSERT_EQ(watches.size(), 3u);
  LostLog log;
  watches[0]->Start(log.Callback());
  watches[1]->Start(log.Callback());
  watches[2]->Start(log.Callback());
  watches[2]->Stop(PeerWatch::Parting::kFarewell);
  watches[1]->Stop(PeerWatch::Parting::kFarewell);
  // Rank 0 saw both leave, and reported neither.
  ASSERT_TRUE(Eventually([&] { return watches[0]->ended().with_farewell == 2; }));
  EXPECT_EQ(watches[0]->ended().lost, 0);
  EXPECT_EQ(watches[0]->ended().leaving, 0);
  EXPECT_TRUE(watches[0]->lost_ranks().empty());
  absl::MutexLock lock(&log.mu);
  EXPECT_TRUE(log.reports.empty()) << log.reports.front();
}

TEST(PeerWatchTest, PeerThatLeavesIsReportedAsLeftButNotListedAsLost) {
  // A rank whose group failed (or was aborted) lives on: its peers' groups must fail too, but
  // the coordinator must not take it for dead.
  InMemoryStore store;
  std::vector<std::unique_ptr<PeerWatch>> watches = ConnectAll(store, 3);
  ASSERT_EQ(watches.size(), 3u);
  std::vector<LostLog> logs(2);
  for (int rank = 0; rank < 2; ++rank) watches[rank]->Start(logs[rank].Callback());
  watches[2]->Start([](absl::Status) {});
  watches[2]->Stop(PeerWatch::Parting::kLeaving);
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<absl::Status> reports = logs[rank].Await(1);
    ASSERT_EQ(reports.size(), 1u) << "rank " << rank;
    EXPECT_TRUE(absl::IsUnavailable(reports[0])) << reports[0];
    EXPECT_NE(reports[0].message().find("peer rank 2 left the group"), std::string::npos)
        << reports[0];
    EXPECT_EQ(watches[rank]->ended().leaving, 1) << "rank " << rank;
    EXPECT_TRUE(watches[rank]->lost_ranks().empty()) << "rank " << rank;
  }
  // Rank 1 leaves too, after its group failed: rank 0 still lists no one as lost.
  watches[1]->Stop(PeerWatch::Parting::kLeaving);
  ASSERT_TRUE(Eventually([&] { return watches[0]->ended().leaving == 2; }));
  EXPECT_EQ(watches[0]->ended().lost, 0);
  EXPECT_TRUE(watches[0]->lost_ranks().empty());
}

TEST(PeerWatchTest, StopListsAPeerThatDiedBeforeTheWatchSawIt) {
  // Rank 0 watches nothing (its owner's group failed for another reason first, say): only Stop
  // looks at the connections, and still tells the dead peer from the one that is leaving.
  InMemoryStore store;
  std::vector<std::unique_ptr<PeerWatch>> watches = ConnectAll(store, 3);
  ASSERT_EQ(watches.size(), 3u);
  // On loopback a close has reached the peer's socket when it returns.
  watches[1]->Stop(PeerWatch::Parting::kSilent);
  watches[2]->Stop(PeerWatch::Parting::kLeaving);
  watches[0]->Stop(PeerWatch::Parting::kLeaving);
  EXPECT_EQ(watches[0]->lost_ranks(), std::vector<int>{1});
  EXPECT_EQ(watches[0]->ended().lost, 1);
  EXPECT_EQ(watches[0]->ended().leaving, 1);
}

TEST(PeerWatchTest, KilledProcessIsReported) {
  // A real process as the peer: a child that connects as rank 1 and is then killed -9.
  InMemoryStore store;
  PeerWatchOptions options;
  options.rank = 0;
  options.world_size = 2;
  options.store = &store;
  options.deadline = absl::Now() + absl::Seconds(30);
  // The child cannot share the InMemoryStore; it connects with the address rank 0 publishes,
  // read here after Connect has published it, so Connect runs on a thread.
  absl::StatusOr<std::unique_ptr<PeerWatch>> watch;
  std::thread connecting([&] { watch = PeerWatch::Connect(options); });
  absl::StatusOr<std::string> published = store.Get("gloo/watch/0", absl::Seconds(30));
  ASSERT_TRUE(published.ok()) << published.status();
  const std::vector<std::string> parts = absl::StrSplit(*published, ' ');
  ASSERT_EQ(parts.size(), 2u);
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(parts[1], &port));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) _exit(1);
    const uint32_t rank = 1;
    if (write(fd, &rank, sizeof(rank)) != sizeof(rank)) _exit(2);
    pause();
    _exit(0);
  }
  connecting.join();
  ASSERT_TRUE(watch.ok()) << watch.status();
  LostLog log;
  (*watch)->Start(log.Callback());
  kill(child, SIGKILL);
  int wait_status = 0;
  waitpid(child, &wait_status, 0);
  std::vector<absl::Status> reports = log.Await(1);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_NE(reports[0].message().find("lost peer rank 1"), std::string::npos) << reports[0];
  EXPECT_EQ((*watch)->lost_ranks(), std::vector<int>{1});
}

TEST(PeerWatchTest, ConnectEndsWithCancelledOnAbortAndDeadlineExceededAtTheDeadline) {
  InMemoryStore store;
  AbortSignal abort;
  PeerWatchOptions options;
  options.rank = 1;  // rank 0 never publishes
  options.world_size = 2;
  options.store = &store;
  options.abort_signal = &abort;
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    abort.Abort();
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<PeerWatch>> aborted = PeerWatch::Connect(options);
  aborter.join();
  EXPECT_TRUE(absl::IsCancelled(aborted.status())) << aborted.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  options.abort_signal = nullptr;
  options.store_prefix = "other";
  options.deadline = absl::Now() + absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<PeerWatch>> late = PeerWatch::Connect(options);
  EXPECT_TRUE(absl::IsDeadlineExceeded(late.status())) << late.status();
  EXPECT_NE(late.status().message().find("rank 0"), std::string::npos) << late.status();
}

TEST(PeerWatchTest, BadOptionsAndABadRankAreRefused) {
  InMemoryStore store;
  PeerWatchOptions options;
  options.store = &store;
  options.world_size = 1;
  EXPECT_TRUE(absl::IsInvalidArgument(PeerWatch::Connect(options).status()));
  options.world_size = 2;
  options.rank = 2;
  EXPECT_TRUE(absl::IsInvalidArgument(PeerWatch::Connect(options).status()));
  options.rank = 0;
  options.store = nullptr;
  EXPECT_TRUE(absl::IsInvalidArgument(PeerWatch::Connect(options).status()));

  // A peer that claims to be rank 0 (rank 0 expects higher ranks only).
  options.store = &store;
  options.deadline = absl::Now() + absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<PeerWatch>> watch;
  std::thread connecting([&] { watch = PeerWatch::Connect(options); });
  absl::StatusOr<std::string> published = store.Get("gloo/watch/0", absl::Seconds(30));
  ASSERT_TRUE(published.ok()) << published.status();
  const std::vector<std::string> parts = absl::StrSplit(*published, ' ');
  int port = 0;
  ASSERT_TRUE(parts.size() == 2 && absl::SimpleAtoi(parts[1], &port));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const uint32_t rank = 0;
  ASSERT_EQ(write(fd, &rank, sizeof(rank)), static_cast<ssize_t>(sizeof(rank)));
  connecting.join();
  close(fd);
  EXPECT_TRUE(absl::IsInvalidArgument(watch.status())) << watch.status();
  EXPECT_NE(watch.status().message().find("says it is rank 0"), std::string::npos)
      << watch.status();
}

}  // namespace
}  // namespace zeroshard::comm

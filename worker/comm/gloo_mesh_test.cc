// ConnectGlooMeshes over an InMemoryStore: the meshes connect; an abort or the deadline ends a
// rendezvous blocked on a peer that never publishes, or on one that publishes but never connects
// (a silent peer built from Gloo's own pairs); bad peer data is refused.
#include "worker/comm/gloo_mesh.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gloo/context.h"
#include "gloo/transport/context.h"
#include "gloo/transport/device.h"
#include "gloo/transport/tcp/device.h"
#include "gtest/gtest.h"
#include "worker/comm/abort_signal.h"
#include "worker/comm/in_memory_store.h"
#include "worker/comm/testing/rank_threads.h"

namespace zeroshard::comm {
namespace {

using ::zeroshard::comm::testing::RunOnRankThreads;

// How long a rendezvous may take to notice an abort or its deadline: far above the expected tens
// of milliseconds (a store poll slice, a few event-loop ticks), far below Gloo's own connect
// wait (five times its timeout).
constexpr absl::Duration kPromptly = absl::Seconds(2);

GlooMeshOptions MeshOptions(int rank, int world_size, Store* store) {
  GlooMeshOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.lanes = 2;
  options.store = store;
  options.deadline = absl::Now() + absl::Seconds(60);
  return options;
}

// Rank 1 of a two-rank mesh that publishes real addresses (pairs listening on 127.0.0.2) and
// never connects. Rank 0 on 127.0.0.1, the lower address, is the side of each pair that waits
// for the connection (tcp::Pair::connect), as a survivor waits for a peer that died after
// publishing. Thread contract: one thread.
class SilentPeer {
 public:
  SilentPeer(Store* store, int lanes) {
    std::string published;
    for (int lane = 0; lane < lanes; ++lane) {
      gloo::transport::tcp::attr attr;
      attr.hostname = "127.0.0.2";
      devices_.push_back(gloo::transport::tcp::CreateDevice(attr));
      contexts_.push_back(devices_.back()->createContext(/*rank=*/1, /*size=*/2));
      const std::vector<char> address = contexts_.back()->createPair(0)->address().bytes();
      published.append(address.data(), address.size());
    }
    EXPECT_TRUE(store->Set("gloo/addresses/1", published).ok());
  }

 private:
  // Before the contexts, so that their pairs go first.
  std::vector<std::shared_ptr<gloo::transport::Device>> devices_;
  std::vector<std::shared_ptr<gloo::transport::Context>> contexts_;
};

// Runs ConnectGlooMeshes on a thread of its own. Thread contract: the test's thread may read
// result() and returned_at() once returned() was notified.
class BackgroundMesh {
 public:
  explicit BackgroundMesh(GlooMeshOptions options)
      : thread_([this, options] {
          result_ = ConnectGlooMeshes(options);
          returned_at_ = absl::Now();
          returned_.Notify();
        }) {}
  ~BackgroundMesh() { thread_.join(); }

  absl::Notification& returned() { return returned_; }
  const absl::StatusOr<std::vector<std::shared_ptr<gloo::Context>>>& result() const {
    return result_;
  }
  absl::Time returned_at() const { return returned_at_; }

 private:
  absl::StatusOr<std::vector<std::shared_ptr<gloo::Context>>> result_ =
      absl::UnknownError("not returned");
  absl::Time returned_at_;
  absl::Notification returned_;
  std::thread thread_;
};

TEST(GlooMeshTest, EveryRankGetsOneConnectedContextPerLane) {
  constexpr int kWorldSize = 3;
  InMemoryStore store;
  std::vector<std::vector<std::shared_ptr<gloo::Context>>> meshes(kWorldSize);
  const absl::Status status = RunOnRankThreads(kWorldSize, [&](int rank) -> absl::Status {
    auto mesh = ConnectGlooMeshes(MeshOptions(rank, kWorldSize, &store));
    if (!mesh.ok()) return mesh.status();
    meshes[rank] = *std::move(mesh);
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  for (int rank = 0; rank < kWorldSize; ++rank) {
    ASSERT_EQ(meshes[rank].size(), 2u);
    for (const std::shared_ptr<gloo::Context>& lane : meshes[rank]) {
      EXPECT_EQ(lane->rank, rank);
      EXPECT_EQ(lane->size, kWorldSize);
      for (int peer = 0; peer < kWorldSize; ++peer) {
        EXPECT_EQ(lane->getPair(peer) != nullptr, peer != rank) << "rank " << rank << " " << peer;
      }
    }
  }
}

TEST(GlooMeshTest, AbortWhileWaitingForAPeerThatNeverPublishesReturnsCancelled) {
  InMemoryStore store;
  AbortSignal signal;
  GlooMeshOptions options = MeshOptions(0, 2, &store);
  options.abort_signal = &signal;
  BackgroundMesh mesh(options);
  // Blocked: its peer never publishes.
  ASSERT_TRUE(store.Get("gloo/addresses/0", absl::Seconds(30)).ok());
  EXPECT_FALSE(mesh.returned().WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  const absl::Time aborted_at = absl::Now();
  signal.Abort();
  ASSERT_TRUE(mesh.returned().WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(mesh.result().status().code(), absl::StatusCode::kCancelled) << mesh.result().status();
  EXPECT_LT(mesh.returned_at() - aborted_at, kPromptly);
}

TEST(GlooMeshTest, AbortWhileConnectingToAPeerThatNeverConnectsReturnsCancelled) {
  InMemoryStore store;
  SilentPeer peer(&store, /*lanes=*/2);
  AbortSignal signal;
  GlooMeshOptions options = MeshOptions(0, 2, &store);
  options.abort_signal = &signal;
  BackgroundMesh mesh(options);
  // The peer's addresses are there before rank 0 starts, so once rank 0 has published its own it
  // does nothing but connect: still blocked there after 300 ms.
  ASSERT_TRUE(store.Get("gloo/addresses/0", absl::Seconds(30)).ok());
  EXPECT_FALSE(mesh.returned().WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  const absl::Time aborted_at = absl::Now();
  signal.Abort();
  ASSERT_TRUE(mesh.returned().WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(mesh.result().status().code(), absl::StatusCode::kCancelled) << mesh.result().status();
  EXPECT_LT(mesh.returned_at() - aborted_at, kPromptly);
}

TEST(GlooMeshTest, DeadlineEndsAConnectThatNeverCompletes) {
  InMemoryStore store;
  SilentPeer peer(&store, /*lanes=*/2);
  GlooMeshOptions options = MeshOptions(0, 2, &store);
  constexpr absl::Duration kTimeout = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  options.deadline = start + kTimeout;
  auto mesh = ConnectGlooMeshes(options);
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kDeadlineExceeded) << mesh.status();
  EXPECT_GE(elapsed, kTimeout);
  EXPECT_LT(elapsed, kTimeout + kPromptly);
}

TEST(GlooMeshTest, AnAlreadyAbortedSignalEndsItBeforeAnythingIsPublished) {
  InMemoryStore store;
  AbortSignal signal;
  signal.Abort();
  GlooMeshOptions options = MeshOptions(0, 2, &store);
  options.abort_signal = &signal;
  EXPECT_EQ(ConnectGlooMeshes(options).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(store.Get("gloo/addresses/0", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(GlooMeshTest, APeerWhoseAddressesDoNotFitIsRefused) {
  InMemoryStore store;
  // Published for one lane when two are expected.
  SilentPeer peer(&store, /*lanes=*/1);
  auto mesh = ConnectGlooMeshes(MeshOptions(0, 2, &store));
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kFailedPrecondition) << mesh.status();
}

TEST(GlooMeshTest, BadOptionsAreRefused) {
  InMemoryStore store;
  EXPECT_EQ(ConnectGlooMeshes(MeshOptions(0, 1, &store)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConnectGlooMeshes(MeshOptions(2, 2, &store)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConnectGlooMeshes(MeshOptions(0, 2, nullptr)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zeroshard::comm

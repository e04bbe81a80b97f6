// ShmLink with threads as ranks over an InMemoryStore: messages of every size across chunk
// boundaries and ring wraps, sends that never block on a full ring, slot checks, interrupts and
// deadlines, the same-host proof (hosts, a foreign token, an abort during Connect), groups that
// span hosts (a link per host, sends pushed while the sender waits elsewhere), and hostile ground
// (issue 36): a rogue segment record, an outsider's truncate, a corrupt chunk header, nothing
// swept.
#include "worker/comm/shm_link.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/comm/abort_signal.h"
#include "worker/comm/in_memory_store.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/comm/testing/shared_memory_descriptors.h"

namespace zeroshard::comm {
namespace {

using ::zeroshard::comm::testing::RunOnRankThreads;

ShmLinkOptions Options(int rank, int world_size, Store* store) {
  ShmLinkOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.store = store;
  options.host = "this-host";
  // A tiny ring: most messages span several chunks and the ring wraps many times.
  options.slot_bytes = 64;
  options.slots = 2;
  options.deadline = absl::Now() + absl::Seconds(30);
  return options;
}

// Connects `world_size` links concurrently.
std::vector<std::unique_ptr<ShmLink>> ConnectGroup(int world_size, Store* store) {
  std::vector<std::unique_ptr<ShmLink>> links(world_size);
  const absl::Status status = RunOnRankThreads(world_size, [&](int rank) -> absl::Status {
    absl::StatusOr<std::unique_ptr<ShmLink>> link =
        ShmLink::Connect(Options(rank, world_size, store));
    if (!link.ok()) return link.status();
    links[rank] = *std::move(link);
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return links;
}

// Connects `hosts.size()` links concurrently, rank r announcing hosts[r], not requiring one host
// for the whole group; each rank's result.
std::vector<absl::StatusOr<std::unique_ptr<ShmLink>>> ConnectOnHosts(
    int world_size, Store* store, const std::vector<std::string>& hosts) {
  std::vector<absl::StatusOr<std::unique_ptr<ShmLink>>> links(world_size);
  RunOnRankThreads(world_size, [&](int rank) {
    ShmLinkOptions options = Options(rank, world_size, store);
    options.host = hosts[rank];
    options.whole_group = false;
    links[rank] = ShmLink::Connect(options);
    return absl::OkStatus();
  }).IgnoreError();
  return links;
}

std::vector<char> Pattern(size_t bytes, int seed) {
  std::vector<char> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>((i * 131 + seed * 7) & 0xff);
  return data;
}

// Hands rank 0's published segment record to `on_segment` before the reader sees it (what the
// reader then sees is what `on_segment` returns): the moment the leader holds its segment and
// its members have not mapped it yet, the setup window.
class SegmentHookStore : public Store {
 public:
  using Hook = std::function<std::string(const std::string& published)>;
  SegmentHookStore(Store* inner, Hook on_segment)
      : inner_(inner), on_segment_(std::move(on_segment)) {}
  absl::Status Set(absl::string_view key, absl::string_view value) override {
    return inner_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override {
    absl::StatusOr<std::string> value = inner_->Get(key, timeout);
    if (!value.ok() || key != "gloo/shm/segment/0") return value;
    return on_segment_(*value);
  }
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override {
    return inner_->Add(key, delta);
  }
  absl::StatusOr<bool> Delete(absl::string_view key) override { return inner_->Delete(key); }

 private:
  Store* const inner_;
  const Hook on_segment_;
};

// Every way an outsider of this uid has to open the leader's segment during the setup window:
// the /dev/shm entry of the name it published (the links before the fix), and each of this
// process's descriptors of a shared-memory file, through /proc (a process of the same uid
// opens /proc/<leader pid>/fd/<n> the same way). Descriptors opened read-write.
std::vector<int> OpenSegmentAsAnOutsider(const std::string& published) {
  std::vector<int> opened;
  const std::vector<std::string> parts = absl::StrSplit(published, ' ');
  if (!parts[0].empty() && parts[0][0] == '/') {
    const int fd = shm_open(parts[0].c_str(), O_RDWR, 0);
    if (fd >= 0) opened.push_back(fd);
  }
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (error || target.rfind("/memfd:zeroshard", 0) != 0) continue;
    const int fd = open(entry.path().c_str(), O_RDWR | O_CLOEXEC);
    if (fd >= 0) opened.push_back(fd);
  }
  return opened;
}

TEST(ShmLinkTest, MessagesOfEverySizeArriveWholeInOrderAcrossChunks) {
  InMemoryStore store;
  auto links = ConnectGroup(2, &store);
  ASSERT_NE(links[0], nullptr);
  ASSERT_NE(links[1], nullptr);
  EXPECT_TRUE(testing::SharedMemoryDescriptors().empty())
      << "the leader closes its descriptor once all mapped";
  const std::vector<size_t> sizes = {0, 1, 7, 63, 64, 65, 127, 128, 129, 1000, 4099};
  const absl::Status status = RunOnRankThreads(2, [&](int rank) -> absl::Status {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    if (rank == 0) {
      std::vector<std::vector<char>> messages;
      for (size_t i = 0; i < sizes.size(); ++i) messages.push_back(Pattern(sizes[i], i));
      for (size_t i = 0; i < sizes.size(); ++i) {
        links[0]->Send(1, /*slot=*/100 + i, messages[i].data(), messages[i].size());
      }
      return links[0]->WaitSends(deadline);
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<char> received;
      size_t expected_offset = 0;
      bool aligned = true;
      absl::Status got = links[1]->Receive(
          0, 100 + i, nullptr, sizes[i], deadline,
          [&](const char* data, size_t offset, size_t bytes) {
            aligned &= offset == expected_offset && (offset + bytes == sizes[i] || bytes % 8 == 0);
            expected_offset += bytes;
            received.insert(received.end(), data, data + bytes);
          });
      if (!got.ok()) return got;
      if (!aligned) return absl::InternalError(absl::StrCat("message ", i, ": parts out of line"));
      if (received != Pattern(sizes[i], i)) {
        return absl::InternalError(absl::StrCat("message ", i, " (", sizes[i], " bytes) differs"));
      }
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(ShmLinkTest, EveryRankSendsBeforeReceivingWithoutDeadlock) {
  // As the rings do: every rank posts far more than a ring holds to its neighbour, then receives.
  constexpr int kWorldSize = 3;
  InMemoryStore store;
  auto links = ConnectGroup(kWorldSize, &store);
  for (const auto& link : links) ASSERT_NE(link, nullptr);
  const absl::Status status = RunOnRankThreads(kWorldSize, [&](int rank) -> absl::Status {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    const int next = (rank + 1) % kWorldSize;
    const int previous = (rank + kWorldSize - 1) % kWorldSize;
    std::vector<std::vector<char>> outgoing;
    for (int i = 0; i < 16; ++i) outgoing.push_back(Pattern(1000, rank * 100 + i));
    for (int i = 0; i < 16; ++i) links[rank]->Send(next, i, outgoing[i].data(), 1000);
    for (int i = 0; i < 16; ++i) {
      std::vector<char> received(1000);
      absl::Status got = links[rank]->Receive(previous, i, nullptr, 1000, deadline,
                                              [&](const char* data, size_t offset, size_t bytes) {
                                                std::memcpy(received.data() + offset, data, bytes);
                                              });
      if (!got.ok()) return got;
      if (received != Pattern(1000, previous * 100 + i)) {
        return absl::InternalError(absl::StrCat("message ", i, " from ", previous, " differs"));
      }
    }
    return links[rank]->WaitSends(deadline);
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(ShmLinkTest, AnUnexpectedSlotIsAnInternalErrorNamingBoth) {
  InMemoryStore store;
  auto links = ConnectGroup(2, &store);
  ASSERT_NE(links[1], nullptr);
  const char byte = 1;
  links[0]->Send(1, /*slot=*/5, &byte, 1);
  const absl::Status got =
      links[1]->Receive(0, /*slot=*/4, nullptr, 1, absl::Now() + absl::Seconds(30),
                        [](const char*, size_t, size_t) {});
  EXPECT_EQ(got.code(), absl::StatusCode::kInternal) << got;
  EXPECT_NE(got.message().find("expected slot 4"), std::string::npos) << got;
  EXPECT_NE(got.message().find("found slot 5"), std::string::npos) << got;
}

TEST(ShmLinkTest, InterruptEndsABlockedReceiveWithItsStatusWithinTwoSeconds) {
  InMemoryStore store;
  auto links = ConnectGroup(2, &store);
  ASSERT_NE(links[1], nullptr);
  absl::Notification receiving;
  absl::Status got;
  absl::Time returned_at;
  std::thread receiver([&] {
    receiving.Notify();
    // Nothing is ever sent: only the interrupt can end this before its 10 minutes.
    got = links[1]->Receive(0, 1, nullptr, 64, absl::Now() + absl::Minutes(10),
                            [](const char*, size_t, size_t) {});
    returned_at = absl::Now();
  });
  receiving.WaitForNotification();
  const absl::Time interrupted_at = absl::Now();
  links[1]->Interrupt(absl::UnavailableError("lost peer rank 0"));
  receiver.join();
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable) << got;
  EXPECT_NE(got.message().find("lost peer rank 0"), std::string::npos) << got;
  EXPECT_LT(returned_at - interrupted_at, absl::Seconds(2));
  // Sticky: later waits end at once with the first cause.
  links[1]->Interrupt(absl::AbortedError("second"));
  EXPECT_EQ(links[1]->WaitSends(absl::Now() + absl::Minutes(10)).code(),
            absl::StatusCode::kUnavailable);
}

TEST(ShmLinkTest, AReceiveNobodySendsEndsAtItsDeadline) {
  InMemoryStore store;
  auto links = ConnectGroup(2, &store);
  ASSERT_NE(links[0], nullptr);
  const absl::Time start = absl::Now();
  const absl::Status got = links[0]->Receive(1, 1, nullptr, 8, start + absl::Milliseconds(200),
                                             [](const char*, size_t, size_t) {});
  EXPECT_EQ(got.code(), absl::StatusCode::kDeadlineExceeded) << got;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(ShmLinkTest, RanksOnDifferentHostsDoNotTry) {
  InMemoryStore store;
  std::vector<absl::Status> results(2);
  ASSERT_TRUE(RunOnRankThreads(2, [&](int rank) {
                ShmLinkOptions options = Options(rank, 2, &store);
                options.host = rank == 0 ? "here" : "there";
                results[rank] = ShmLink::Connect(options).status();
                return absl::OkStatus();
              }).ok());
  for (const absl::Status& status : results) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  }
  // Nothing was created.
  EXPECT_FALSE(store.Get("gloo/shm/segment/0", absl::ZeroDuration()).ok());
}

// Presents rank 0's segment with another token, as a rank whose /dev/shm holds a different segment
// under that name would see it.
class ForeignTokenStore : public Store {
 public:
  explicit ForeignTokenStore(Store* inner) : inner_(inner) {}
  absl::Status Set(absl::string_view key, absl::string_view value) override {
    return inner_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override {
    absl::StatusOr<std::string> value = inner_->Get(key, timeout);
    if (!value.ok() || key != "gloo/shm/segment/0") return value;
    // The record ends with the token.
    const size_t token_at = value->rfind(' ') + 1;
    return absl::StrCat(value->substr(0, token_at), std::string(value->size() - token_at, '0'));
  }
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override {
    return inner_->Add(key, delta);
  }
  absl::StatusOr<bool> Delete(absl::string_view key) override { return inner_->Delete(key); }

 private:
  Store* const inner_;
};

TEST(ShmLinkTest, ASegmentWithAnotherTokenFailsTheProofOnEveryRank) {
  InMemoryStore store;
  ForeignTokenStore foreign(&store);
  std::vector<absl::Status> results(2);
  ASSERT_TRUE(RunOnRankThreads(2, [&](int rank) {
                results[rank] =
                    ShmLink::Connect(
                        Options(rank, 2, rank == 0 ? static_cast<Store*>(&store) : &foreign))
                        .status();
                return absl::OkStatus();
              }).ok());
  for (const absl::Status& status : results) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_NE(status.message().find("token"), std::string::npos) << status;
  }
  EXPECT_TRUE(testing::SharedMemoryDescriptors().empty());
}

TEST(ShmLinkTest, AnAbortEndsConnectWithCancelled) {
  InMemoryStore store;
  AbortSignal signal;
  ShmLinkOptions options = Options(0, 2, &store);
  options.deadline = absl::Now() + absl::Minutes(10);
  options.abort_signal = &signal;
  absl::Status status;
  absl::Time returned_at;
  absl::Notification connecting;
  std::thread connector([&] {
    connecting.Notify();
    // Rank 1 never comes.
    status = ShmLink::Connect(options).status();
    returned_at = absl::Now();
  });
  connecting.WaitForNotification();
  const absl::Time aborted_at = absl::Now();
  signal.Abort();
  connector.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_LT(returned_at - aborted_at, absl::Seconds(2));
}

// Ranks 0, 1 on host "a" and 2, 3 on "b": each host's ranks share a link, and nobody reaches the
// other host's.
TEST(ShmLinkTest, RanksOfTwoHostsShareMemoryOnlyWithinTheirHost) {
  constexpr int kWorldSize = 4;
  InMemoryStore store;
  std::vector<absl::StatusOr<std::unique_ptr<ShmLink>>> links =
      ConnectOnHosts(kWorldSize, &store, {"a", "a", "b", "b"});
  for (int rank = 0; rank < kWorldSize; ++rank) {
    ASSERT_TRUE(links[rank].ok()) << links[rank].status();
    EXPECT_FALSE((*links[rank])->reaches_all());
    for (int peer = 0; peer < kWorldSize; ++peer) {
      EXPECT_EQ((*links[rank])->reaches(peer), peer != rank && (peer < 2) == (rank < 2))
          << "rank " << rank << ", peer " << peer;
    }
  }
  // Two segments, one per host's leader, whose descriptors both leaders closed once mapped.
  for (const char* key : {"gloo/shm/segment/0", "gloo/shm/segment/2"}) {
    EXPECT_TRUE(store.Get(key, absl::ZeroDuration()).ok()) << key;
  }
  EXPECT_FALSE(store.Get("gloo/shm/segment/1", absl::ZeroDuration()).ok());
  EXPECT_TRUE(testing::SharedMemoryDescriptors().empty());
}

// In a group spanning hosts the sender may be blocked on TCP while its shared-memory sends wait
// for room: the link's own thread must push them. Here the sender queues far more than the ring
// holds and then waits for nothing of the link's until the receiver has it all.
TEST(ShmLinkTest, ALinkSpanningHostsPushesSendsWhileTheSenderWaitsElsewhere) {
  constexpr int kWorldSize = 3;
  constexpr size_t kBytes = 100000;  // the ring holds 2 x 64 bytes
  InMemoryStore store;
  std::vector<absl::StatusOr<std::unique_ptr<ShmLink>>> connected =
      ConnectOnHosts(kWorldSize, &store, {"a", "a", "b"});
  // Rank 2 is alone on its host.
  EXPECT_EQ(connected[2].status().code(), absl::StatusCode::kFailedPrecondition)
      << connected[2].status();
  ASSERT_TRUE(connected[0].ok()) << connected[0].status();
  ASSERT_TRUE(connected[1].ok()) << connected[1].status();
  const std::vector<ShmLink*> links = {connected[0]->get(), connected[1]->get()};
  const std::vector<char> message = Pattern(kBytes, 5);
  absl::Notification received;
  const absl::Status status = RunOnRankThreads(2, [&](int rank) -> absl::Status {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    if (rank == 0) {
      links[0]->Send(1, /*slot=*/9, message.data(), message.size());
      // Stands for a wait on another link: nothing here pushes.
      if (!received.WaitForNotificationWithTimeout(absl::Seconds(30))) {
        return absl::DeadlineExceededError("the message never arrived");
      }
      return links[0]->WaitSends(deadline);
    }
    std::vector<char> got(kBytes);
    absl::Status done = links[1]->Receive(0, 9, nullptr, kBytes, deadline,
                                          [&](const char* data, size_t offset, size_t bytes) {
                                            std::memcpy(got.data() + offset, data, bytes);
                                          });
    received.Notify();
    if (!done.ok()) return done;
    return got == message ? absl::OkStatus() : absl::InternalError("the message differs");
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(ShmLinkTest, ARankAloneOnItsHostIsAFailedPrecondition) {
  InMemoryStore store;
  ShmLinkOptions options = Options(0, 2, &store);
  options.whole_group = false;
  ASSERT_TRUE(store.Set("gloo/shm/host/1", "elsewhere").ok());
  const absl::Status status = ShmLink::Connect(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("no other rank is on host 'this-host'"), std::string::npos)
      << status;
}

// Row 5 of issue 36. A rank that claims this host (here rank 0, the host's leader) publishes the
// name of somebody else's /dev/shm object, in the record's old form ("<name> <token>") and in
// its new one ("<pid> <fd> <token>", naming a descriptor of that object). The proof fails, and
// the object is still there.
// Fails before the fix: rank 1 opened the published name, found the wrong size and unlinked it.
TEST(ShmLinkTest, ARogueSegmentNamePublishedForThisHostIsNeverUnlinked) {
  const std::string victim = absl::StrCat("/zeroshard-victim-", getpid());
  const int victim_fd = shm_open(victim.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(victim_fd, 0) << victim;
  ASSERT_EQ(ftruncate(victim_fd, 4096), 0);
  const std::string token(32, 'a');
  for (const std::string& published :
       {absl::StrCat(victim, " ", token), absl::StrCat(getpid(), " ", victim_fd, " ", token)}) {
    InMemoryStore store;
    ASSERT_TRUE(store.Set("gloo/shm/host/0", "this-host").ok());
    ASSERT_TRUE(store.Set("gloo/shm/segment/0", published).ok());
    ASSERT_TRUE(store.Set("gloo/shm/mapped/0", "ok").ok());
    const absl::Status status = ShmLink::Connect(Options(1, 2, &store)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_TRUE(std::filesystem::exists(absl::StrCat("/dev/shm", victim))) << published;
  }
  close(victim_fd);
  shm_unlink(victim.c_str());
}

// A leader whose descriptor this rank cannot reach (stood for by a pid that no longer exists: in
// another pid namespace /proc shows none of the leader's) fails the proof with the reason, so
// `auto` falls back to TCP.
TEST(ShmLinkTest, ALeaderOutOfReachFailsTheProofSayingWhere) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  int wait_status = 0;
  ASSERT_EQ(waitpid(child, &wait_status, 0), child);
  InMemoryStore store;
  ASSERT_TRUE(store.Set("gloo/shm/host/0", "this-host").ok());
  ASSERT_TRUE(
      store.Set("gloo/shm/segment/0", absl::StrCat(child, " 3 ", std::string(32, 'a'))).ok());
  ASSERT_TRUE(store.Set("gloo/shm/mapped/0", "ok").ok());
  const absl::Status status = ShmLink::Connect(Options(1, 2, &store)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find(absl::StrCat("cannot reach rank 0's segment at /proc/", child)),
            std::string::npos)
      << status;
}

// Row 6 of issue 36. During the setup window an outsider of the same uid opens the segment by
// every way it has and truncates it: the truncate is refused, and the group connects and carries
// a message (on a truncated segment, the first touch of a page past the end is SIGBUS).
// Fails before the fix: the /dev/shm segment was truncated to nothing, so the proof failed (and
// a truncate after the proof killed both ranks with SIGBUS).
TEST(ShmLinkTest, AnOutsidersTruncateDuringSetupIsRefusedAndKillsNobody) {
  InMemoryStore store;
  int opened = 0;
  std::vector<int> truncate_errors;
  SegmentHookStore outsider(&store, [&](const std::string& published) {
    for (const int fd : OpenSegmentAsAnOutsider(published)) {
      ++opened;
      truncate_errors.push_back(ftruncate(fd, 0) == 0 ? 0 : errno);
      close(fd);
    }
    return published;
  });
  std::vector<std::unique_ptr<ShmLink>> links(2);
  const absl::Status connected = RunOnRankThreads(2, [&](int rank) -> absl::Status {
    ShmLinkOptions options = Options(rank, 2, rank == 0 ? static_cast<Store*>(&store) : &outsider);
    absl::StatusOr<std::unique_ptr<ShmLink>> link = ShmLink::Connect(options);
    if (!link.ok()) return link.status();
    links[rank] = *std::move(link);
    return absl::OkStatus();
  });
  EXPECT_GT(opened, 0) << "the outsider found no way to the segment: the test proves nothing";
  for (const int error : truncate_errors) EXPECT_EQ(error, EPERM) << std::strerror(error);
  ASSERT_TRUE(connected.ok()) << connected;
  const std::vector<char> message = Pattern(1000, 3);
  std::vector<char> received(message.size());
  const absl::Status exchanged = RunOnRankThreads(2, [&](int rank) -> absl::Status {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    if (rank == 0) {
      links[0]->Send(1, /*slot=*/1, message.data(), message.size());
      return links[0]->WaitSends(deadline);
    }
    return links[1]->Receive(0, 1, nullptr, message.size(), deadline,
                             [&](const char* data, size_t offset, size_t bytes) {
                               std::memcpy(received.data() + offset, data, bytes);
                             });
  });
  EXPECT_TRUE(exchanged.ok()) << exchanged;
  EXPECT_EQ(received, message);
}

// Row 7 of issue 36. A peer (it maps the segment legitimately) writes a chunk header whose size
// is larger than the ring's chunks and equal to what the receiver still expects: an error naming
// the peer, and the consumer is never handed more than one chunk.
// Fails before the fix: the size was checked only against the bytes left, so the consumer got
// 100000 bytes starting at a 64-byte chunk (a read far past the chunk and the segment).
TEST(ShmLinkTest, AChunkSizeLargerThanTheChunkIsAnErrorNamingThePeer) {
  constexpr uint64_t kSlot = 0x5eed5eed5eed5eedULL;
  constexpr size_t kBytes = 100000;
  InMemoryStore store;
  void* peer_view = MAP_FAILED;
  size_t peer_view_bytes = 0;
  SegmentHookStore peer(&store, [&](const std::string& published) {
    for (const int fd : OpenSegmentAsAnOutsider(published)) {
      struct stat status;
      if (peer_view == MAP_FAILED && fstat(fd, &status) == 0 && status.st_size > 0) {
        peer_view_bytes = static_cast<size_t>(status.st_size);
        peer_view = mmap(nullptr, peer_view_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      }
      close(fd);
    }
    return published;
  });
  std::vector<std::unique_ptr<ShmLink>> links(2);
  ASSERT_TRUE(RunOnRankThreads(2, [&](int rank) -> absl::Status {
                ShmLinkOptions options =
                    Options(rank, 2, rank == 0 ? static_cast<Store*>(&store) : &peer);
                absl::StatusOr<std::unique_ptr<ShmLink>> link = ShmLink::Connect(options);
                if (!link.ok()) return link.status();
                links[rank] = *std::move(link);
                return absl::OkStatus();
              }).ok());
  ASSERT_NE(peer_view, MAP_FAILED);
  const std::vector<char> message = Pattern(kBytes, 1);
  links[0]->Send(1, kSlot, message.data(), message.size());  // two 64-byte chunks go in now
  // The first chunk's header: {kSlot, 64}.
  uint64_t* words = static_cast<uint64_t*>(peer_view);
  bool corrupted = false;
  for (size_t i = 0; i + 1 < peer_view_bytes / sizeof(uint64_t); ++i) {
    if (words[i] == kSlot && words[i + 1] == 64) {
      words[i + 1] = kBytes;
      corrupted = true;
      break;
    }
  }
  ASSERT_TRUE(corrupted) << "no chunk header of the message in the segment";
  size_t largest_part = 0;
  const absl::Status got = links[1]->Receive(
      0, kSlot, nullptr, kBytes, absl::Now() + absl::Seconds(30),
      // Records the part's size only: reading it would be the out-of-bounds read.
      [&](const char*, size_t, size_t bytes) { largest_part = std::max(largest_part, bytes); });
  EXPECT_EQ(got.code(), absl::StatusCode::kInternal) << got;
  EXPECT_NE(got.message().find("rank 0"), std::string::npos) << got;
  EXPECT_NE(got.message().find("100000"), std::string::npos) << got;
  EXPECT_LE(largest_part, 64u);
  links[0]->Interrupt(absl::AbortedError("test over"));
  munmap(peer_view, peer_view_bytes);
}

// Row 8 of issue 36. A /dev/shm object of the old naming whose pid is dead in this namespace (in
// another pid namespace sharing /dev/shm, that pid may be a live leader) is left alone: the link
// names nothing in /dev/shm, so there is nothing of its own to sweep.
// Fails before the fix: the next leader on the host unlinked it once it was `abandoned_after`
// old (a minute by default; the sweep's own test set zero).
TEST(ShmLinkTest, ASegmentOfAPidDeadHereIsNotSwept) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  int wait_status = 0;
  ASSERT_EQ(waitpid(child, &wait_status, 0), child);
  const std::string other_namespace = absl::StrCat("/zeroshard-", child, "-0badf00d");
  const int fd = shm_open(other_namespace.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0) << other_namespace;
  close(fd);
  InMemoryStore store;
  auto links = ConnectGroup(2, &store);
  ASSERT_NE(links[0], nullptr);
  EXPECT_TRUE(std::filesystem::exists(absl::StrCat("/dev/shm", other_namespace)));
  shm_unlink(other_namespace.c_str());
}

TEST(ShmLinkTest, BadSizesAreInvalidArguments) {
  InMemoryStore store;
  ShmLinkOptions options = Options(0, 2, &store);
  options.slot_bytes = 100;
  EXPECT_EQ(ShmLink::Connect(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = Options(0, 2, &store);
  options.slots = 0;
  EXPECT_EQ(ShmLink::Connect(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = Options(0, 1, &store);
  EXPECT_EQ(ShmLink::Connect(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zeroshard::comm

// ShmLink: the shared-memory segment (layout, creation, the same-host proof, unlinking, removing
// what a killed leader left) and the single-producer single-consumer chunk rings over it, with
// futex bells for waiting and, for links that are not the whole group, a pusher thread.
#include "worker/comm/shm_link.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace zeroshard::comm {

constexpr uint64_t kMagic = 0x7a73686d6c696e31;  // "zshmlin1"
constexpr size_t kTokenBytes = 16;
constexpr size_t kAlign = 64;
// Pairs that are not ring neighbours only carry the barrier's one-byte messages.
constexpr uint64_t kSmallChunks = 2;
constexpr size_t kSmallChunkBytes = 64;
// Looks before sleeping. Few: where ranks share the cores with their training threads (2 ranks
// on 2 cores), spinning takes the time backward needs. A thousand pauses (about 30 us a wait)
// cost zero2 on `medium` 7-8% of its iteration and ddp 4% against ten, in paired rounds of
// tests/bench/reduce_scatter_study.py (docs/performance/collectives.md); a 256 KiB chunk's copy
// (about 25 us) dwarfs the futex wake-up that replaces the spin.
constexpr int kSpins = 10;
constexpr absl::Duration kLongestSleep = absl::Milliseconds(100);
constexpr absl::Duration kStoreSlice = absl::Milliseconds(100);
// Segment names: kNamePrefix, the creator's pid, "-", eight hex digits of the token.
constexpr absl::string_view kNamePrefix = "zeroshard-";

struct alignas(kAlign) SegmentHeader {
  uint64_t magic;
  uint64_t total_bytes;
  uint32_t world_size;
  uint32_t slots;
  uint64_t slot_bytes;
  char token[2 * kTokenBytes];
};

// Rung by fetch_add on `sequence`; an owner thread sleeps on `sequence` with FUTEX_WAIT after
// counting itself in `sleeping` (the communication thread and the pusher may both sleep), so a
// ringer wakes them only when needed.
struct alignas(kAlign) ShmLink::Bell {
  std::atomic<uint32_t> sequence;
  std::atomic<uint32_t> sleeping;
};

// head: chunks published by the sender; tail: chunks freed by the receiver (head - tail <= count).
// Each on its own cache line: one is written only by the sender, the other only by the receiver.
struct alignas(kAlign) ShmLink::RingCounters {
  std::atomic<uint64_t> head;
  char head_line[kAlign - sizeof(std::atomic<uint64_t>)];
  std::atomic<uint64_t> tail;
  char tail_line[kAlign - sizeof(std::atomic<uint64_t>)];
};

// Written by the sender before it publishes the chunk (head's release store orders them).
struct ShmLink::ChunkHeader {
  uint64_t slot;
  uint64_t bytes;
};

namespace {

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

size_t AlignUp(size_t value) { return (value + kAlign - 1) / kAlign * kAlign; }

// Where everything lies in the segment; a pure function of the members and the options, so every
// member computes the same offsets. Pairs are indexed by the members' local indices.
struct Layout {
  int members = 0;
  size_t bells = 0;
  std::vector<size_t> rings;  // [sender * members + receiver]
  std::vector<uint64_t> chunk_counts;
  std::vector<size_t> chunk_bytes;
  size_t total = 0;
};

bool Neighbours(int sender, int receiver, int world_size) {
  return (sender + 1) % world_size == receiver;
}

Layout MakeLayout(const std::vector<int>& members, int world_size, size_t slot_bytes, int slots) {
  const int count = static_cast<int>(members.size());
  Layout layout;
  layout.members = count;
  size_t at = AlignUp(sizeof(SegmentHeader));
  layout.bells = at;
  at += AlignUp(count * sizeof(ShmLink::Bell));
  const size_t pairs = static_cast<size_t>(count) * count;
  layout.rings.assign(pairs, 0);
  layout.chunk_counts.assign(pairs, 0);
  layout.chunk_bytes.assign(pairs, 0);
  for (int sender = 0; sender < count; ++sender) {
    for (int receiver = 0; receiver < count; ++receiver) {
      if (sender == receiver) continue;
      const size_t pair = static_cast<size_t>(sender) * count + receiver;
      const bool big = Neighbours(members[sender], members[receiver], world_size);
      layout.chunk_counts[pair] = big ? static_cast<uint64_t>(slots) : kSmallChunks;
      layout.chunk_bytes[pair] = big ? slot_bytes : kSmallChunkBytes;
      layout.rings[pair] = at;
      at += sizeof(ShmLink::RingCounters);
      at += AlignUp(layout.chunk_counts[pair] * sizeof(ShmLink::ChunkHeader));
      at += layout.chunk_counts[pair] * layout.chunk_bytes[pair];
    }
  }
  layout.total = at;
  return layout;
}

std::string ErrnoText(int error) { return std::strerror(error); }

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  const timespec relative = absl::ToTimespec(timeout);
  // Shared (not FUTEX_PRIVATE_FLAG): the ringer is another process. EAGAIN (the word moved on),
  // EINTR and ETIMEDOUT all just mean "look again".
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &relative, nullptr,
          0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

std::string Key(const ShmLinkOptions& options, absl::string_view what) {
  return absl::StrCat(options.store_prefix, "/shm/", what);
}

// Store::Get in short slices, so an abort ends the wait promptly.
absl::StatusOr<std::string> GetBy(const ShmLinkOptions& options, const std::string& key) {
  while (true) {
    if (options.abort_signal != nullptr && options.abort_signal->aborted()) {
      return absl::CancelledError(
          absl::StrCat("shared-memory rendezvous aborted waiting for ", key));
    }
    const absl::Duration remaining = options.deadline - absl::Now();
    if (remaining <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("shared-memory rendezvous: timed out waiting for ", key));
    }
    absl::StatusOr<std::string> value = options.store->Get(key, std::min(remaining, kStoreSlice));
    if (value.ok() || !absl::IsDeadlineExceeded(value.status())) return value;
  }
}

absl::StatusOr<std::string> RandomToken() {
  unsigned char bytes[kTokenBytes];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("getrandom: ", ErrnoText(errno)));
    }
    got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

// A mapping of the segment, unmapped unless released.
struct Mapping {
  void* base = MAP_FAILED;
  size_t bytes = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base != MAP_FAILED) munmap(base, bytes);
  }
  void* Release() { return std::exchange(base, MAP_FAILED); }
};

// Removes the segments of this naming whose creator is gone (the process no longer exists here)
// and that are older than `stale_after`: what a leader killed between creating its segment and
// publishing its name left behind (nobody else knew the name, so nobody unlinked it). The age
// spares a live leader still in its setup window whose pid this namespace cannot see.
void RemoveAbandonedSegments(absl::Duration stale_after) {
  DIR* directory = opendir("/dev/shm");
  if (directory == nullptr) return;
  const absl::Time now = absl::Now();
  while (const dirent* entry = readdir(directory)) {
    absl::string_view name = entry->d_name;
    if (!absl::ConsumePrefix(&name, kNamePrefix)) continue;
    const size_t dash = name.find('-');
    int pid = 0;
    if (dash == absl::string_view::npos || !absl::SimpleAtoi(name.substr(0, dash), &pid) ||
        pid <= 0) {
      continue;
    }
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    const std::string path = absl::StrCat("/dev/shm/", entry->d_name);
    struct stat status;
    if (stat(path.c_str(), &status) != 0) continue;
    if (now - absl::TimeFromTimespec(status.st_ctim) < stale_after) continue;
    shm_unlink(absl::StrCat("/", entry->d_name).c_str());
  }
  closedir(directory);
}

// The leader: creates, sizes (pages reserved now, so a full /dev/shm is an error here and not a
// SIGBUS later), maps and fills the segment. The descriptor is closed before returning.
absl::Status CreateSegment(const std::string& name, const std::string& token, const Layout& layout,
                           const ShmLinkOptions& options, Mapping& mapping) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return absl::FailedPreconditionError(absl::StrCat("shm_open: ", ErrnoText(errno)));
  auto fail = [&](const std::string& what, int error) {
    close(fd);
    shm_unlink(name.c_str());
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", ErrnoText(error)));
  };
  if (ftruncate(fd, static_cast<off_t>(layout.total)) != 0) return fail("ftruncate", errno);
  if (const int error = posix_fallocate(fd, 0, static_cast<off_t>(layout.total)); error != 0) {
    return fail(absl::StrCat("reserving ", layout.total, " bytes of /dev/shm"), error);
  }
  void* base = mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return fail("mmap", errno);
  close(fd);
  mapping.base = base;
  mapping.bytes = layout.total;
  // Fresh tmpfs pages are zero: every counter and bell starts at 0.
  auto* header = new (base) SegmentHeader();
  header->total_bytes = layout.total;
  header->world_size = static_cast<uint32_t>(layout.members);
  header->slots = static_cast<uint32_t>(options.slots);
  header->slot_bytes = options.slot_bytes;
  std::memcpy(header->token, token.data(), std::min(token.size(), sizeof(header->token)));
  std::atomic_thread_fence(std::memory_order_release);
  header->magic = kMagic;
  return absl::OkStatus();
}

// Other members: opens the leader's segment by name and proves it is the one the leader made.
// Returns why not (empty when it is).
std::string OpenSegment(const std::string& name, const std::string& token, const Layout& layout,
                        Mapping& mapping) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    return absl::StrCat("cannot open the leader's segment ", name, " (", ErrnoText(errno),
                        "): another host or a private /dev/shm");
  }
  struct stat status;
  if (fstat(fd, &status) != 0 || static_cast<size_t>(status.st_size) != layout.total) {
    close(fd);
    return absl::StrCat("segment ", name, " has another size than the layout's ", layout.total);
  }
  void* base = mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (base == MAP_FAILED) return absl::StrCat("mmap of ", name, ": ", ErrnoText(error));
  mapping.base = base;
  mapping.bytes = layout.total;
  const auto* header = static_cast<const SegmentHeader*>(base);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (header->magic != kMagic || header->total_bytes != layout.total ||
      std::memcmp(header->token, token.data(), std::min(token.size(), sizeof(header->token))) !=
          0) {
    return absl::StrCat("segment ", name, " does not hold the leader's token: another host's");
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmLink>> ShmLink::Connect(const ShmLinkOptions& options) {
  if (options.world_size < 2 || options.rank < 0 || options.rank >= options.world_size ||
      options.store == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("shared-memory link: rank ", options.rank,
                                                   " of world size ", options.world_size,
                                                   " (needs >= 2 and a store)"));
  }
  if (options.slot_bytes < kAlign || options.slot_bytes % kAlign != 0 || options.slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("shm slots: slot_bytes ", options.slot_bytes,
                                                   " must be a positive multiple of ", kAlign,
                                                   " and slots ", options.slots, " at least 1"));
  }
  const int rank = options.rank;
  const int world_size = options.world_size;
  // Hosts first: ranks that say they are on different machines never try.
  ZS_RETURN_IF_ERROR(options.store->Set(Key(options, absl::StrCat("host/", rank)), options.host));
  std::vector<int> members;
  for (int peer = 0; peer < world_size; ++peer) {
    ZS_ASSIGN_OR_RETURN(const std::string host,
                        GetBy(options, Key(options, absl::StrCat("host/", peer))));
    if (host == options.host) {
      members.push_back(peer);
    } else if (options.whole_group) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", peer, " is on host '", host, "', rank ", rank, " on '", options.host, "'"));
    }
  }
  if (members.size() < 2) {
    return absl::FailedPreconditionError(
        absl::StrCat("no other rank is on host '", options.host, "'"));
  }
  const int leader = members.front();
  const std::string segment_key = Key(options, absl::StrCat("segment/", leader));
  const Layout layout = MakeLayout(members, world_size, options.slot_bytes, options.slots);
  Mapping mapping;
  std::string name;
  std::string why_not;  // this rank's reason the proof failed; empty when it holds
  if (rank == leader) {
    RemoveAbandonedSegments(options.abandoned_after);
    ZS_ASSIGN_OR_RETURN(const std::string token, RandomToken());
    name = absl::StrCat("/", kNamePrefix, getpid(), "-", token.substr(0, 8));
    const absl::Status created = CreateSegment(name, token, layout, options, mapping);
    if (!created.ok()) {
      why_not = absl::StrCat("rank ", leader, " could not create a segment: ", created.message());
      name.clear();
    }
    ZS_RETURN_IF_ERROR(
        options.store->Set(segment_key, created.ok() ? absl::StrCat(name, " ", token) : "none"));
  } else {
    ZS_ASSIGN_OR_RETURN(const std::string published, GetBy(options, segment_key));
    std::vector<std::string> parts = absl::StrSplit(published, ' ');
    if (parts.size() != 2) {
      why_not = absl::StrCat("rank ", leader, " could not create a segment");
    } else {
      name = parts[0];
      why_not = OpenSegment(name, parts[1], layout, mapping);
    }
  }
  // From here every exit path unlinks the name (ENOENT when another rank did already), so the
  // segment lives on only in the mappings of the ranks using it.
  auto unlink_name = [&] {
    if (!name.empty()) shm_unlink(name.c_str());
  };
  absl::Status published =
      options.store->Set(Key(options, absl::StrCat("mapped/", rank)),
                         why_not.empty() ? "ok" : absl::StrCat("no ", why_not));
  if (!published.ok()) {
    unlink_name();
    return published;
  }
  std::string refusal;
  for (int member : members) {
    absl::StatusOr<std::string> answer =
        GetBy(options, Key(options, absl::StrCat("mapped/", member)));
    if (!answer.ok()) {
      unlink_name();
      return answer.status();
    }
    if (refusal.empty() && *answer != "ok") {
      refusal = absl::StrCat("rank ", member, ": ", absl::StripPrefix(*answer, "no "));
    }
  }
  unlink_name();
  if (!refusal.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("ranks do not share memory (", refusal, ")"));
  }
  std::unique_ptr<ShmLink> link(new ShmLink(rank, world_size, std::move(members), mapping.Release(),
                                            layout.total, options.slot_bytes, options.slots));
  return link;
}

ShmLink::ShmLink(int rank, int world_size, std::vector<int> members, void* base, size_t bytes,
                 size_t slot_bytes, int slots)
    : rank_(rank),
      world_size_(world_size),
      members_(std::move(members)),
      local_index_(world_size, -1),
      base_(base),
      bytes_(bytes),
      outgoing_(world_size),
      incoming_(world_size),
      outbox_(world_size) {
  const int count = static_cast<int>(members_.size());
  for (int index = 0; index < count; ++index) local_index_[members_[index]] = index;
  const Layout layout = MakeLayout(members_, world_size, slot_bytes, slots);
  char* base_bytes = static_cast<char*>(base);
  bells_ = reinterpret_cast<Bell*>(base_bytes + layout.bells);
  auto view = [&](int sender, int receiver) {
    const size_t pair = static_cast<size_t>(local_index_[sender]) * count + local_index_[receiver];
    Ring ring;
    char* at = base_bytes + layout.rings[pair];
    ring.counters = reinterpret_cast<RingCounters*>(at);
    at += sizeof(RingCounters);
    ring.chunks = reinterpret_cast<ChunkHeader*>(at);
    at += AlignUp(layout.chunk_counts[pair] * sizeof(ChunkHeader));
    ring.data = at;
    ring.count = layout.chunk_counts[pair];
    ring.chunk_bytes = layout.chunk_bytes[pair];
    return ring;
  };
  for (int peer : members_) {
    if (peer == rank) continue;
    outgoing_[peer] = view(rank, peer);
    incoming_[peer] = view(peer, rank);
    ring_bytes_ += static_cast<int64_t>(outgoing_[peer].count * outgoing_[peer].chunk_bytes +
                                        incoming_[peer].count * incoming_[peer].chunk_bytes);
  }
  // The communication thread pushes only while it waits on this link; in a mixed group it also
  // waits on TCP, and the sends must move meanwhile.
  if (!reaches_all()) pusher_ = std::thread([this] { PushInBackground(); });
}

ShmLink::~ShmLink() {
  if (pusher_.joinable()) {
    {
      absl::MutexLock lock(&send_mu_);
      stopping_ = true;
    }
    RingBell(rank_);
    pusher_.join();
  }
  munmap(base_, bytes_);
}

void ShmLink::Interrupt(absl::Status why) {
  {
    absl::MutexLock lock(&mu_);
    if (interruption_.ok()) interruption_ = std::move(why);
  }
  {
    // Under send_mu_: once this returns, no push reads the caller's memory again.
    absl::MutexLock lock(&send_mu_);
    interrupted_.store(true, std::memory_order_seq_cst);
    for (std::deque<PendingSend>& queue : outbox_) queue.clear();
  }
  RingBell(rank_);
}

absl::Status ShmLink::Interruption() const {
  absl::MutexLock lock(&mu_);
  return interruption_.ok() ? absl::AbortedError("shared-memory link interrupted") : interruption_;
}

ShmLink::Bell& ShmLink::BellOf(int rank) { return bells_[local_index_[rank]]; }

void ShmLink::RingBell(int rank) {
  Bell& bell = BellOf(rank);
  bell.sequence.fetch_add(1, std::memory_order_seq_cst);
  if (bell.sleeping.load(std::memory_order_seq_cst) != 0) FutexWakeAll(&bell.sequence);
}

void ShmLink::Send(int peer, uint64_t slot, const void* data, size_t bytes) {
  bool queued;
  {
    absl::MutexLock lock(&send_mu_);
    if (interrupted_.load(std::memory_order_relaxed)) return;  // the next wait reports it
    outbox_[peer].push_back(PendingSend{slot, static_cast<const char*>(data), bytes, 0});
    PushSendsLocked();
    queued = !outbox_[peer].empty();
  }
  // The pusher sleeps until there is something to push.
  if (queued && pusher_.joinable()) RingBell(rank_);
}

bool ShmLink::PushSends() {
  absl::MutexLock lock(&send_mu_);
  return PushSendsLocked();
}

bool ShmLink::HasQueuedSendsLocked() const {
  for (const std::deque<PendingSend>& queue : outbox_) {
    if (!queue.empty()) return true;
  }
  return false;
}

bool ShmLink::PushSendsLocked() {
  bool moved = false;
  for (int peer = 0; peer < world_size_; ++peer) {
    std::deque<PendingSend>& queue = outbox_[peer];
    if (queue.empty()) continue;
    Ring& ring = outgoing_[peer];
    uint64_t head = ring.counters->head.load(std::memory_order_relaxed);  // only we write it
    uint64_t tail = ring.counters->tail.load(std::memory_order_acquire);
    bool published = false;
    while (!queue.empty()) {
      if (head - tail >= ring.count) {
        tail = ring.counters->tail.load(std::memory_order_acquire);
        if (head - tail >= ring.count) break;
      }
      PendingSend& send = queue.front();
      // A zero-byte message still takes one (empty) chunk, so the receiver sees it.
      const size_t part = std::min(ring.chunk_bytes, send.bytes - send.sent);
      const uint64_t index = head % ring.count;
      std::memcpy(ring.data + index * ring.chunk_bytes, send.data + send.sent, part);
      ring.chunks[index] = ChunkHeader{send.slot, part};
      ++head;
      ring.counters->head.store(head, std::memory_order_release);
      published = true;
      send.sent += part;
      if (send.sent == send.bytes) queue.pop_front();
    }
    if (published) {
      RingBell(peer);
      moved = true;
    }
  }
  return moved;
}

void ShmLink::PushInBackground() {
  Bell& mine = BellOf(rank_);
  while (true) {
    // Read before the last look, as in WaitUntil: a ring after it makes the futex return at once.
    const uint32_t seen = mine.sequence.load(std::memory_order_seq_cst);
    mine.sleeping.fetch_add(1, std::memory_order_seq_cst);
    {
      absl::MutexLock lock(&send_mu_);
      if (stopping_) {
        mine.sleeping.fetch_sub(1, std::memory_order_relaxed);
        return;
      }
      // Afterwards nothing is queued, or what is waits for room.
      PushSendsLocked();
    }
    // Until a Send queues, a receiver frees chunks, an interrupt or the destructor.
    FutexWait(&mine.sequence, seen, kLongestSleep);
    mine.sleeping.fetch_sub(1, std::memory_order_relaxed);
  }
}

template <typename Ready>
absl::Status ShmLink::WaitUntil(Ready ready, absl::Time deadline) {
  Bell& mine = BellOf(rank_);
  int spins = 0;
  while (true) {
    if (interrupted_.load(std::memory_order_acquire)) return Interruption();
    if (PushSends()) spins = 0;
    if (ready()) return absl::OkStatus();
    if (++spins < kSpins) {
      CpuRelax();
      continue;
    }
    const absl::Duration remaining = deadline - absl::Now();
    if (remaining <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("shared-memory collective timed out");
    }
    // The sequence is read before the last look: a ring after it changes the word, and the
    // futex then returns at once instead of sleeping through it.
    const uint32_t seen = mine.sequence.load(std::memory_order_seq_cst);
    mine.sleeping.fetch_add(1, std::memory_order_seq_cst);
    if (!interrupted_.load(std::memory_order_seq_cst) && !PushSends() && !ready()) {
      FutexWait(&mine.sequence, seen, std::min(remaining, kLongestSleep));
    }
    mine.sleeping.fetch_sub(1, std::memory_order_relaxed);
    spins = 0;
  }
}

absl::Status ShmLink::Receive(int peer, uint64_t slot, void* landing, size_t bytes,
                              absl::Time deadline, Consumer consume) {
  Ring& ring = incoming_[peer];
  size_t offset = 0;
  do {
    const uint64_t tail = ring.counters->tail.load(std::memory_order_relaxed);  // only we write it
    ZS_RETURN_IF_ERROR(WaitUntil(
        [&] { return ring.counters->head.load(std::memory_order_acquire) > tail; }, deadline));
    const uint64_t index = tail % ring.count;
    const ChunkHeader chunk = ring.chunks[index];
    const bool fits = chunk.bytes <= bytes - offset &&
                      (chunk.bytes == ring.chunk_bytes || offset + chunk.bytes == bytes);
    if (chunk.slot != slot || !fits) {
      return absl::InternalError(absl::StrCat(
          "shared-memory ring from rank ", peer, ": expected slot ", slot, " (", bytes - offset,
          " bytes left), found slot ", chunk.slot, " (", chunk.bytes, " bytes)"));
    }
    consume(ring.data + index * ring.chunk_bytes, offset, chunk.bytes);
    ring.counters->tail.store(tail + 1, std::memory_order_release);
    // The sender may be waiting for room.
    RingBell(peer);
    offset += chunk.bytes;
  } while (offset < bytes);
  return absl::OkStatus();
}

absl::Status ShmLink::WaitSends(absl::Time deadline) {
  return WaitUntil(
      [&] {
        absl::MutexLock lock(&send_mu_);
        return !HasQueuedSendsLocked();
      },
      deadline);
}

}  // namespace zeroshard::comm

// ShmLink: the shared-memory segment (layout, a sealed memfd, the same-host proof through the
// leader's descriptor) and the single-producer single-consumer chunk rings over it, with futex
// bells for waiting and, for links that are not the whole group, a pusher thread.
#include "worker/comm/shm_link.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
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
// The memfd's name (what /proc/<pid>/fd/<n> reads as "/memfd:zeroshard-shm (deleted)"). Names
// nothing: a memfd has no path, and any process may give its memfds any name.
constexpr char kMemfdName[] = "zeroshard-shm";
constexpr absl::string_view kMemfdLink = "/memfd:zeroshard-shm ";
// The seals the segment carries: its size can never change, so no mapping of it can fault.
constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;

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

// A descriptor, closed unless released.
struct OwnedFd {
  int fd = -1;
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd(fd) {}
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  ~OwnedFd() { Reset(); }
  void Reset() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
};

// The leader: creates the segment as a memfd (no name anyone can open, nothing in /dev/shm to
// unlink or leave behind), sizes it (pages reserved now, so a shortage of memory is an error here
// and not a SIGBUS later), seals its size (a truncate by anyone who reaches it fails with EPERM),
// maps and fills it. `fd` stays open for the members to reach through /proc until the setup ends.
absl::Status CreateSegment(const std::string& token, const Layout& layout,
                           const ShmLinkOptions& options, OwnedFd& fd, Mapping& mapping) {
  fd.fd = memfd_create(kMemfdName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd.fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("memfd_create: ", ErrnoText(errno)));
  }
  auto fail = [&](const std::string& what, int error) {
    fd.Reset();
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", ErrnoText(error)));
  };
  // Reopening it through /proc checks these bits: only this uid.
  if (fchmod(fd.fd, 0600) != 0) return fail("fchmod", errno);
  if (ftruncate(fd.fd, static_cast<off_t>(layout.total)) != 0) return fail("ftruncate", errno);
  if (const int error = posix_fallocate(fd.fd, 0, static_cast<off_t>(layout.total)); error != 0) {
    return fail(absl::StrCat("reserving ", layout.total, " bytes of shared memory"), error);
  }
  if (fcntl(fd.fd, F_ADD_SEALS, kSizeSeals | F_SEAL_SEAL) != 0) return fail("sealing", errno);
  void* base = mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
  if (base == MAP_FAILED) return fail("mmap", errno);
  mapping.base = base;
  mapping.bytes = layout.total;
  // Fresh shmem pages are zero: every counter and bell starts at 0.
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

bool IsToken(absl::string_view text) {
  return text.size() == 2 * kTokenBytes && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// Other members: reaches the leader's segment through its descriptor (`published` is the
// leader's "<pid> <fd> <token>") and proves it is the one the leader made. Returns why not (empty
// when it is). Whatever the record names, nothing is opened for reading or writing before it is
// known to be a sealed memfd of our name (an O_PATH descriptor opens nothing), and nothing is
// ever unlinked: a record from a rank that only claims this host can make the proof fail, never
// touch another object.
std::string OpenSegment(int leader, const std::string& published, const Layout& layout,
                        Mapping& mapping) {
  const std::vector<absl::string_view> parts = absl::StrSplit(published, ' ');
  int pid = 0;
  int leader_fd = -1;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &pid) || pid <= 0 ||
      !absl::SimpleAtoi(parts[1], &leader_fd) || leader_fd < 0 || !IsToken(parts[2])) {
    return absl::StrCat("rank ", leader, " published no segment of ours ('",
                        absl::CHexEscape(absl::string_view(published).substr(0, 80)), "')");
  }
  const std::string where = absl::StrCat("/proc/", pid, "/fd/", leader_fd);
  // The process's descriptor is reachable only in the leader's pid namespace, by its uid.
  const OwnedFd path(open(where.c_str(), O_PATH | O_CLOEXEC));
  if (path.fd < 0) {
    return absl::StrCat("cannot reach rank ", leader, "'s segment at ", where, " (",
                        ErrnoText(errno), "): another host, or a pid namespace of its own");
  }
  const std::string self = absl::StrCat("/proc/self/fd/", path.fd);
  char link[256];
  const ssize_t link_bytes = readlink(self.c_str(), link, sizeof(link));
  struct stat status;
  struct statfs file_system;
  if (link_bytes <= 0 ||
      !absl::StartsWith(absl::string_view(link, static_cast<size_t>(link_bytes)), kMemfdLink) ||
      fstat(path.fd, &status) != 0 || !S_ISREG(status.st_mode) || status.st_nlink != 0 ||
      fstatfs(path.fd, &file_system) != 0 || file_system.f_type != TMPFS_MAGIC) {
    return absl::StrCat(where, " is not rank ", leader, "'s segment (not a memfd of ours)");
  }
  // The same file, now opened: /proc/self/fd of the O_PATH descriptor reaches the inode it pins.
  const OwnedFd file(open(self.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY));
  if (file.fd < 0) return absl::StrCat("opening ", where, ": ", ErrnoText(errno));
  const int seals = fcntl(file.fd, F_GET_SEALS);
  if (seals < 0 || (seals & kSizeSeals) != kSizeSeals) {
    return absl::StrCat("rank ", leader, "'s segment at ", where,
                        " is not sealed against resizing");
  }
  if (fstat(file.fd, &status) != 0 || static_cast<size_t>(status.st_size) != layout.total) {
    return absl::StrCat("rank ", leader, "'s segment at ", where,
                        " has another size than the layout's ", layout.total);
  }
  void* base = mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, file.fd, 0);
  if (base == MAP_FAILED) return absl::StrCat("mmap of ", where, ": ", ErrnoText(errno));
  mapping.base = base;
  mapping.bytes = layout.total;
  const auto* header = static_cast<const SegmentHeader*>(base);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (header->magic != kMagic || header->total_bytes != layout.total ||
      std::memcmp(header->token, parts[2].data(), sizeof(header->token)) != 0) {
    return absl::StrCat("the segment at ", where, " does not hold rank ", leader,
                        "'s token: another host's");
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
  // The leader's memfd, open until every member has answered (mapped it or given up), then
  // closed on every path: from then on only the members' mappings hold the segment.
  OwnedFd segment_fd;
  std::string why_not;  // this rank's reason the proof failed; empty when it holds
  if (rank == leader) {
    ZS_ASSIGN_OR_RETURN(const std::string token, RandomToken());
    const absl::Status created = CreateSegment(token, layout, options, segment_fd, mapping);
    if (!created.ok()) {
      why_not = absl::StrCat("rank ", leader, " could not create a segment: ", created.message());
    }
    ZS_RETURN_IF_ERROR(options.store->Set(
        segment_key,
        created.ok() ? absl::StrCat(getpid(), " ", segment_fd.fd, " ", token) : "none"));
  } else {
    ZS_ASSIGN_OR_RETURN(const std::string published, GetBy(options, segment_key));
    if (published == "none") {
      why_not = absl::StrCat("rank ", leader, " could not create a segment");
    } else {
      why_not = OpenSegment(leader, published, layout, mapping);
    }
  }
  ZS_RETURN_IF_ERROR(options.store->Set(Key(options, absl::StrCat("mapped/", rank)),
                                        why_not.empty() ? "ok" : absl::StrCat("no ", why_not)));
  std::string refusal;
  for (int member : members) {
    ZS_ASSIGN_OR_RETURN(const std::string answer,
                        GetBy(options, Key(options, absl::StrCat("mapped/", member))));
    if (refusal.empty() && answer != "ok") {
      refusal = absl::StrCat("rank ", member, ": ", absl::StripPrefix(answer, "no "));
    }
  }
  segment_fd.Reset();
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
    const uint64_t index = tail % ring.count;  // inside the ring, whatever the counter holds
    // The header is the peer's to write, and anyone holding the segment may change it: read each
    // field once (volatile, so no later use reads it again) and bound it by the chunk before use.
    const volatile ChunkHeader& shared = ring.chunks[index];
    const ChunkHeader chunk{shared.slot, shared.bytes};
    if (chunk.bytes > ring.chunk_bytes) {
      return absl::InternalError(absl::StrCat("shared-memory ring from rank ", peer,
                                              ": a chunk header claims ", chunk.bytes,
                                              " bytes in a chunk of ", ring.chunk_bytes));
    }
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

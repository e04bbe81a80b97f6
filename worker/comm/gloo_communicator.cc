// GlooCommunicator: rendezvous through our Store, a communication thread that runs operations in
// issue order, and pipelined ring collectives over Gloo's unbound buffers.
#include "worker/comm/gloo_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "worker/comm/gloo_store_adapter.h"
#include "worker/comm/reduction.h"

namespace zeroshard::comm {
namespace {

// A message's Gloo slot: tag (low 20 bits) | operation sequence (low 24 bits) | unit (20 bits).
// A unit is one (phase, step, segment) of one operation; slots only need to be distinct among
// messages in flight at the same time, and operations run one after another.
constexpr int kUnitBits = 20;
constexpr int kSequenceBits = 24;
constexpr uint64_t kUnitsPerPhase = uint64_t{1} << (kUnitBits - 1);

uint64_t MakeSlot(uint32_t tag, uint64_t sequence, uint64_t unit) {
  const uint64_t tag_bits = tag & ((uint64_t{1} << (64 - kUnitBits - kSequenceBits)) - 1);
  const uint64_t sequence_bits = sequence & ((uint64_t{1} << kSequenceBits) - 1);
  return (tag_bits << (kUnitBits + kSequenceBits)) | (sequence_bits << kUnitBits) | unit;
}

int Mod(int value, int modulus) { return ((value % modulus) + modulus) % modulus; }

// Transport lanes: every rank has kLanes Gloo contexts (each a full mesh of TCP connections with
// its own event-loop thread), and a message from rank s travels on lane s % kLanes. A ring's
// neighbours differ in parity (except at the wrap of an odd ring), so each rank's outgoing and
// incoming ring traffic are served by different event-loop threads: with one context, that one
// thread copies every byte in and out of the sockets (at W = 2 both directions share a socket).
constexpr int kLanes = 2;

int LaneOf(int sender) { return sender % kLanes; }

// Element ranges of the W pieces of a buffer: piece p is [begin[p], begin[p + 1]).
struct Pieces {
  std::vector<size_t> begin;
  size_t size(int piece) const { return begin[piece + 1] - begin[piece]; }
  size_t largest() const {
    size_t largest = 0;
    for (size_t p = 0; p + 1 < begin.size(); ++p) largest = std::max(largest, size(p));
    return largest;
  }
};

Pieces EqualPieces(int world_size, size_t piece_count) {
  Pieces pieces;
  for (int p = 0; p <= world_size; ++p) pieces.begin.push_back(p * piece_count);
  return pieces;
}

// Sizes differ by at most one element; the first count % W pieces are the larger ones.
Pieces BalancedPieces(int world_size, size_t count) {
  Pieces pieces;
  const size_t base = count / world_size;
  const size_t larger = count % world_size;
  size_t offset = 0;
  for (int p = 0; p < world_size; ++p) {
    pieces.begin.push_back(offset);
    offset += base + (static_cast<size_t>(p) < larger ? 1 : 0);
  }
  pieces.begin.push_back(offset);
  return pieces;
}

// How a piece of up to `largest_piece` elements is cut into segments: segment k of a piece is
// elements [k * elements, min(piece size, (k + 1) * elements)), possibly empty for smaller pieces.
struct Segments {
  size_t elements = 1;
  int count = 0;
};

Segments PlanSegments(size_t largest_piece, size_t element_size, size_t segment_bytes, int steps) {
  Segments segments;
  if (largest_piece == 0) return segments;
  segments.elements = std::max<size_t>(1, segment_bytes / element_size);
  size_t count = (largest_piece + segments.elements - 1) / segments.elements;
  const size_t max_count = (kUnitsPerPhase - 1) / std::max(1, steps);
  if (count > max_count) {
    count = max_count;
    segments.elements = (largest_piece + count - 1) / count;
    count = (largest_piece + segments.elements - 1) / segments.elements;
  }
  segments.count = static_cast<int>(count);
  return segments;
}

// Element range of segment k of piece p.
struct Range {
  size_t offset;
  size_t count;
};

Range SegmentOf(const Pieces& pieces, const Segments& segments, int piece, int k) {
  const size_t size = pieces.size(piece);
  const size_t start = std::min(size, static_cast<size_t>(k) * segments.elements);
  const size_t end = std::min(size, start + segments.elements);
  return Range{pieces.begin[piece] + start, end - start};
}

std::chrono::milliseconds ToGlooTimeout(absl::Duration remaining) {
  constexpr int64_t kLongestWaitMs = int64_t{24} * 3600 * 1000;
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(remaining, absl::Milliseconds(1)));
  return std::chrono::milliseconds(std::clamp<int64_t>(ms, 1, kLongestWaitMs));
}

bool IsValidType(ElementType type) { return ElementSize(type) != 0; }

enum class OperationKind { kReduceScatter, kAllGather, kAllReduce, kBroadcast, kBarrier };

}  // namespace

// One issued operation. `input` is the out-of-place source (null when in place); `buffer` is the
// whole buffer the operation works on (for an out-of-place ReduceScatter, the output piece).
struct GlooCommunicator::Operation {
  OperationKind kind = OperationKind::kBarrier;
  const char* input = nullptr;
  char* buffer = nullptr;
  size_t count = 0;  // piece_count for ReduceScatter and AllGather, else the buffer's count
  ElementType type = ElementType::kFloat32;
  ReduceOp reduce = ReduceOp::kSum;
  int root = 0;
  CollectiveOptions options;
  uint64_t sequence = 0;
  std::shared_ptr<Completion> completion;
};

// The result of one operation, shared by its Work handle and the communication thread.
// Thread-safe.
class GlooCommunicator::Completion {
 public:
  // `run_time`: how long the operation ran on the communication thread (zero if it never ran).
  void Finish(absl::Status status, absl::Duration run_time) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    run_time_ = run_time;
    done_ = true;
  }

  absl::Status Wait(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(&done_), timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("operation still running after waiting ", absl::FormatDuration(timeout)));
    }
    return status_;
  }

  bool Done() const {
    absl::MutexLock lock(&mu_);
    return done_;
  }

  std::optional<absl::Duration> RunTime() const {
    absl::MutexLock lock(&mu_);
    if (!done_) return std::nullopt;
    return run_time_;
  }

 private:
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Duration run_time_ ABSL_GUARDED_BY(mu_);
};

// The per-operation view of the transport and the ring algorithms over it: unbound buffers
// (kept alive until the operation is over and, after a failure, until the connections are
// closed), message slots, and the sends still to wait for. Communication thread only.
class GlooCommunicator::Ring {
 public:
  Ring(GlooCommunicator* communicator, const Operation& operation)
      : communicator_(communicator),
        rank_(communicator->rank_),
        world_size_(communicator->world_size_),
        next_((communicator->rank_ + 1) % communicator->world_size_),
        previous_(Mod(communicator->rank_ - 1, communicator->world_size_)),
        tag_(operation.options.tag),
        sequence_(operation.sequence),
        deadline_(absl::Now() + operation.options.timeout) {}

  absl::Time deadline() const { return deadline_; }

  // Reduce-scatter ring over `pieces` (see the class comment in the header for the order).
  // `input` holds this rank's contributions (whole-buffer layout); partial sums that are
  // forwarded again go to `work` (whole-buffer layout, may be `input` itself when in place); the
  // reduced piece rank_ goes to `output`. Units [unit_base, unit_base + kUnitsPerPhase).
  absl::Status ReduceScatter(const Pieces& pieces, const char* input, char* work, char* output,
                             ElementType type, ReduceOp op, uint64_t unit_base) {
    const size_t element_size = ElementSize(type);
    const int steps = world_size_ - 1;
    const Segments segments =
        PlanSegments(pieces.largest(), element_size, communicator_->segment_bytes_, steps);
    const int units = steps * segments.count;
    if (units == 0) return absl::OkStatus();
    const int depth = std::min(communicator_->staging_segments_, units);
    const size_t staging_bytes = segments.elements * element_size;
    std::vector<char>& staging = communicator_->staging_;
    if (staging.size() < depth * staging_bytes) staging.resize(depth * staging_bytes);
    std::vector<gloo::transport::UnboundBuffer*> stage(depth);
    for (int i = 0; i < depth; ++i)
      stage[i] = RecvBuffer(staging.data() + i * staging_bytes, staging_bytes, previous_);
    auto sent_piece = [&](int step) { return Mod(rank_ - 1 - step, world_size_); };
    auto received_piece = [&](int step) { return Mod(rank_ - 2 - step, world_size_); };
    auto post_receive = [&](int unit) {
      const Range range =
          SegmentOf(pieces, segments, received_piece(unit / segments.count), unit % segments.count);
      if (range.count == 0) return;
      Recv(stage[unit % depth], previous_, unit_base + unit, 0, range.count * element_size);
    };
    auto send = [&](int step, int k) {
      const Range range = SegmentOf(pieces, segments, sent_piece(step), k);
      if (range.count == 0) return;
      const char* source = (step == 0 ? input : work) + range.offset * element_size;
      Send(SendBuffer(source, range.count * element_size), next_,
           unit_base + step * segments.count + k);
    };
    for (int unit = 0; unit < depth; ++unit) post_receive(unit);
    for (int k = 0; k < segments.count; ++k) send(0, k);
    for (int unit = 0; unit < units; ++unit) {
      const int step = unit / segments.count;
      const int k = unit % segments.count;
      const int piece = received_piece(step);
      const Range range = SegmentOf(pieces, segments, piece, k);
      if (range.count > 0) {
        const size_t bytes = range.count * element_size;
        ZS_RETURN_IF_ERROR(WaitRecv(stage[unit % depth], bytes));
        char* destination = step == steps - 1
                                ? output + (range.offset - pieces.begin[piece]) * element_size
                                : work + range.offset * element_size;
        ReduceElements(destination, staging.data() + (unit % depth) * staging_bytes,
                       input + range.offset * element_size, range.count, type, op);
      }
      if (unit + depth < units) post_receive(unit + depth);
      if (step + 1 < steps) send(step + 1, k);
    }
    return WaitSends();
  }

  // All-gather ring, in place on `buffer` whose piece rank_ is filled. Units
  // [unit_base, unit_base + kUnitsPerPhase).
  absl::Status AllGather(const Pieces& pieces, char* buffer, size_t element_size,
                         uint64_t unit_base) {
    const int steps = world_size_ - 1;
    const Segments segments =
        PlanSegments(pieces.largest(), element_size, communicator_->segment_bytes_, steps);
    const int units = steps * segments.count;
    if (units == 0) return absl::OkStatus();
    // Every receive is posted up front, straight into its place in the buffer.
    std::vector<gloo::transport::UnboundBuffer*> landing(units, nullptr);
    for (int unit = 0; unit < units; ++unit) {
      const int piece = Mod(rank_ - 1 - unit / segments.count, world_size_);
      const Range range = SegmentOf(pieces, segments, piece, unit % segments.count);
      if (range.count == 0) continue;
      landing[unit] =
          RecvBuffer(buffer + range.offset * element_size, range.count * element_size, previous_);
      Recv(landing[unit], previous_, unit_base + unit);
    }
    for (int k = 0; k < segments.count; ++k) {
      const Range range = SegmentOf(pieces, segments, rank_, k);
      if (range.count == 0) continue;
      Send(SendBuffer(buffer + range.offset * element_size, range.count * element_size), next_,
           unit_base + k);
    }
    for (int unit = 0; unit < units; ++unit) {
      if (landing[unit] == nullptr) continue;
      ZS_RETURN_IF_ERROR(WaitRecv(landing[unit], landing[unit]->size));
      if (unit / segments.count + 1 < steps) {
        Send(SendBuffer(landing[unit]->ptr, landing[unit]->size), next_,
             unit_base + unit + segments.count);
      }
    }
    return WaitSends();
  }

  // Pipelined chain root, root+1, ..., root-1 over the whole buffer.
  absl::Status Broadcast(char* buffer, size_t count, size_t element_size, int root) {
    const int position = Mod(rank_ - root, world_size_);
    const Pieces whole = EqualPieces(1, count);
    const Segments segments =
        PlanSegments(count, element_size, communicator_->segment_bytes_, /*steps=*/1);
    std::vector<gloo::transport::UnboundBuffer*> part(segments.count, nullptr);
    for (int k = 0; k < segments.count; ++k) {
      if (position == 0) continue;
      const Range range = SegmentOf(whole, segments, 0, k);
      part[k] =
          RecvBuffer(buffer + range.offset * element_size, range.count * element_size, previous_);
      Recv(part[k], previous_, k);
    }
    for (int k = 0; k < segments.count; ++k) {
      const Range range = SegmentOf(whole, segments, 0, k);
      const size_t bytes = range.count * element_size;
      if (position > 0) ZS_RETURN_IF_ERROR(WaitRecv(part[k], bytes));
      if (position + 1 < world_size_) {
        Send(SendBuffer(buffer + range.offset * element_size, bytes), next_, k);
      }
    }
    return WaitSends();
  }

  // Every rank sends one byte to, and receives one byte from, every other rank.
  absl::Status Barrier() {
    std::vector<char>& bytes = barrier_bytes_;
    bytes.assign(world_size_ + 1, 0);
    gloo::transport::UnboundBuffer* outgoing = SendBuffer(bytes.data() + world_size_, 1);
    std::vector<gloo::transport::UnboundBuffer*> incoming(world_size_, nullptr);
    for (int peer = 0; peer < world_size_; ++peer) {
      if (peer == rank_) continue;
      incoming[peer] = RecvBuffer(bytes.data() + peer, 1, peer);
      Recv(incoming[peer], peer, 0);
    }
    for (int peer = 0; peer < world_size_; ++peer) {
      if (peer != rank_) Send(outgoing, peer, 0);
    }
    for (int peer = 0; peer < world_size_; ++peer) {
      if (peer != rank_) ZS_RETURN_IF_ERROR(WaitRecv(incoming[peer], 1));
    }
    return WaitSends();
  }

 private:
  // An unbound buffer on `lane`'s context.
  gloo::transport::UnboundBuffer* Buffer(const void* data, size_t bytes, int lane) {
    buffers_.push_back(
        communicator_->contexts_[lane]->createUnboundBuffer(const_cast<void*>(data), bytes));
    return buffers_.back().get();
  }
  // A buffer this rank sends from: on this rank's lane.
  gloo::transport::UnboundBuffer* SendBuffer(const void* data, size_t bytes) {
    return Buffer(data, bytes, LaneOf(rank_));
  }
  // A buffer receiving from `peer`: on the sender's lane.
  gloo::transport::UnboundBuffer* RecvBuffer(void* data, size_t bytes, int peer) {
    return Buffer(data, bytes, LaneOf(peer));
  }

  void Send(gloo::transport::UnboundBuffer* buffer, int peer, uint64_t unit) {
    buffer->send(peer, MakeSlot(tag_, sequence_, unit), 0, buffer->size);
    pending_sends_.push_back(buffer);
    communicator_->bytes_sent_.fetch_add(static_cast<int64_t>(buffer->size),
                                         std::memory_order_relaxed);
  }

  void Recv(gloo::transport::UnboundBuffer* buffer, int peer, uint64_t unit, size_t offset_bytes,
            size_t bytes) {
    buffer->recv(peer, MakeSlot(tag_, sequence_, unit), offset_bytes, bytes);
  }

  void Recv(gloo::transport::UnboundBuffer* buffer, int peer, uint64_t unit) {
    Recv(buffer, peer, unit, 0, buffer->size);
  }

  absl::Status WaitRecv(gloo::transport::UnboundBuffer* buffer, size_t bytes) {
    ZS_RETURN_IF_ERROR(communicator_->WaitOnBuffer(buffer, /*receive=*/true, deadline_));
    communicator_->bytes_received_.fetch_add(static_cast<int64_t>(bytes),
                                             std::memory_order_relaxed);
    return absl::OkStatus();
  }

  absl::Status WaitSends() {
    for (gloo::transport::UnboundBuffer* buffer : pending_sends_) {
      ZS_RETURN_IF_ERROR(communicator_->WaitOnBuffer(buffer, /*receive=*/false, deadline_));
    }
    pending_sends_.clear();
    return absl::OkStatus();
  }

  GlooCommunicator* const communicator_;
  const int rank_;
  const int world_size_;
  const int next_;
  const int previous_;
  const uint32_t tag_;
  const uint64_t sequence_;
  const absl::Time deadline_;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> buffers_;
  // Barrier's one-byte messages; a member so it outlives the buffers over it.
  std::vector<char> barrier_bytes_;
  // One entry per send not yet waited for (a buffer sending twice appears twice).
  std::vector<gloo::transport::UnboundBuffer*> pending_sends_;
};

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    const GlooCommunicatorOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " of world size ",
                                                   options.world_size, " is out of range"));
  }
  if (options.world_size > 1 && options.store == nullptr) {
    return absl::InvalidArgumentError("a store is required when world_size > 1");
  }
  if (options.segment_bytes < 64 || options.staging_segments < 1) {
    return absl::InvalidArgumentError("segment_bytes must be >= 64 and staging_segments >= 1");
  }
  std::vector<std::shared_ptr<gloo::Context>> contexts;
  if (options.world_size > 1) {
    const absl::Time start = absl::Now();
    try {
      for (int lane = 0; lane < kLanes; ++lane) {
        gloo::transport::tcp::attr attr;
        attr.hostname = options.hostname;
        std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
        auto mesh = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
        const absl::Duration remaining = options.rendezvous_timeout - (absl::Now() - start);
        mesh->setTimeout(ToGlooTimeout(remaining));
        GlooStoreAdapter adapter(
            options.store,
            lane == 0 ? options.store_prefix : absl::StrCat(options.store_prefix, "/lane", lane),
            std::max(remaining, absl::Milliseconds(1)));
        mesh->connectFullMesh(adapter, device);
        contexts.push_back(std::move(mesh));
      }
    } catch (const std::exception& e) {
      const std::string message = absl::StrCat("gloo rendezvous of rank ", options.rank, "/",
                                               options.world_size, " failed: ", e.what());
      if (absl::Now() - start >= options.rendezvous_timeout) {
        return absl::DeadlineExceededError(message);
      }
      return absl::UnavailableError(message);
    }
  }
  return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(options, std::move(contexts)));
}

GlooCommunicator::GlooCommunicator(const GlooCommunicatorOptions& options,
                                   std::vector<std::shared_ptr<gloo::Context>> contexts)
    : rank_(options.rank),
      world_size_(options.world_size),
      segment_bytes_(options.segment_bytes),
      staging_segments_(options.staging_segments),
      contexts_(std::move(contexts)) {
  {
    absl::MutexLock lock(&mu_);
    connections_open_ = !contexts_.empty();
  }
  thread_ = std::thread([this] { CommunicationLoop(); });
}

GlooCommunicator::~GlooCommunicator() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  bool busy;
  {
    absl::MutexLock lock(&mu_);
    busy = !queue_.empty() || running_;
  }
  if (busy) Abort();
  thread_.join();
  // Graceful close: data already written still reaches the peers.
  contexts_.clear();
}

bool GlooCommunicator::HasThreadWork() const {
  return !queue_.empty() || stopping_ || (failed_ && connections_open_);
}

void GlooCommunicator::CommunicationLoop() {
  while (true) {
    std::optional<Operation> operation;
    bool failed;
    absl::Status failure;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &GlooCommunicator::HasThreadWork));
      if (!queue_.empty()) {
        operation = std::move(queue_.front());
        queue_.pop_front();
      }
      failed = failed_;
      running_ = operation.has_value() && !failed;
      failure = failure_;
      if (!operation.has_value() && !failed && stopping_) return;
    }
    if (failed) {
      CloseConnections();
      if (operation.has_value()) {
        operation->completion->Finish(
            absl::AbortedError(
                absl::StrCat("communicator ended before this operation ran: ", failure.ToString())),
            absl::ZeroDuration());
      } else {
        absl::MutexLock lock(&mu_);
        if (stopping_ && queue_.empty()) return;
      }
      continue;
    }
    absl::Status status;
    const absl::Time run_start = absl::Now();
    {
      Ring ring(this, *operation);
      status = Execute(*operation, ring);
      if (!status.ok()) {
        MarkFailed(status);
        // Close before the ring's buffers go away, so Gloo never writes into freed memory.
        CloseConnections();
      }
    }
    const absl::Duration run_time = absl::Now() - run_start;
    {
      absl::MutexLock lock(&mu_);
      running_ = false;
    }
    operations_completed_.fetch_add(1, std::memory_order_relaxed);
    operation->completion->Finish(std::move(status), run_time);
  }
}

absl::Status GlooCommunicator::Execute(const Operation& operation, Ring& ring) {
  try {
    switch (operation.kind) {
      case OperationKind::kReduceScatter:
        return RunReduceScatter(operation, ring);
      case OperationKind::kAllGather:
        return RunAllGather(operation, ring);
      case OperationKind::kAllReduce:
        return RunAllReduce(operation, ring);
      case OperationKind::kBroadcast:
        return RunBroadcast(operation, ring);
      case OperationKind::kBarrier:
        return RunBarrier(ring);
    }
    return absl::InternalError("unknown operation kind");
  } catch (const std::exception& e) {
    const std::string message =
        absl::StrCat("gloo collective (sequence ", operation.sequence, ") failed: ", e.what());
    if (absl::Now() >= ring.deadline()) {
      return absl::DeadlineExceededError(absl::StrCat(
          message, " (timeout ", absl::FormatDuration(operation.options.timeout), ")"));
    }
    return absl::UnavailableError(message);
  }
}

void GlooCommunicator::MarkFailed(const absl::Status& cause) {
  absl::MutexLock lock(&mu_);
  if (failed_) return;
  failed_ = true;
  failure_ = cause;
}

void GlooCommunicator::CloseConnections() {
  for (const std::shared_ptr<gloo::Context>& context : contexts_) {
    try {
      context->closeConnections();
    } catch (const std::exception&) {
      // The connections are being torn down because of an earlier error; a further error while
      // closing them changes nothing.
    }
  }
  absl::MutexLock lock(&mu_);
  connections_open_ = false;
}

absl::Status GlooCommunicator::WaitOnBuffer(gloo::transport::UnboundBuffer* buffer, bool receive,
                                            absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (failed_) return absl::AbortedError(failure_.message());
    waiting_on_ = buffer;
  }
  absl::Cleanup clear_waiting = [this] {
    absl::MutexLock lock(&mu_);
    waiting_on_ = nullptr;
  };
  const absl::Duration remaining = deadline - absl::Now();
  if (remaining <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError("collective timed out");
  }
  const std::chrono::milliseconds timeout = ToGlooTimeout(remaining);
  const bool completed =
      receive ? buffer->waitRecv(nullptr, timeout) : buffer->waitSend(nullptr, timeout);
  if (!completed) {
    absl::MutexLock lock(&mu_);
    return absl::AbortedError(failed_ ? failure_.message() : "gloo wait aborted");
  }
  return absl::OkStatus();
}

void GlooCommunicator::Abort() {
  absl::MutexLock lock(&mu_);
  if (!failed_) {
    failed_ = true;
    failure_ = absl::AbortedError("communicator aborted");
  }
  if (waiting_on_ != nullptr) {
    waiting_on_->abortWaitRecv();
    waiting_on_->abortWaitSend();
  }
}

CommunicatorStats GlooCommunicator::stats() const {
  CommunicatorStats stats;
  stats.operations_completed = operations_completed_.load(std::memory_order_relaxed);
  stats.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
  stats.bytes_received = bytes_received_.load(std::memory_order_relaxed);
  return stats;
}

std::unique_ptr<Work> GlooCommunicator::Enqueue(Operation operation) {
  if (!IsValidType(operation.type)) {
    return MakeFinishedWork(absl::InvalidArgumentError("invalid element type"));
  }
  if (operation.options.timeout <= absl::ZeroDuration()) {
    return MakeFinishedWork(absl::InvalidArgumentError("timeout must be positive"));
  }
  const size_t element_size = ElementSize(operation.type);
  if (operation.count > std::numeric_limits<size_t>::max() / element_size / world_size_) {
    return MakeFinishedWork(absl::InvalidArgumentError("element count overflows"));
  }
  if (operation.count > 0 && operation.buffer == nullptr) {
    return MakeFinishedWork(absl::InvalidArgumentError("null buffer with a nonzero count"));
  }
  auto completion = std::make_shared<Completion>();
  operation.completion = completion;
  {
    absl::MutexLock lock(&mu_);
    if (failed_) {
      return MakeFinishedWork(
          absl::AbortedError(absl::StrCat("communicator ended: ", failure_.ToString())));
    }
    operation.sequence = next_sequence_++;
    queue_.push_back(std::move(operation));
  }
  class CompletionWork : public Work {
   public:
    explicit CompletionWork(std::shared_ptr<Completion> completion)
        : completion_(std::move(completion)) {}
    absl::Status Wait(absl::Duration timeout) override { return completion_->Wait(timeout); }
    bool Done() const override { return completion_->Done(); }
    std::optional<absl::Duration> RunTime() const override { return completion_->RunTime(); }

   private:
    const std::shared_ptr<Completion> completion_;
  };
  return std::make_unique<CompletionWork>(std::move(completion));
}

std::unique_ptr<Work> GlooCommunicator::ReduceScatter(const void* input, void* output,
                                                      size_t piece_count, ElementType type,
                                                      ReduceOp op,
                                                      const CollectiveOptions& options) {
  if (piece_count > 0 && input == nullptr) {
    return MakeFinishedWork(absl::InvalidArgumentError("null input with a nonzero count"));
  }
  Operation operation;
  operation.kind = OperationKind::kReduceScatter;
  operation.input = static_cast<const char*>(input);
  operation.buffer = static_cast<char*>(output);
  operation.count = piece_count;
  operation.type = type;
  operation.reduce = op;
  operation.options = options;
  return Enqueue(std::move(operation));
}

std::unique_ptr<Work> GlooCommunicator::ReduceScatterInPlace(void* buffer, size_t piece_count,
                                                             ElementType type, ReduceOp op,
                                                             const CollectiveOptions& options) {
  Operation operation;
  operation.kind = OperationKind::kReduceScatter;
  operation.buffer = static_cast<char*>(buffer);
  operation.count = piece_count;
  operation.type = type;
  operation.reduce = op;
  operation.options = options;
  return Enqueue(std::move(operation));
}

std::unique_ptr<Work> GlooCommunicator::AllGather(const void* input, void* output,
                                                  size_t piece_count, ElementType type,
                                                  const CollectiveOptions& options) {
  if (piece_count > 0 && input == nullptr) {
    return MakeFinishedWork(absl::InvalidArgumentError("null input with a nonzero count"));
  }
  Operation operation;
  operation.kind = OperationKind::kAllGather;
  operation.input = static_cast<const char*>(input);
  operation.buffer = static_cast<char*>(output);
  operation.count = piece_count;
  operation.type = type;
  operation.options = options;
  return Enqueue(std::move(operation));
}

std::unique_ptr<Work> GlooCommunicator::AllGatherInPlace(void* buffer, size_t piece_count,
                                                         ElementType type,
                                                         const CollectiveOptions& options) {
  Operation operation;
  operation.kind = OperationKind::kAllGather;
  operation.buffer = static_cast<char*>(buffer);
  operation.count = piece_count;
  operation.type = type;
  operation.options = options;
  return Enqueue(std::move(operation));
}

std::unique_ptr<Work> GlooCommunicator::AllReduce(void* buffer, size_t count, ElementType type,
                                                  ReduceOp op, const CollectiveOptions& options) {
  Operation operation;
  operation.kind = OperationKind::kAllReduce;
  operation.buffer = static_cast<char*>(buffer);
  operation.count = count;
  operation.type = type;
  operation.reduce = op;
  operation.options = options;
  return Enqueue(std::move(operation));
}

std::unique_ptr<Work> GlooCommunicator::Broadcast(void* buffer, size_t count, ElementType type,
                                                  int root, const CollectiveOptions& options) {
  if (root < 0 || root >= world_size_) {
    return MakeFinishedWork(absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is outside world size ", world_size_)));
  }
  Operation operation;
  operation.kind = OperationKind::kBroadcast;
  operation.buffer = static_cast<char*>(buffer);
  operation.count = count;
  operation.type = type;
  operation.root = root;
  operation.options = options;
  return Enqueue(std::move(operation));
}

std::unique_ptr<Work> GlooCommunicator::Barrier(const CollectiveOptions& options) {
  Operation operation;
  operation.kind = OperationKind::kBarrier;
  operation.options = options;
  return Enqueue(std::move(operation));
}

absl::Status GlooCommunicator::RunReduceScatter(const Operation& operation, Ring& ring) {
  const size_t piece_bytes = operation.count * ElementSize(operation.type);
  if (piece_bytes == 0) return absl::OkStatus();
  const bool in_place = operation.input == nullptr;
  const char* input = in_place ? operation.buffer : operation.input;
  char* output = in_place ? operation.buffer + rank_ * piece_bytes : operation.buffer;
  if (world_size_ == 1) {
    if (!in_place) std::memcpy(output, input, piece_bytes);
    return absl::OkStatus();
  }
  char* work = operation.buffer;
  if (!in_place) {
    if (scratch_.size() < world_size_ * piece_bytes) scratch_.resize(world_size_ * piece_bytes);
    work = scratch_.data();
  }
  return ring.ReduceScatter(EqualPieces(world_size_, operation.count), input, work, output,
                            operation.type, operation.reduce, /*unit_base=*/0);
}

absl::Status GlooCommunicator::RunAllGather(const Operation& operation, Ring& ring) {
  const size_t piece_bytes = operation.count * ElementSize(operation.type);
  if (piece_bytes == 0) return absl::OkStatus();
  if (operation.input != nullptr) {
    std::memcpy(operation.buffer + rank_ * piece_bytes, operation.input, piece_bytes);
  }
  if (world_size_ == 1) return absl::OkStatus();
  return ring.AllGather(EqualPieces(world_size_, operation.count), operation.buffer,
                        ElementSize(operation.type), /*unit_base=*/0);
}

absl::Status GlooCommunicator::RunAllReduce(const Operation& operation, Ring& ring) {
  if (operation.count == 0 || world_size_ == 1) return absl::OkStatus();
  const size_t element_size = ElementSize(operation.type);
  const Pieces pieces = BalancedPieces(world_size_, operation.count);
  char* buffer = operation.buffer;
  ZS_RETURN_IF_ERROR(ring.ReduceScatter(pieces, buffer, buffer,
                                        buffer + pieces.begin[rank_] * element_size, operation.type,
                                        operation.reduce, /*unit_base=*/0));
  return ring.AllGather(pieces, buffer, element_size, /*unit_base=*/kUnitsPerPhase);
}

absl::Status GlooCommunicator::RunBroadcast(const Operation& operation, Ring& ring) {
  if (operation.count == 0 || world_size_ == 1) return absl::OkStatus();
  return ring.Broadcast(operation.buffer, operation.count, ElementSize(operation.type),
                        operation.root);
}

absl::Status GlooCommunicator::RunBarrier(Ring& ring) {
  if (world_size_ == 1) return absl::OkStatus();
  return ring.Barrier();
}

}  // namespace zeroshard::comm

// GlooRing: pipelined ring collectives over a RingLink, for GlooCommunicator's communication
// thread.
#include "worker/comm/gloo_ring.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/status_macros.h"
#include "worker/comm/reduction.h"

namespace zeroshard::comm {

GlooRing::GlooRing(GlooRingEnvironment environment, uint32_t tag, uint64_t sequence,
                   absl::Time deadline)
    : environment_(std::move(environment)),
      rank_(environment_.rank),
      world_size_(environment_.world_size),
      next_(NextRank(environment_.rank, environment_.world_size)),
      previous_(PreviousRank(environment_.rank, environment_.world_size)),
      tag_(tag),
      sequence_(sequence),
      deadline_(deadline),
      link_(*environment_.link) {}

GlooRing::~GlooRing() = default;

absl::Status GlooRing::ReduceScatter(const Pieces& pieces, const char* input, char* work,
                                     char* output, ElementType type, ReduceOp op,
                                     uint64_t unit_base) {
  const size_t element_size = ElementSize(type);
  const int steps = world_size_ - 1;
  const Segments segments =
      PlanSegments(pieces.largest(), element_size, environment_.segment_bytes, steps);
  const int units = steps * segments.count;
  if (units == 0) return absl::OkStatus();
  // A link with a landing receives into a ring of `depth` staging segments; one without lends
  // its own memory, which the reduction reads directly.
  const bool landing = link_.needs_landing(previous_);
  const int depth = std::min(environment_.staging_segments, units);
  const size_t staging_bytes = segments.elements * element_size;
  std::vector<char>& staging = *environment_.staging;
  if (landing && staging.size() < depth * staging_bytes) staging.resize(depth * staging_bytes);
  auto stage = [&](int unit) {
    return landing ? staging.data() + (unit % depth) * staging_bytes : nullptr;
  };
  auto sent_piece = [&](int step) { return ReduceScatterSentPiece(rank_, step, world_size_); };
  auto received_piece = [&](int step) {
    return ReduceScatterReceivedPiece(rank_, step, world_size_);
  };
  auto post_receive = [&](int unit) {
    const Range range =
        SegmentOf(pieces, segments, received_piece(unit / segments.count), unit % segments.count);
    if (range.count == 0) return;
    link_.PostReceive(previous_, Slot(unit_base + unit), stage(unit), range.count * element_size);
  };
  auto send = [&](int step, int k) {
    const Range range = SegmentOf(pieces, segments, sent_piece(step), k);
    if (range.count == 0) return;
    const char* source = (step == 0 ? input : work) + range.offset * element_size;
    Send(next_, unit_base + step * segments.count + k, source, range.count * element_size);
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
      char* destination = step == steps - 1
                              ? output + (range.offset - pieces.begin[piece]) * element_size
                              : work + range.offset * element_size;
      const char* own = input + range.offset * element_size;
      // Element-wise, so reducing the message part by part gives the bits of one call.
      ZS_RETURN_IF_ERROR(link_.Receive(
          previous_, Slot(unit_base + unit), stage(unit), bytes, deadline_,
          [&](const char* data, size_t offset, size_t part) {
            ReduceElements(destination + offset, data, own + offset, part / element_size, type, op);
          }));
      environment_.bytes_received->fetch_add(static_cast<int64_t>(bytes),
                                             std::memory_order_relaxed);
    }
    if (unit + depth < units) post_receive(unit + depth);
    if (step + 1 < steps) send(step + 1, k);
  }
  return link_.WaitSends(deadline_);
}

absl::Status GlooRing::AllGather(const Pieces& pieces, char* buffer, size_t element_size,
                                 uint64_t unit_base) {
  const int steps = world_size_ - 1;
  const Segments segments =
      PlanSegments(pieces.largest(), element_size, environment_.segment_bytes, steps);
  const int units = steps * segments.count;
  if (units == 0) return absl::OkStatus();
  // Every receive is posted up front, straight into its place in the buffer.
  std::vector<Range> landing(units, Range{0, 0});
  for (int unit = 0; unit < units; ++unit) {
    const int piece = AllGatherReceivedPiece(rank_, unit / segments.count, world_size_);
    const Range range = SegmentOf(pieces, segments, piece, unit % segments.count);
    if (range.count == 0) continue;
    landing[unit] = Range{range.offset * element_size, range.count * element_size};
    link_.PostReceive(previous_, Slot(unit_base + unit), buffer + landing[unit].offset,
                      landing[unit].count);
  }
  for (int k = 0; k < segments.count; ++k) {
    const Range range = SegmentOf(pieces, segments, rank_, k);
    if (range.count == 0) continue;
    Send(next_, unit_base + k, buffer + range.offset * element_size, range.count * element_size);
  }
  for (int unit = 0; unit < units; ++unit) {
    if (landing[unit].count == 0) continue;
    char* place = buffer + landing[unit].offset;
    ZS_RETURN_IF_ERROR(ReceiveInto(previous_, unit_base + unit, place, landing[unit].count));
    if (unit / segments.count + 1 < steps) {
      Send(next_, unit_base + unit + segments.count, place, landing[unit].count);
    }
  }
  return link_.WaitSends(deadline_);
}

absl::Status GlooRing::Broadcast(char* buffer, size_t count, size_t element_size, int root) {
  const int position = ChainPosition(rank_, root, world_size_);
  const Pieces whole = EqualPieces(1, count);
  const Segments segments =
      PlanSegments(count, element_size, environment_.segment_bytes, /*steps=*/1);
  for (int k = 0; k < segments.count; ++k) {
    if (position == 0) continue;
    const Range range = SegmentOf(whole, segments, 0, k);
    link_.PostReceive(previous_, Slot(k), buffer + range.offset * element_size,
                      range.count * element_size);
  }
  for (int k = 0; k < segments.count; ++k) {
    const Range range = SegmentOf(whole, segments, 0, k);
    const size_t bytes = range.count * element_size;
    char* place = buffer + range.offset * element_size;
    if (position > 0) ZS_RETURN_IF_ERROR(ReceiveInto(previous_, k, place, bytes));
    if (position + 1 < world_size_) Send(next_, k, place, bytes);
  }
  return link_.WaitSends(deadline_);
}

absl::Status GlooRing::Barrier() {
  std::vector<char>& bytes = barrier_bytes_;
  bytes.assign(world_size_ + 1, 0);
  const char* outgoing = bytes.data() + world_size_;
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer != rank_) link_.PostReceive(peer, Slot(0), bytes.data() + peer, 1);
  }
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer != rank_) Send(peer, 0, outgoing, 1);
  }
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer != rank_) ZS_RETURN_IF_ERROR(ReceiveInto(peer, 0, bytes.data() + peer, 1));
  }
  return link_.WaitSends(deadline_);
}

void GlooRing::Send(int peer, uint64_t unit, const void* data, size_t bytes) {
  link_.Send(peer, Slot(unit), data, bytes);
  environment_.bytes_sent->fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
}

absl::Status GlooRing::ReceiveInto(int peer, uint64_t unit, char* landing, size_t bytes) {
  ZS_RETURN_IF_ERROR(link_.Receive(peer, Slot(unit), landing, bytes, deadline_,
                                   [&](const char* data, size_t offset, size_t part) {
                                     if (data != landing + offset) {
                                       std::memcpy(landing + offset, data, part);
                                     }
                                   }));
  environment_.bytes_received->fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace zeroshard::comm

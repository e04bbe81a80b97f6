// GlooRing: pipelined ring collectives over Gloo's unbound buffers, for GlooCommunicator's
// communication thread.
#include "worker/comm/gloo_ring.h"

#include <algorithm>
#include <utility>

#include "common/status_macros.h"
#include "gloo/context.h"
#include "gloo/transport/unbound_buffer.h"
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
      deadline_(deadline) {}

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
  const int depth = std::min(environment_.staging_segments, units);
  const size_t staging_bytes = segments.elements * element_size;
  std::vector<char>& staging = *environment_.staging;
  if (staging.size() < depth * staging_bytes) staging.resize(depth * staging_bytes);
  std::vector<gloo::transport::UnboundBuffer*> stage(depth);
  for (int i = 0; i < depth; ++i)
    stage[i] = RecvBuffer(staging.data() + i * staging_bytes, staging_bytes, previous_);
  auto sent_piece = [&](int step) { return ReduceScatterSentPiece(rank_, step, world_size_); };
  auto received_piece = [&](int step) {
    return ReduceScatterReceivedPiece(rank_, step, world_size_);
  };
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

absl::Status GlooRing::AllGather(const Pieces& pieces, char* buffer, size_t element_size,
                                 uint64_t unit_base) {
  const int steps = world_size_ - 1;
  const Segments segments =
      PlanSegments(pieces.largest(), element_size, environment_.segment_bytes, steps);
  const int units = steps * segments.count;
  if (units == 0) return absl::OkStatus();
  // Every receive is posted up front, straight into its place in the buffer.
  std::vector<gloo::transport::UnboundBuffer*> landing(units, nullptr);
  for (int unit = 0; unit < units; ++unit) {
    const int piece = AllGatherReceivedPiece(rank_, unit / segments.count, world_size_);
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

absl::Status GlooRing::Broadcast(char* buffer, size_t count, size_t element_size, int root) {
  const int position = ChainPosition(rank_, root, world_size_);
  const Pieces whole = EqualPieces(1, count);
  const Segments segments =
      PlanSegments(count, element_size, environment_.segment_bytes, /*steps=*/1);
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

absl::Status GlooRing::Barrier() {
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

gloo::transport::UnboundBuffer* GlooRing::Buffer(const void* data, size_t bytes, int lane) {
  buffers_.push_back(
      (*environment_.lanes)[lane]->createUnboundBuffer(const_cast<void*>(data), bytes));
  return buffers_.back().get();
}

gloo::transport::UnboundBuffer* GlooRing::SendBuffer(const void* data, size_t bytes) {
  return Buffer(data, bytes, LaneOf(rank_, static_cast<int>(environment_.lanes->size())));
}

gloo::transport::UnboundBuffer* GlooRing::RecvBuffer(void* data, size_t bytes, int peer) {
  return Buffer(data, bytes, LaneOf(peer, static_cast<int>(environment_.lanes->size())));
}

void GlooRing::Send(gloo::transport::UnboundBuffer* buffer, int peer, uint64_t unit) {
  buffer->send(peer, MakeSlot(tag_, sequence_, unit), 0, buffer->size);
  pending_sends_.push_back(buffer);
  environment_.bytes_sent->fetch_add(static_cast<int64_t>(buffer->size), std::memory_order_relaxed);
}

void GlooRing::Recv(gloo::transport::UnboundBuffer* buffer, int peer, uint64_t unit,
                    size_t offset_bytes, size_t bytes) {
  buffer->recv(peer, MakeSlot(tag_, sequence_, unit), offset_bytes, bytes);
}

void GlooRing::Recv(gloo::transport::UnboundBuffer* buffer, int peer, uint64_t unit) {
  Recv(buffer, peer, unit, 0, buffer->size);
}

absl::Status GlooRing::WaitRecv(gloo::transport::UnboundBuffer* buffer, size_t bytes) {
  ZS_RETURN_IF_ERROR(environment_.wait(buffer, /*receive=*/true, deadline_));
  environment_.bytes_received->fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status GlooRing::WaitSends() {
  for (gloo::transport::UnboundBuffer* buffer : pending_sends_) {
    ZS_RETURN_IF_ERROR(environment_.wait(buffer, /*receive=*/false, deadline_));
  }
  pending_sends_.clear();
  return absl::OkStatus();
}

}  // namespace zeroshard::comm

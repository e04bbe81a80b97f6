// GlooLink: ring messages as Gloo unbound-buffer sends and receives.
#include "worker/comm/gloo_link.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gloo/context.h"
#include "gloo/transport/unbound_buffer.h"
#include "worker/comm/ring_schedule.h"

namespace zeroshard::comm {

GlooLink::GlooLink(int rank, const std::vector<std::shared_ptr<gloo::Context>>* lanes, Wait wait)
    : rank_(rank), lanes_(lanes), wait_(std::move(wait)) {}

GlooLink::~GlooLink() = default;

gloo::transport::UnboundBuffer* GlooLink::Buffer(const void* data, size_t bytes, int lane) {
  buffers_.push_back((*lanes_)[lane]->createUnboundBuffer(const_cast<void*>(data), bytes));
  return buffers_.back().get();
}

void GlooLink::Send(int peer, uint64_t slot, const void* data, size_t bytes) {
  gloo::transport::UnboundBuffer* buffer =
      Buffer(data, bytes, LaneOf(rank_, static_cast<int>(lanes_->size())));
  buffer->send(peer, slot, 0, bytes);
  pending_sends_.push_back(buffer);
}

void GlooLink::PostReceive(int peer, uint64_t slot, void* landing, size_t bytes) {
  gloo::transport::UnboundBuffer* buffer =
      Buffer(landing, bytes, LaneOf(peer, static_cast<int>(lanes_->size())));
  buffer->recv(peer, slot, 0, bytes);
  receives_[{peer, slot}] = buffer;
}

absl::Status GlooLink::Receive(int peer, uint64_t slot, void* landing, size_t bytes,
                               absl::Time deadline, Consumer consume) {
  auto posted = receives_.find({peer, slot});
  if (posted == receives_.end()) {
    return absl::InternalError(
        absl::StrCat("receive of slot ", slot, " from rank ", peer, " was never posted"));
  }
  gloo::transport::UnboundBuffer* buffer = posted->second;
  receives_.erase(posted);
  ZS_RETURN_IF_ERROR(wait_(buffer, /*receive=*/true, deadline));
  consume(static_cast<const char*>(landing), 0, bytes);
  return absl::OkStatus();
}

absl::Status GlooLink::WaitSends(absl::Time deadline) {
  for (gloo::transport::UnboundBuffer* buffer : pending_sends_) {
    ZS_RETURN_IF_ERROR(wait_(buffer, /*receive=*/false, deadline));
  }
  pending_sends_.clear();
  return absl::OkStatus();
}

}  // namespace zeroshard::comm

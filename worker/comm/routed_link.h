// RoutedLink: the RingLink of a group that spans hosts: messages to and from the ranks this rank
// shares memory with travel over its ShmLink, the rest over TCP (a GlooLink).
#ifndef ZEROSHARD_WORKER_COMM_ROUTED_LINK_H_
#define ZEROSHARD_WORKER_COMM_ROUTED_LINK_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/comm/ring_link.h"
#include "worker/comm/shm_link.h"

namespace zeroshard::comm {

// Each peer's messages stay on one link, so the per-pair ordering RingLink promises holds. Waiting
// on TCP does not stall the shared-memory sends: a ShmLink that is not the whole group pushes
// them from its own thread.
//
// Thread contract: as RingLink's. Both links must outlive this one.
class RoutedLink : public RingLink {
 public:
  RoutedLink(ShmLink* shared_memory, RingLink* tcp) : shared_memory_(*shared_memory), tcp_(*tcp) {}

  RoutedLink(const RoutedLink&) = delete;
  RoutedLink& operator=(const RoutedLink&) = delete;

  bool needs_landing(int peer) const override { return Route(peer).needs_landing(peer); }
  void Send(int peer, uint64_t slot, const void* data, size_t bytes) override {
    Route(peer).Send(peer, slot, data, bytes);
  }
  void PostReceive(int peer, uint64_t slot, void* landing, size_t bytes) override {
    Route(peer).PostReceive(peer, slot, landing, bytes);
  }
  absl::Status Receive(int peer, uint64_t slot, void* landing, size_t bytes, absl::Time deadline,
                       Consumer consume) override {
    return Route(peer).Receive(peer, slot, landing, bytes, deadline, consume);
  }
  // TCP's first: the shared-memory sends keep moving meanwhile.
  absl::Status WaitSends(absl::Time deadline) override;

 private:
  RingLink& Route(int peer) const {
    return shared_memory_.reaches(peer) ? static_cast<RingLink&>(shared_memory_) : tcp_;
  }

  ShmLink& shared_memory_;
  RingLink& tcp_;
};

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_ROUTED_LINK_H_

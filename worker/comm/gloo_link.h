// GlooLink: the RingLink over Gloo's TCP pairs (unbound buffers on the communicator's lanes).
#ifndef ZEROSHARD_WORKER_COMM_GLOO_LINK_H_
#define ZEROSHARD_WORKER_COMM_GLOO_LINK_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/comm/ring_link.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace zeroshard::comm {

// One operation's messages over Gloo: each message gets an unbound buffer on a lane (a message
// from rank s travels on lanes[LaneOf(s)]); receives land in the caller's memory.
//
// Thread contract: as RingLink's; Gloo throws on transport errors, and the caller catches. The
// unbound buffers live as long as the GlooLink, so after a failure the caller must close the
// connections before destroying it (Gloo may still write into a receive buffer until then).
class GlooLink : public RingLink {
 public:
  // Blocks until `buffer`'s pending receive (`receive`) or send completes; an error status when
  // `deadline` passes or the communicator has failed or is aborted.
  using Wait = std::function<absl::Status(gloo::transport::UnboundBuffer* buffer, bool receive,
                                          absl::Time deadline)>;

  // `lanes` must outlive the link.
  GlooLink(int rank, const std::vector<std::shared_ptr<gloo::Context>>* lanes, Wait wait);
  ~GlooLink() override;

  GlooLink(const GlooLink&) = delete;
  GlooLink& operator=(const GlooLink&) = delete;

  bool needs_landing(int peer) const override { return true; }
  void Send(int peer, uint64_t slot, const void* data, size_t bytes) override;
  void PostReceive(int peer, uint64_t slot, void* landing, size_t bytes) override;
  absl::Status Receive(int peer, uint64_t slot, void* landing, size_t bytes, absl::Time deadline,
                       Consumer consume) override;
  absl::Status WaitSends(absl::Time deadline) override;

 private:
  // An unbound buffer on `lane`'s context.
  gloo::transport::UnboundBuffer* Buffer(const void* data, size_t bytes, int lane);

  const int rank_;
  const std::vector<std::shared_ptr<gloo::Context>>* const lanes_;
  const Wait wait_;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> buffers_;
  // Posted receives not yet received, by (peer, slot).
  std::map<std::pair<int, uint64_t>, gloo::transport::UnboundBuffer*> receives_;
  // One entry per send not yet waited for.
  std::vector<gloo::transport::UnboundBuffer*> pending_sends_;
};

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_GLOO_LINK_H_

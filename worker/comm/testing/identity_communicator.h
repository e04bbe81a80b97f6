// A communicator that moves no data, for tests of code above the Communicator seam: every
// in-place collective finishes at once and leaves its buffer as it is (exactly what a group of
// one rank does), so a W=1 engine runs for real; with another rank or world size it stands in
// where no collective runs (e.g. memory checks). Subclasses override the collectives they watch.
#ifndef ZEROSHARD_WORKER_COMM_TESTING_IDENTITY_COMMUNICATOR_H_
#define ZEROSHARD_WORKER_COMM_TESTING_IDENTITY_COMMUNICATOR_H_

#include <memory>

#include "worker/comm/communicator.h"

namespace zeroshard::comm::testing {

// Thread contract: stateless; safe from any thread (subclasses state their own).
class IdentityCommunicator : public Communicator {
 public:
  explicit IdentityCommunicator(int rank = 0, int world_size = 1)
      : rank_(rank), world_size_(world_size) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  // Out-of-place collectives would have to copy: UNIMPLEMENTED (the engine reduces in place).
  std::unique_ptr<Work> ReduceScatter(const void*, void*, size_t, ElementType, ReduceOp,
                                      const CollectiveOptions&) override;
  std::unique_ptr<Work> AllGather(const void*, void*, size_t, ElementType,
                                  const CollectiveOptions&) override;
  // In place: finished, OK, the buffer unchanged.
  std::unique_ptr<Work> ReduceScatterInPlace(void*, size_t, ElementType, ReduceOp,
                                             const CollectiveOptions&) override;
  std::unique_ptr<Work> AllGatherInPlace(void*, size_t, ElementType,
                                         const CollectiveOptions&) override;
  std::unique_ptr<Work> AllReduce(void*, size_t, ElementType, ReduceOp,
                                  const CollectiveOptions&) override;
  std::unique_ptr<Work> Broadcast(void*, size_t, ElementType, int,
                                  const CollectiveOptions&) override;
  std::unique_ptr<Work> Barrier(const CollectiveOptions&) override;
  void Abort() override {}
  CommunicatorStats stats() const override { return {}; }

 private:
  const int rank_;
  const int world_size_;
};

}  // namespace zeroshard::comm::testing

#endif  // ZEROSHARD_WORKER_COMM_TESTING_IDENTITY_COMMUNICATOR_H_

// IdentityCommunicator: collectives that finish at once and move nothing.
#include "worker/comm/testing/identity_communicator.h"

#include "absl/status/status.h"

namespace zeroshard::comm::testing {

std::unique_ptr<Work> IdentityCommunicator::ReduceScatter(const void*, void*, size_t, ElementType,
                                                          ReduceOp, const CollectiveOptions&) {
  return MakeFinishedWork(absl::UnimplementedError("IdentityCommunicator: out of place"));
}

std::unique_ptr<Work> IdentityCommunicator::AllGather(const void*, void*, size_t, ElementType,
                                                      const CollectiveOptions&) {
  return MakeFinishedWork(absl::UnimplementedError("IdentityCommunicator: out of place"));
}

std::unique_ptr<Work> IdentityCommunicator::ReduceScatterInPlace(void*, size_t, ElementType,
                                                                 ReduceOp,
                                                                 const CollectiveOptions&) {
  return MakeFinishedWork(absl::OkStatus());
}

std::unique_ptr<Work> IdentityCommunicator::AllGatherInPlace(void*, size_t, ElementType,
                                                             const CollectiveOptions&) {
  return MakeFinishedWork(absl::OkStatus());
}

std::unique_ptr<Work> IdentityCommunicator::AllReduce(void*, size_t, ElementType, ReduceOp,
                                                      const CollectiveOptions&) {
  return MakeFinishedWork(absl::OkStatus());
}

std::unique_ptr<Work> IdentityCommunicator::Broadcast(void*, size_t, ElementType, int,
                                                      const CollectiveOptions&) {
  return MakeFinishedWork(absl::OkStatus());
}

std::unique_ptr<Work> IdentityCommunicator::Barrier(const CollectiveOptions&) {
  return MakeFinishedWork(absl::OkStatus());
}

}  // namespace zeroshard::comm::testing

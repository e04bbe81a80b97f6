// RoutedLink: waiting for the sends of both links.
#include "worker/comm/routed_link.h"

#include "common/status_macros.h"

namespace zeroshard::comm {

absl::Status RoutedLink::WaitSends(absl::Time deadline) {
  ZS_RETURN_IF_ERROR(tcp_.WaitSends(deadline));
  return shared_memory_.WaitSends(deadline);
}

}  // namespace zeroshard::comm

// The segment-by-segment copy of a whole gradient into a GradientSink.
#include "worker/workloads/workload.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zeroshard::workloads {

absl::Status CopyGradientToSink(GradientSink& sink, int64_t tensor,
                                absl::Span<const float> gradient) {
  const int64_t size = static_cast<int64_t>(gradient.size());
  for (int64_t begin = 0; begin < size;) {
    const int64_t end = sink.GradSegmentEnd(tensor, begin);
    if (end <= begin || end > size) {
      return absl::InvalidArgumentError(absl::StrCat("gradient: tensor ", tensor, " has ", size,
                                                     " elements, but its segment at ", begin,
                                                     " ends at ", end));
    }
    ZS_ASSIGN_OR_RETURN(absl::Span<float> out, sink.GradBuffer(tensor, begin, end));
    std::copy(gradient.begin() + begin, gradient.begin() + end, out.begin());
    ZS_RETURN_IF_ERROR(sink.GradWritten(tensor, begin, end));
    begin = end;
  }
  return absl::OkStatus();
}

}  // namespace zeroshard::workloads

// The segment-by-segment copy of a whole gradient into a GradientSink.
#include "worker/workloads/workload.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace zeroshard::workloads {

absl::Status ForEachGradSegment(
    GradientSink& sink, int64_t tensor, int64_t elements,
    absl::FunctionRef<absl::Status(int64_t begin, int64_t end, absl::Span<float> out)> write) {
  for (int64_t begin = 0; begin < elements;) {
    const int64_t end = sink.GradSegmentEnd(tensor, begin);
    if (end <= begin || end > elements) {
      return absl::InvalidArgumentError(absl::StrCat("gradient: tensor ", tensor, " has ", elements,
                                                     " elements, but its segment at ", begin,
                                                     " ends at ", end));
    }
    ZS_ASSIGN_OR_RETURN(absl::Span<float> out, sink.GradBuffer(tensor, begin, end));
    ZS_RETURN_IF_ERROR(write(begin, end, out));
    ZS_RETURN_IF_ERROR(sink.GradWritten(tensor, begin, end));
    begin = end;
  }
  return absl::OkStatus();
}

absl::Status CopyGradientToSink(GradientSink& sink, int64_t tensor,
                                absl::Span<const float> gradient) {
  return ForEachGradSegment(sink, tensor, static_cast<int64_t>(gradient.size()),
                            [&](int64_t begin, int64_t end, absl::Span<float> out) {
                              std::copy(gradient.begin() + begin, gradient.begin() + end,
                                        out.begin());
                              return absl::OkStatus();
                            });
}

}  // namespace zeroshard::workloads

// The segment-by-segment copy of a whole gradient into a GradientSink, and the widening of
// stored parameters to fp32.
#include "worker/workloads/workload.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/dcheck.h"
#include "common/status_macros.h"

namespace zeroshard::workloads {

absl::StatusOr<std::optional<absl::Span<float>>> GradientSink::TryGradBuffer(int64_t tensor,
                                                                             int64_t begin,
                                                                             int64_t end) {
  ZS_ASSIGN_OR_RETURN(absl::Span<float> buffer, GradBuffer(tensor, begin, end));
  return std::optional<absl::Span<float>>(buffer);
}

absl::Status GradientSink::EndMicroBatch() {
  return absl::UnimplementedError("this gradient sink does not reduce micro-batches one by one");
}

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

void WidenParameters(const StoredParameters& params, int64_t begin, int64_t count, float* out) {
  ZS_DCHECK(begin >= 0 && count >= 0 && begin + count <= params.size)
      << "[" << begin << ", " << begin + count << ") of " << params.size << " elements";
  switch (params.dtype) {
    case numerics::DType::kFloat32:
      std::memcpy(out, static_cast<const float*>(params.data) + begin, count * sizeof(float));
      return;
    case numerics::DType::kBFloat16: {
      const uint16_t* in = static_cast<const uint16_t*>(params.data) + begin;
      for (int64_t k = 0; k < count; ++k) out[k] = numerics::BFloat16ToFloat(in[k]);
      return;
    }
    case numerics::DType::kFloat16: {
      const uint16_t* in = static_cast<const uint16_t*>(params.data) + begin;
      for (int64_t k = 0; k < count; ++k) out[k] = numerics::HalfToFloat(in[k]);
      return;
    }
  }
  ZS_DCHECK(false) << "invalid dtype " << static_cast<int>(params.dtype);
}

}  // namespace zeroshard::workloads

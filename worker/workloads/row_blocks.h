// How a segment of a row-major matrix's flat elements splits into whole rows and cut rows, so a
// backward that writes a weight gradient segment by segment can compute whole rows in place and
// cut rows through a one-row scratch (CPU and CUDA MLPs alike).
#ifndef ZEROSHARD_WORKER_WORKLOADS_ROW_BLOCKS_H_
#define ZEROSHARD_WORKER_WORKLOADS_ROW_BLOCKS_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/status_macros.h"

namespace zeroshard::workloads {

// Calls, in flat order, for the elements [begin, end) of a matrix with `row_length` elements
// per row:
//  - cut_row(row, from, to, offset) for a row only partly inside: its elements [from, to) (flat)
//    belong at `offset` of the segment;
//  - whole_rows(first_row, rows, offset) for the rows entirely inside, at `offset`.
// Stops at the first error. REQUIRES: 0 <= begin < end, row_length >= 1.
inline absl::Status ForEachRowBlock(
    int64_t begin, int64_t end, int64_t row_length,
    absl::FunctionRef<absl::Status(int64_t row, int64_t from, int64_t to, int64_t offset)> cut_row,
    absl::FunctionRef<absl::Status(int64_t first_row, int64_t rows, int64_t offset)> whole_rows) {
  const int64_t first_whole = (begin + row_length - 1) / row_length;  // first row starting inside
  const int64_t end_whole = end / row_length;                         // rows before it end inside
  if (first_whole > end_whole) return cut_row(begin / row_length, begin, end, 0);  // one row
  if (begin < first_whole * row_length) {
    ZS_RETURN_IF_ERROR(cut_row(first_whole - 1, begin, first_whole * row_length, 0));
  }
  if (end_whole > first_whole) {
    ZS_RETURN_IF_ERROR(
        whole_rows(first_whole, end_whole - first_whole, first_whole * row_length - begin));
  }
  if (end > end_whole * row_length) {
    return cut_row(end_whole, end_whole * row_length, end, end_whole * row_length - begin);
  }
  return absl::OkStatus();
}

}  // namespace zeroshard::workloads

#endif  // ZEROSHARD_WORKER_WORKLOADS_ROW_BLOCKS_H_

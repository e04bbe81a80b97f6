// Collective checks: inputs from a counter-based hash, an element-by-element reference written
// independently of the backend's reduction loops, and byte-exact comparisons.
#include "worker/comm/collective_checks.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "numerics/dtype.h"

namespace zeroshard::comm {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A float in about [-2^10, 2^10] with a random 24-bit significand and a random exponent.
double SpreadValue(uint64_t bits) {
  const double significand = static_cast<double>(bits & 0xffffff) / double{1 << 24} + 1.0;
  const int exponent = static_cast<int>((bits >> 24) % 21) - 10;
  const double sign = ((bits >> 40) & 1) != 0 ? -1.0 : 1.0;
  return sign * std::ldexp(significand, exponent);
}

template <typename T>
T Load(const char* data, size_t index) {
  T value;
  std::memcpy(&value, data + index * sizeof(T), sizeof(T));
  return value;
}

template <typename T>
void Store(char* data, size_t index, T value) {
  std::memcpy(data + index * sizeof(T), &value, sizeof(T));
}

template <typename T>
T FloatCombine(T a, T b, ReduceOp op) {
  if (op == ReduceOp::kSum) return a + b;
  if (std::isnan(a) || std::isnan(b)) return a + b;
  return a < b ? b : a;
}

// received (op) own for element `index`, written to `out`.
void CombineElement(ElementType type, ReduceOp op, const char* received, const char* own, char* out,
                    size_t index) {
  switch (type) {
    case ElementType::kFloat64:
      Store(out, index, FloatCombine(Load<double>(received, index), Load<double>(own, index), op));
      return;
    case ElementType::kFloat32:
      Store(out, index, FloatCombine(Load<float>(received, index), Load<float>(own, index), op));
      return;
    case ElementType::kBFloat16: {
      const float a = numerics::BFloat16ToFloat(Load<uint16_t>(received, index));
      const float b = numerics::BFloat16ToFloat(Load<uint16_t>(own, index));
      Store(out, index, numerics::FloatToBFloat16(FloatCombine(a, b, op)));
      return;
    }
    case ElementType::kFloat16: {
      const float a = numerics::HalfToFloat(Load<uint16_t>(received, index));
      const float b = numerics::HalfToFloat(Load<uint16_t>(own, index));
      Store(out, index, numerics::FloatToHalf(FloatCombine(a, b, op)));
      return;
    }
    case ElementType::kInt32: {
      const int32_t a = Load<int32_t>(received, index);
      const int32_t b = Load<int32_t>(own, index);
      const int32_t sum = static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
      Store(out, index, op == ReduceOp::kSum ? sum : (a < b ? b : a));
      return;
    }
    case ElementType::kInt64: {
      const int64_t a = Load<int64_t>(received, index);
      const int64_t b = Load<int64_t>(own, index);
      const int64_t sum = static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
      Store(out, index, op == ReduceOp::kSum ? sum : (a < b ? b : a));
      return;
    }
  }
}

std::vector<size_t> EqualPieceBegins(int world_size, size_t piece_count) {
  std::vector<size_t> begin;
  for (int p = 0; p <= world_size; ++p) begin.push_back(p * piece_count);
  return begin;
}

std::vector<size_t> BalancedPieceBegins(int world_size, size_t count) {
  std::vector<size_t> begin;
  size_t offset = 0;
  for (int p = 0; p < world_size; ++p) {
    begin.push_back(offset);
    offset += count / world_size + (static_cast<size_t>(p) < count % world_size ? 1 : 0);
  }
  begin.push_back(offset);
  return begin;
}

absl::Status CompareBytes(const char* what, const char* actual, const char* expected, size_t count,
                          ElementType type) {
  const size_t size = ElementSize(type);
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(actual + i * size, expected + i * size, size) != 0) {
      return absl::InternalError(absl::StrCat(what, ": element ", i, " of ", count, " (",
                                              ElementTypeName(type),
                                              ") differs from the reference"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::vector<char>> AllInputs(ElementType type, int world_size, size_t count,
                                         uint64_t seed) {
  std::vector<std::vector<char>> inputs;
  for (int r = 0; r < world_size; ++r) inputs.push_back(MakeInput(type, r, count, seed));
  return inputs;
}

absl::Status Run(std::unique_ptr<Work> work, const char* what, absl::Duration timeout) {
  absl::Status status = work->Wait(timeout);
  if (!status.ok()) return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
  return absl::OkStatus();
}

}  // namespace

std::vector<char> MakeInput(ElementType type, int rank, size_t count, uint64_t seed) {
  const size_t size = ElementSize(type);
  std::vector<char> data(count * size);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t bits = SplitMix64(SplitMix64(seed * 1000003 + rank) ^ i);
    switch (type) {
      case ElementType::kFloat64:
        Store(data.data(), i, SpreadValue(bits) + std::ldexp(static_cast<double>(bits >> 44), -40));
        break;
      case ElementType::kFloat32:
        Store(data.data(), i, static_cast<float>(SpreadValue(bits)));
        break;
      case ElementType::kBFloat16:
        Store(data.data(), i, numerics::FloatToBFloat16(static_cast<float>(SpreadValue(bits))));
        break;
      case ElementType::kFloat16:
        Store(data.data(), i, numerics::FloatToHalf(static_cast<float>(SpreadValue(bits))));
        break;
      case ElementType::kInt32:
        Store(data.data(), i, static_cast<int32_t>(bits));
        break;
      case ElementType::kInt64:
        Store(data.data(), i, static_cast<int64_t>(bits));
        break;
    }
  }
  return data;
}

std::vector<char> ReferenceReduce(const std::vector<std::vector<char>>& inputs, ElementType type,
                                  ReduceOp op, const std::vector<size_t>& piece_begin) {
  const int world_size = static_cast<int>(inputs.size());
  const size_t size = ElementSize(type);
  std::vector<char> result(inputs[0].size());
  for (int p = 0; p < world_size; ++p) {
    for (size_t i = piece_begin[p]; i < piece_begin[p + 1]; ++i) {
      char accumulator[sizeof(int64_t)];
      std::memcpy(accumulator, inputs[(p + 1) % world_size].data() + i * size, size);
      for (int j = 2; j <= world_size; ++j) {
        const char* own = inputs[(p + j) % world_size].data() + i * size;
        CombineElement(type, op, accumulator, own, accumulator, 0);
      }
      std::memcpy(result.data() + i * size, accumulator, size);
    }
  }
  return result;
}

namespace {

absl::Status CheckAll(Communicator& communicator, size_t piece_count, ElementType type,
                      uint64_t seed, absl::Duration timeout) {
  const int world_size = communicator.world_size();
  const int rank = communicator.rank();
  const size_t size = ElementSize(type);
  const size_t bucket = piece_count * world_size;
  CollectiveOptions options;
  options.timeout = timeout;

  // Reduce-scatter, in place and out of place, against the reference.
  const std::vector<std::vector<char>> contributions = AllInputs(type, world_size, bucket, seed);
  const std::vector<char> reduced = ReferenceReduce(contributions, type, ReduceOp::kSum,
                                                    EqualPieceBegins(world_size, piece_count));
  const char* expected_piece = reduced.data() + rank * piece_count * size;
  std::vector<char> in_place = contributions[rank];
  ZS_RETURN_IF_ERROR(Run(communicator.ReduceScatterInPlace(in_place.data(), piece_count, type,
                                                           ReduceOp::kSum, options),
                         "reduce-scatter in place", timeout));
  ZS_RETURN_IF_ERROR(CompareBytes("reduce-scatter in place",
                                  in_place.data() + rank * piece_count * size, expected_piece,
                                  piece_count, type));
  std::vector<char> piece(piece_count * size);
  ZS_RETURN_IF_ERROR(Run(communicator.ReduceScatter(contributions[rank].data(), piece.data(),
                                                    piece_count, type, ReduceOp::kSum, options),
                         "reduce-scatter", timeout));
  ZS_RETURN_IF_ERROR(
      CompareBytes("reduce-scatter", piece.data(), expected_piece, piece_count, type));

  // ddp's all-reduce of the same bucket: the same bits for every piece as the reduce-scatter.
  std::vector<char> all_reduced = contributions[rank];
  ZS_RETURN_IF_ERROR(
      Run(communicator.AllReduce(all_reduced.data(), bucket, type, ReduceOp::kSum, options),
          "all-reduce of the bucket", timeout));
  ZS_RETURN_IF_ERROR(
      CompareBytes("all-reduce of the bucket", all_reduced.data(), reduced.data(), bucket, type));
  ZS_RETURN_IF_ERROR(CompareBytes("all-reduce piece vs reduce-scatter piece",
                                  all_reduced.data() + rank * piece_count * size, piece.data(),
                                  piece_count, type));
  // A second run gives the same bits.
  std::vector<char> again = contributions[rank];
  ZS_RETURN_IF_ERROR(
      Run(communicator.AllReduce(again.data(), bucket, type, ReduceOp::kSum, options),
          "all-reduce rerun", timeout));
  ZS_RETURN_IF_ERROR(
      CompareBytes("all-reduce rerun", again.data(), all_reduced.data(), bucket, type));

  // All-gather, in place and out of place.
  const std::vector<std::vector<char>> gathered_pieces =
      AllInputs(type, world_size, piece_count, seed + 1);
  std::vector<char> gathered_expected;
  for (const std::vector<char>& p : gathered_pieces) {
    gathered_expected.insert(gathered_expected.end(), p.begin(), p.end());
  }
  std::vector<char> gather_buffer(bucket * size, 0);
  if (piece_count > 0) {
    std::memcpy(gather_buffer.data() + rank * piece_count * size, gathered_pieces[rank].data(),
                piece_count * size);
  }
  ZS_RETURN_IF_ERROR(
      Run(communicator.AllGatherInPlace(gather_buffer.data(), piece_count, type, options),
          "all-gather in place", timeout));
  ZS_RETURN_IF_ERROR(CompareBytes("all-gather in place", gather_buffer.data(),
                                  gathered_expected.data(), bucket, type));
  std::vector<char> gather_output(bucket * size, 0);
  ZS_RETURN_IF_ERROR(Run(communicator.AllGather(gathered_pieces[rank].data(), gather_output.data(),
                                                piece_count, type, options),
                         "all-gather", timeout));
  ZS_RETURN_IF_ERROR(
      CompareBytes("all-gather", gather_output.data(), gathered_expected.data(), bucket, type));

  // All-reduce sum and max over a count W does not divide.
  const size_t odd_count = bucket + 1 + (world_size > 1 ? 1 : 0);
  const std::vector<std::vector<char>> odd_inputs =
      AllInputs(type, world_size, odd_count, seed + 2);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
    const std::vector<char> expected =
        ReferenceReduce(odd_inputs, type, op, BalancedPieceBegins(world_size, odd_count));
    std::vector<char> buffer = odd_inputs[rank];
    const char* what = op == ReduceOp::kSum ? "all-reduce sum (odd count)" : "all-reduce max";
    ZS_RETURN_IF_ERROR(
        Run(communicator.AllReduce(buffer.data(), odd_count, type, op, options), what, timeout));
    ZS_RETURN_IF_ERROR(CompareBytes(what, buffer.data(), expected.data(), odd_count, type));
  }

  // Broadcast from the last rank and from rank 0.
  for (int root : {world_size - 1, 0}) {
    const std::vector<char> source = MakeInput(type, root, bucket + 1, seed + 3);
    std::vector<char> buffer = rank == root ? source : std::vector<char>(source.size(), 0);
    ZS_RETURN_IF_ERROR(Run(communicator.Broadcast(buffer.data(), bucket + 1, type, root, options),
                           "broadcast", timeout));
    ZS_RETURN_IF_ERROR(CompareBytes("broadcast", buffer.data(), source.data(), bucket + 1, type));
  }

  return Run(communicator.Barrier(options), "barrier", timeout);
}

}  // namespace

absl::Status CheckAllCollectives(Communicator& communicator, size_t piece_count, ElementType type,
                                 uint64_t seed, absl::Duration timeout) {
  absl::Status status = CheckAll(communicator, piece_count, type, seed, timeout);
  // A rank that stops early would leave its peers waiting for their timeouts; ending the
  // communicator makes them fail at once.
  if (!status.ok()) communicator.Abort();
  return status;
}

}  // namespace zeroshard::comm

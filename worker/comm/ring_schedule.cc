// The Gloo rings' slot, lane, piece and segment arithmetic (see ring_schedule.h).
#include "worker/comm/ring_schedule.h"

#include <algorithm>

namespace zeroshard::comm {

uint64_t MakeSlot(uint32_t tag, uint64_t sequence, uint64_t unit) {
  const uint64_t tag_bits = tag & ((uint64_t{1} << (64 - kUnitBits - kSequenceBits)) - 1);
  const uint64_t sequence_bits = sequence & ((uint64_t{1} << kSequenceBits) - 1);
  return (tag_bits << (kUnitBits + kSequenceBits)) | (sequence_bits << kUnitBits) | unit;
}

int Mod(int value, int modulus) { return ((value % modulus) + modulus) % modulus; }

int LaneOf(int sender, int lanes) { return sender % lanes; }

int NextRank(int rank, int world_size) { return (rank + 1) % world_size; }

int PreviousRank(int rank, int world_size) { return Mod(rank - 1, world_size); }

int ReduceScatterSentPiece(int rank, int step, int world_size) {
  return Mod(rank - 1 - step, world_size);
}

int ReduceScatterReceivedPiece(int rank, int step, int world_size) {
  return Mod(rank - 2 - step, world_size);
}

int AllGatherReceivedPiece(int rank, int step, int world_size) {
  return Mod(rank - 1 - step, world_size);
}

int ChainPosition(int rank, int root, int world_size) { return Mod(rank - root, world_size); }

size_t Pieces::size(int piece) const { return begin[piece + 1] - begin[piece]; }

size_t Pieces::largest() const {
  size_t largest = 0;
  for (size_t p = 0; p + 1 < begin.size(); ++p) largest = std::max(largest, size(p));
  return largest;
}

Pieces EqualPieces(int world_size, size_t piece_count) {
  Pieces pieces;
  for (int p = 0; p <= world_size; ++p) pieces.begin.push_back(p * piece_count);
  return pieces;
}

Pieces BalancedPieces(int world_size, size_t count) {
  Pieces pieces;
  const size_t base = count / world_size;
  const size_t larger = count % world_size;
  size_t offset = 0;
  for (int p = 0; p < world_size; ++p) {
    pieces.begin.push_back(offset);
    offset += base + (static_cast<size_t>(p) < larger ? 1 : 0);
  }
  pieces.begin.push_back(offset);
  return pieces;
}

Segments PlanSegments(size_t largest_piece, size_t element_size, size_t segment_bytes, int steps) {
  Segments segments;
  if (largest_piece == 0) return segments;
  segments.elements = std::max<size_t>(1, segment_bytes / element_size);
  size_t count = (largest_piece + segments.elements - 1) / segments.elements;
  const size_t max_count = (kUnitsPerPhase - 1) / std::max(1, steps);
  if (count > max_count) {
    count = max_count;
    segments.elements = (largest_piece + count - 1) / count;
    count = (largest_piece + segments.elements - 1) / segments.elements;
  }
  segments.count = static_cast<int>(count);
  return segments;
}

Range SegmentOf(const Pieces& pieces, const Segments& segments, int piece, int k) {
  const size_t size = pieces.size(piece);
  const size_t start = std::min(size, static_cast<size_t>(k) * segments.elements);
  const size_t end = std::min(size, start + segments.elements);
  return Range{pieces.begin[piece] + start, end - start};
}

}  // namespace zeroshard::comm

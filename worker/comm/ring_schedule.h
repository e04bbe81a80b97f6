// The arithmetic of the Gloo rings, apart from any transport: message slots, transport lanes, ring
// neighbours and per-step pieces, and how a buffer is cut into pieces and pipeline segments.
#ifndef ZEROSHARD_WORKER_COMM_RING_SCHEDULE_H_
#define ZEROSHARD_WORKER_COMM_RING_SCHEDULE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zeroshard::comm {

// Everything here is a pure function of its arguments (thread-compatible).

// A message's Gloo slot: tag (low 20 bits) | operation sequence (low 24 bits) | unit (20 bits).
// A unit is one (phase, step, segment) of one operation; slots only need to be distinct among
// messages in flight at the same time, and operations run one after another.
constexpr int kUnitBits = 20;
constexpr int kSequenceBits = 24;
// An operation has two phases (AllReduce's reduce-scatter, then its all-gather); phase i uses
// units [i * kUnitsPerPhase, (i + 1) * kUnitsPerPhase).
constexpr uint64_t kUnitsPerPhase = uint64_t{1} << (kUnitBits - 1);

// `unit` must be below 2 * kUnitsPerPhase; tag and sequence keep only their low bits.
uint64_t MakeSlot(uint32_t tag, uint64_t sequence, uint64_t unit);

// `value` modulo `modulus` (> 0), in [0, modulus) also for negative values.
int Mod(int value, int modulus);

// Transport lanes: every rank has `lanes` Gloo contexts (each a full mesh of TCP connections with
// its own event-loop thread), and a message from rank s travels on lane s % lanes. With the
// default two, a ring's neighbours differ in parity (except at the wrap of an odd ring), so each
// rank's outgoing and incoming ring traffic are served by different event-loop threads: with one
// context, that one thread copies every byte in and out of the sockets (at W = 2 both directions
// share a socket).
constexpr int kDefaultLanes = 2;
constexpr int kMaxLanes = 8;

// The lane of every message `sender` sends, with `lanes` (>= 1) lanes.
int LaneOf(int sender, int lanes);

// Ring neighbours (W = world_size): data flows PreviousRank(r) -> r -> NextRank(r).
int NextRank(int rank, int world_size);
int PreviousRank(int rank, int world_size);

// Reduce-scatter step `step` (0..W-2) at `rank`: it sends its partial sum of piece r-1-step and
// receives piece r-2-step, to which it adds its own contribution. Piece p therefore starts at
// rank p+1 and ends, fully reduced, at rank p.
int ReduceScatterSentPiece(int rank, int step, int world_size);
int ReduceScatterReceivedPiece(int rank, int step, int world_size);

// All-gather step `step` (0..W-2) at `rank`: it receives piece r-1-step (and forwards it at the
// next step); at step 0 it sends its own piece r.
int AllGatherReceivedPiece(int rank, int step, int world_size);

// Place of `rank` in the broadcast chain root, root+1, ..., root-1 (the root is 0).
int ChainPosition(int rank, int root, int world_size);

// Element ranges of the W pieces of a buffer: piece p is [begin[p], begin[p + 1]).
struct Pieces {
  std::vector<size_t> begin;
  size_t size(int piece) const;
  // The size of the largest piece (0 when there are none).
  size_t largest() const;
};

// `world_size` pieces of `piece_count` elements each.
Pieces EqualPieces(int world_size, size_t piece_count);

// `world_size` pieces covering `count` elements: sizes differ by at most one element; the first
// count % W pieces are the larger ones.
Pieces BalancedPieces(int world_size, size_t count);

// How a piece of up to `largest_piece` elements is cut into segments: segment k of a piece is
// elements [k * elements, min(piece size, (k + 1) * elements)), possibly empty for smaller pieces.
struct Segments {
  size_t elements = 1;
  int count = 0;
};

// Segments of at most `segment_bytes` (at least one element each) for a ring of `steps` steps,
// except that steps * count stays below kUnitsPerPhase (every unit of a phase needs its own slot):
// pieces too large for that get fewer, larger segments. No segments for an empty piece.
Segments PlanSegments(size_t largest_piece, size_t element_size, size_t segment_bytes, int steps);

// An element range: [offset, offset + count).
struct Range {
  size_t offset;
  size_t count;
};

// Element range of segment k of piece p (empty past the end of a smaller piece).
Range SegmentOf(const Pieces& pieces, const Segments& segments, int piece, int k);

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_RING_SCHEDULE_H_

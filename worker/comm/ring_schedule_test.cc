// ring_schedule without any transport: expected values are worked out by hand in each test. The
// branches of ring_schedule.cc and the TEST that takes each:
// - Pieces::largest, no pieces (loop not entered): PiecesTest.LargestOfNoPiecesIsZero.
// - Pieces::largest, max kept / replaced: PiecesTest.LargestIsTheLargestWhereverItIs.
// - BalancedPieces, p < count % W true and false: BalancedPiecesTest.UnevenCountPutsExtrasFirst.
// - BalancedPieces, p < count % W never true: BalancedPiecesTest.EvenCountGivesEqualPieces.
// - PlanSegments, empty piece (early return): PlanSegmentsTest.EmptyPieceHasNoSegments.
// - PlanSegments, segment_bytes / element_size >= 1 and no clamp:
//   PlanSegmentsTest.SegmentsHoldSegmentBytes.
// - PlanSegments, segment_bytes below one element (max gives 1):
//   PlanSegmentsTest.SegmentBytesBelowOneElementGiveOneElementSegments.
// - PlanSegments, count > max_count (the kUnitsPerPhase clamp):
//   PlanSegmentsTest.ClampAtUnitsPerPhaseGivesFewerLargerSegments (and ...Boundary).
// - PlanSegments, count == max_count (not clamped): PlanSegmentsTest.ClampAtUnitsPerPhaseBoundary.
// - PlanSegments, steps == 0 (max(1, steps) gives 1): PlanSegmentsTest.ZeroStepsClampLikeOneStep.
// - SegmentOf, full segment / trailing partial segment (end clamped to the piece):
//   SegmentOfTest.FullAndTrailingPartialSegments.
// - SegmentOf, segment past the end of a smaller piece (start clamped, empty):
//   SegmentOfTest.SegmentPastTheEndOfASmallerPieceIsEmpty.
// MakeSlot, Mod, LaneOf, the ring neighbours, the per-step pieces, ChainPosition and EqualPieces
// have no branches; MakeSlotTest.*, ModTest.*, LaneTest.*, RingNeighboursTest.*,
// ReduceScatterScheduleTest.*, AllGatherScheduleTest.*, ChainPositionTest.* and EqualPiecesTest.*
// check their values.
#include "worker/comm/ring_schedule.h"

#include <cstdint>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace zeroshard::comm {
namespace {

using Begins = std::vector<size_t>;

// Field extraction written independently of MakeSlot: tag above bit 44, sequence in bits 20..43,
// unit in bits 0..19.
uint64_t TagOf(uint64_t slot) { return slot >> 44; }
uint64_t SequenceOf(uint64_t slot) { return (slot >> 20) & 0xFFFFFF; }
uint64_t UnitOf(uint64_t slot) { return slot & 0xFFFFF; }

TEST(MakeSlotTest, PacksTagSequenceAndUnitIntoTheirFields) {
  EXPECT_EQ(kUnitsPerPhase, uint64_t{524288});
  EXPECT_EQ(MakeSlot(0, 0, 0), uint64_t{0});
  EXPECT_EQ(MakeSlot(0, 0, 1), uint64_t{1});
  EXPECT_EQ(MakeSlot(0, 1, 0), uint64_t{0x100000});
  EXPECT_EQ(MakeSlot(1, 0, 0), uint64_t{0x100000000000});
  // 5 hex digits of tag, 6 of sequence, 5 of unit.
  EXPECT_EQ(MakeSlot(0x12345, 0xABCDEF, 0x6789A), uint64_t{0x12345ABCDEF6789A});
  // The all-gather phase's last unit still fits the unit field.
  EXPECT_EQ(MakeSlot(0, 0, 2 * kUnitsPerPhase - 1), uint64_t{0xFFFFF});
}

TEST(MakeSlotTest, KeepsOnlyTheLowBitsOfTagAndSequence) {
  EXPECT_EQ(MakeSlot(0xFFFFFFFF, 0, 0), uint64_t{0xFFFFF00000000000});
  EXPECT_EQ(MakeSlot(0, ~uint64_t{0}, 0), uint64_t{0x00000FFFFFF00000});
  EXPECT_EQ(MakeSlot(0x100007, 5, 9), MakeSlot(7, 5, 9));
  EXPECT_EQ(MakeSlot(7, (uint64_t{1} << 24) + 5, 9), MakeSlot(7, 5, 9));
}

TEST(MakeSlotTest, DistinctTagSequenceUnitGiveDistinctSlots) {
  const uint32_t tags[] = {0, 1, 2, 0xFFFFF};
  const uint64_t sequences[] = {0, 1, 2, 0xFFFFFF};
  const uint64_t units[] = {0, 1, kUnitsPerPhase - 1, kUnitsPerPhase, 2 * kUnitsPerPhase - 1};
  std::set<uint64_t> slots;
  for (uint32_t tag : tags) {
    for (uint64_t sequence : sequences) {
      for (uint64_t unit : units) {
        const uint64_t slot = MakeSlot(tag, sequence, unit);
        EXPECT_EQ(TagOf(slot), tag);
        EXPECT_EQ(SequenceOf(slot), sequence);
        EXPECT_EQ(UnitOf(slot), unit);
        slots.insert(slot);
      }
    }
  }
  EXPECT_EQ(slots.size(), size_t{4 * 4 * 5});
}

TEST(ModTest, WrapsNegativeValuesIntoRange) {
  EXPECT_EQ(Mod(7, 5), 2);
  EXPECT_EQ(Mod(5, 5), 0);
  EXPECT_EQ(Mod(0, 5), 0);
  EXPECT_EQ(Mod(-1, 5), 4);
  EXPECT_EQ(Mod(-5, 5), 0);
  EXPECT_EQ(Mod(-6, 5), 4);
  EXPECT_EQ(Mod(-7, 3), 2);
  EXPECT_EQ(Mod(-3, 1), 0);
}

TEST(LaneTest, LaneIsTheSendersParity) {
  EXPECT_EQ(kDefaultLanes, 2);
  EXPECT_EQ(LaneOf(0, kDefaultLanes), 0);
  EXPECT_EQ(LaneOf(1, kDefaultLanes), 1);
  EXPECT_EQ(LaneOf(2, kDefaultLanes), 0);
  EXPECT_EQ(LaneOf(7, kDefaultLanes), 1);
}

TEST(LaneTest, OneLaneCarriesEverySendersMessages) {
  for (int sender = 0; sender < 5; ++sender) EXPECT_EQ(LaneOf(sender, 1), 0) << sender;
}

TEST(LaneTest, MoreLanesThanTwoTakeTheSenderModuloTheirCount) {
  EXPECT_EQ(LaneOf(2, 3), 2);
  EXPECT_EQ(LaneOf(3, 3), 0);
  EXPECT_EQ(LaneOf(7, 3), 1);
}

TEST(LaneTest, RingNeighboursUseDifferentLanesExceptAtAnOddRingsWrap) {
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(LaneOf(NextRank(rank, 4), kDefaultLanes), LaneOf(rank, kDefaultLanes))
        << "W=4, rank " << rank;
  }
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(LaneOf(NextRank(rank, 5), kDefaultLanes), LaneOf(rank, kDefaultLanes))
        << "W=5, rank " << rank;
  }
  // Rank 4 of 5 sends to rank 0: both even.
  EXPECT_EQ(LaneOf(NextRank(4, 5), kDefaultLanes), LaneOf(4, kDefaultLanes));
}

TEST(RingNeighboursTest, NextAndPreviousWrapAround) {
  const int next[] = {1, 2, 3, 0};
  const int previous[] = {3, 0, 1, 2};
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(NextRank(rank, 4), next[rank]) << rank;
    EXPECT_EQ(PreviousRank(rank, 4), previous[rank]) << rank;
  }
  EXPECT_EQ(NextRank(0, 1), 0);
  EXPECT_EQ(PreviousRank(0, 1), 0);
}

TEST(ReduceScatterScheduleTest, SentAndReceivedPiecesAtEachStep) {
  // W = 4, steps 0..2: rank r sends r-1-s and receives r-2-s (mod 4).
  const int sent[4][3] = {{3, 2, 1}, {0, 3, 2}, {1, 0, 3}, {2, 1, 0}};
  const int received[4][3] = {{2, 1, 0}, {3, 2, 1}, {0, 3, 2}, {1, 0, 3}};
  for (int rank = 0; rank < 4; ++rank) {
    for (int step = 0; step < 3; ++step) {
      EXPECT_EQ(ReduceScatterSentPiece(rank, step, 4), sent[rank][step]) << rank << "/" << step;
      EXPECT_EQ(ReduceScatterReceivedPiece(rank, step, 4), received[rank][step])
          << rank << "/" << step;
    }
  }
}

// Follows each piece around the ring: the rank that sends it at step 0 contributes first, then
// each receiver adds its own; the documented order is p+1, p+2, ..., p (mod W), ending at rank p.
TEST(ReduceScatterScheduleTest, EachPieceIsReducedFromRankAfterItAroundToItsOwner) {
  for (int world_size = 2; world_size <= 6; ++world_size) {
    const int steps = world_size - 1;
    for (int piece = 0; piece < world_size; ++piece) {
      std::vector<int> starters;
      for (int rank = 0; rank < world_size; ++rank) {
        if (ReduceScatterSentPiece(rank, 0, world_size) == piece) starters.push_back(rank);
      }
      ASSERT_EQ(starters.size(), size_t{1}) << "W=" << world_size << " piece " << piece;
      std::vector<int> contributors = {starters[0]};
      int holder = starters[0];
      for (int step = 0; step < steps; ++step) {
        const int receiver = NextRank(holder, world_size);
        ASSERT_EQ(ReduceScatterReceivedPiece(receiver, step, world_size), piece)
            << "W=" << world_size << " piece " << piece << " step " << step;
        if (step + 1 < steps) {
          ASSERT_EQ(ReduceScatterSentPiece(receiver, step + 1, world_size), piece)
              << "W=" << world_size << " piece " << piece << " step " << step + 1;
        }
        contributors.push_back(receiver);
        holder = receiver;
      }
      std::vector<int> expected;
      for (int i = 1; i <= world_size; ++i) expected.push_back((piece + i) % world_size);
      EXPECT_EQ(contributors, expected) << "W=" << world_size << " piece " << piece;
    }
  }
}

TEST(AllGatherScheduleTest, ReceivedPiecesAtEachStep) {
  // W = 4: rank r receives r-1-s (mod 4) at step s.
  const int received[4][3] = {{3, 2, 1}, {0, 3, 2}, {1, 0, 3}, {2, 1, 0}};
  for (int rank = 0; rank < 4; ++rank) {
    for (int step = 0; step < 3; ++step) {
      EXPECT_EQ(AllGatherReceivedPiece(rank, step, 4), received[rank][step]) << rank << "/" << step;
    }
  }
}

TEST(AllGatherScheduleTest, EachStepForwardsThePreviousStepsPieceAndEveryRankGetsAll) {
  for (int world_size = 2; world_size <= 6; ++world_size) {
    for (int rank = 0; rank < world_size; ++rank) {
      const int next = NextRank(rank, world_size);
      std::set<int> held = {rank};
      for (int step = 0; step < world_size - 1; ++step) {
        // At step 0 a rank sends its own piece, later the one it received the step before.
        const int sent = step == 0 ? rank : AllGatherReceivedPiece(rank, step - 1, world_size);
        EXPECT_EQ(AllGatherReceivedPiece(next, step, world_size), sent)
            << "W=" << world_size << " rank " << rank << " step " << step;
        held.insert(AllGatherReceivedPiece(rank, step, world_size));
      }
      EXPECT_EQ(held.size(), static_cast<size_t>(world_size))
          << "W=" << world_size << " rank " << rank;
    }
  }
}

TEST(ChainPositionTest, CountsFromTheRootAlongTheRing) {
  const int position_from_root_2[] = {2, 3, 0, 1};
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(ChainPosition(rank, 2, 4), position_from_root_2[rank]) << rank;
    EXPECT_EQ(ChainPosition(NextRank(rank, 4), rank, 4), 1) << rank;
  }
  EXPECT_EQ(ChainPosition(0, 0, 1), 0);
}

TEST(PiecesTest, LargestOfNoPiecesIsZero) {
  EXPECT_EQ(Pieces{}.largest(), size_t{0});
  EXPECT_EQ(Pieces{Begins{5}}.largest(), size_t{0});
}

TEST(PiecesTest, LargestIsTheLargestWhereverItIs) {
  const Pieces last_largest{Begins{0, 3, 5, 9}};  // sizes 3, 2, 4
  EXPECT_EQ(last_largest.size(0), size_t{3});
  EXPECT_EQ(last_largest.size(1), size_t{2});
  EXPECT_EQ(last_largest.size(2), size_t{4});
  EXPECT_EQ(last_largest.largest(), size_t{4});
  const Pieces first_largest{Begins{10, 16, 17, 20}};  // sizes 6, 1, 3
  EXPECT_EQ(first_largest.largest(), size_t{6});
}

TEST(EqualPiecesTest, PiecesOfPieceCountEach) {
  EXPECT_EQ(EqualPieces(3, 4).begin, (Begins{0, 4, 8, 12}));
  EXPECT_EQ(EqualPieces(1, 7).begin, (Begins{0, 7}));
  EXPECT_EQ(EqualPieces(2, 0).begin, (Begins{0, 0, 0}));
  EXPECT_EQ(EqualPieces(2, 0).largest(), size_t{0});
  EXPECT_EQ(EqualPieces(3, 4).largest(), size_t{4});
}

TEST(BalancedPiecesTest, UnevenCountPutsExtrasFirst) {
  // 10 over 4: 2 each, the first 10 % 4 = 2 pieces one more.
  EXPECT_EQ(BalancedPieces(4, 10).begin, (Begins{0, 3, 6, 8, 10}));
  EXPECT_EQ(BalancedPieces(4, 10).largest(), size_t{3});
  // 1001 over 3: 333 each, the first two 334.
  EXPECT_EQ(BalancedPieces(3, 1001).begin, (Begins{0, 334, 668, 1001}));
  // Fewer elements than ranks: the last pieces are empty.
  EXPECT_EQ(BalancedPieces(5, 3).begin, (Begins{0, 1, 2, 3, 3, 3}));
}

TEST(BalancedPiecesTest, EvenCountGivesEqualPieces) {
  EXPECT_EQ(BalancedPieces(3, 9).begin, (Begins{0, 3, 6, 9}));
  EXPECT_EQ(BalancedPieces(3, 9).begin, EqualPieces(3, 3).begin);
  EXPECT_EQ(BalancedPieces(1, 7).begin, (Begins{0, 7}));
  EXPECT_EQ(BalancedPieces(4, 0).begin, (Begins{0, 0, 0, 0, 0}));
}

TEST(PlanSegmentsTest, EmptyPieceHasNoSegments) {
  const Segments segments = PlanSegments(0, 4, 1024, 3);
  EXPECT_EQ(segments.count, 0);
  EXPECT_EQ(segments.elements, size_t{1});
}

TEST(PlanSegmentsTest, SegmentsHoldSegmentBytes) {
  // 1024 bytes of fp32 = 256 elements; 1000 elements need 4 segments, the last one partial.
  Segments segments = PlanSegments(1000, 4, 1024, 3);
  EXPECT_EQ(segments.elements, size_t{256});
  EXPECT_EQ(segments.count, 4);
  segments = PlanSegments(1024, 4, 1024, 3);
  EXPECT_EQ(segments.elements, size_t{256});
  EXPECT_EQ(segments.count, 4);
  // 20 bytes of 8-byte elements: 2 whole elements (the remainder byte count is dropped).
  segments = PlanSegments(100, 8, 20, 1);
  EXPECT_EQ(segments.elements, size_t{2});
  EXPECT_EQ(segments.count, 50);
  segments = PlanSegments(1, 2, 1 << 20, 4);
  EXPECT_EQ(segments.elements, size_t{1 << 19});
  EXPECT_EQ(segments.count, 1);
}

TEST(PlanSegmentsTest, SegmentBytesBelowOneElementGiveOneElementSegments) {
  const Segments segments = PlanSegments(10, 8, 4, 1);
  EXPECT_EQ(segments.elements, size_t{1});
  EXPECT_EQ(segments.count, 10);
}

TEST(PlanSegmentsTest, ClampAtUnitsPerPhaseGivesFewerLargerSegments) {
  // steps = 4: at most (524288 - 1) / 4 = 131071 segments. 1,000,000 one-element segments are
  // too many; ceil(1e6 / 131071) = 8 elements each (7 * 131071 = 917497 < 1e6), so
  // ceil(1e6 / 8) = 125000 segments.
  Segments segments = PlanSegments(1000000, 4, 4, 4);
  EXPECT_EQ(segments.elements, size_t{8});
  EXPECT_EQ(segments.count, 125000);
  EXPECT_LT(4 * static_cast<uint64_t>(segments.count), kUnitsPerPhase);
  // The smallest segment_bytes the communicator accepts (64) with fp32 at W = 5: 16-element
  // segments would be 250000; ceil(4e6 / 131071) = 31 (30 * 131071 = 3932130 < 4e6), and
  // ceil(4e6 / 31) = 129033 (31 * 129032 = 3999992).
  segments = PlanSegments(4000000, 4, 64, 4);
  EXPECT_EQ(segments.elements, size_t{31});
  EXPECT_EQ(segments.count, 129033);
  EXPECT_LT(4 * static_cast<uint64_t>(segments.count), kUnitsPerPhase);
}

TEST(PlanSegmentsTest, ClampAtUnitsPerPhaseBoundary) {
  // Exactly 131071 segments at steps = 4 still fit; one element more halves the count.
  Segments segments = PlanSegments(131071, 1, 1, 4);
  EXPECT_EQ(segments.elements, size_t{1});
  EXPECT_EQ(segments.count, 131071);
  segments = PlanSegments(131072, 1, 1, 4);
  EXPECT_EQ(segments.elements, size_t{2});
  EXPECT_EQ(segments.count, 65536);
}

TEST(PlanSegmentsTest, ZeroStepsClampLikeOneStep) {
  // One step allows 524287 segments; 524288 elements need 2 per segment, 262144 segments.
  for (int steps : {0, 1}) {
    Segments segments = PlanSegments(524287, 1, 1, steps);
    EXPECT_EQ(segments.elements, size_t{1}) << steps;
    EXPECT_EQ(segments.count, 524287) << steps;
    segments = PlanSegments(524288, 1, 1, steps);
    EXPECT_EQ(segments.elements, size_t{2}) << steps;
    EXPECT_EQ(segments.count, 262144) << steps;
  }
}

TEST(SegmentOfTest, FullAndTrailingPartialSegments) {
  // 10 over 3: pieces [0, 4), [4, 7), [7, 10); 8-byte segments of fp32 are 2 elements.
  const Pieces pieces = BalancedPieces(3, 10);
  const Segments segments = PlanSegments(pieces.largest(), 4, 8, 2);
  ASSERT_EQ(segments.elements, size_t{2});
  ASSERT_EQ(segments.count, 2);
  const Range expected[3][2] = {{{0, 2}, {2, 2}}, {{4, 2}, {6, 1}}, {{7, 2}, {9, 1}}};
  for (int piece = 0; piece < 3; ++piece) {
    for (int k = 0; k < 2; ++k) {
      const Range range = SegmentOf(pieces, segments, piece, k);
      EXPECT_EQ(range.offset, expected[piece][k].offset) << piece << "/" << k;
      EXPECT_EQ(range.count, expected[piece][k].count) << piece << "/" << k;
    }
  }
}

TEST(SegmentOfTest, SegmentPastTheEndOfASmallerPieceIsEmpty) {
  // 4 over 3: pieces [0, 2), [2, 3), [3, 4); one-element segments, two per piece.
  const Pieces pieces = BalancedPieces(3, 4);
  const Segments segments = PlanSegments(pieces.largest(), 4, 4, 2);
  ASSERT_EQ(segments.elements, size_t{1});
  ASSERT_EQ(segments.count, 2);
  Range range = SegmentOf(pieces, segments, 1, 1);
  EXPECT_EQ(range.offset, size_t{3});
  EXPECT_EQ(range.count, size_t{0});
  range = SegmentOf(pieces, segments, 2, 1);
  EXPECT_EQ(range.offset, size_t{4});
  EXPECT_EQ(range.count, size_t{0});
  // Segment 1 starts 3 elements in, past piece 1's 2 elements.
  const Pieces uneven{Begins{0, 5, 7}};
  const Segments threes = PlanSegments(uneven.largest(), 1, 3, 1);
  ASSERT_EQ(threes.elements, size_t{3});
  ASSERT_EQ(threes.count, 2);
  range = SegmentOf(uneven, threes, 1, 1);
  EXPECT_EQ(range.offset, size_t{7});
  EXPECT_EQ(range.count, size_t{0});
  range = SegmentOf(uneven, threes, 0, 1);
  EXPECT_EQ(range.offset, size_t{3});
  EXPECT_EQ(range.count, size_t{2});
}

}  // namespace
}  // namespace zeroshard::comm

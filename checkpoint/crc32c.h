// CRC32C (Castagnoli): the checksum of checkpoint fragments, shard files and manifests. A
// portable slicing-by-8 path and an SSE4.2 path, chosen once at run time.
#ifndef ZEROSHARD_CHECKPOINT_CRC32C_H_
#define ZEROSHARD_CHECKPOINT_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace zeroshard::checkpoint {

// The CRC32C of the bytes whose CRC32C is `crc` followed by data[0, n): reflected polynomial
// 0x82F63B78, initial value and final xor 0xFFFFFFFF (iSCSI, RFC 3720; ext4, gRPC, leveldb
// compute the same value). Crc32cExtend(0, ...) starts a new checksum, so extending in pieces
// equals one call over their concatenation. Thread-safe (pure).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

// The CRC32C of A followed by B, from crc_a = Crc32c(A), crc_b = Crc32c(B) and B's length,
// without reading either: O(log len_b). Lets a writer checksum a file whose header it rewrites
// after the data. Thread-safe (pure).
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// The two implementations behind Crc32cExtend, for tests and benchmarks.
namespace crc32c_internal {

uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n);
// Whether this CPU has SSE4.2's crc32 instruction (always false off x86-64).
bool HasSse42();
// REQUIRES: HasSse42().
uint32_t ExtendSse42(uint32_t crc, const void* data, size_t n);

}  // namespace crc32c_internal
}  // namespace zeroshard::checkpoint

#endif  // ZEROSHARD_CHECKPOINT_CRC32C_H_

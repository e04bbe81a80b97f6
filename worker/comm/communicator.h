// The Communicator interface: the collectives the engine runs over a worker group (reduce-scatter,
// all-gather, all-reduce, broadcast, barrier), as asynchronous operations with work handles.
// Backends: GlooCommunicator (CPU, TCP) and NcclCommunicator (GPU). No CUDA or Gloo headers here.
#ifndef ZEROSHARD_WORKER_COMM_COMMUNICATOR_H_
#define ZEROSHARD_WORKER_COMM_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace zeroshard::comm {

// Element types a communicator moves and reduces. bf16 and fp16 elements are raw uint16_t bit
// patterns; backends reduce them in fp32 (see each backend for where rounding happens).
enum class ElementType : int32_t {
  kFloat64 = 0,
  kFloat32 = 1,
  kBFloat16 = 2,
  kFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
};

// Bytes per element; 0 for a value outside the enum.
inline size_t ElementSize(ElementType type) {
  switch (type) {
    case ElementType::kFloat64:
    case ElementType::kInt64:
      return 8;
    case ElementType::kFloat32:
    case ElementType::kInt32:
      return 4;
    case ElementType::kBFloat16:
    case ElementType::kFloat16:
      return 2;
  }
  return 0;
}

inline const char* ElementTypeName(ElementType type) {
  switch (type) {
    case ElementType::kFloat64:
      return "fp64";
    case ElementType::kFloat32:
      return "fp32";
    case ElementType::kBFloat16:
      return "bf16";
    case ElementType::kFloat16:
      return "fp16";
    case ElementType::kInt32:
      return "int32";
    case ElementType::kInt64:
      return "int64";
  }
  return "invalid";
}

// kSum adds; kMax keeps the larger element, and a NaN in either operand gives NaN.
enum class ReduceOp : int32_t {
  kSum = 0,
  kMax = 1,
};

// Per-operation options, in the manner of gloo's options objects.
struct CollectiveOptions {
  // Bound on the operation from the moment it starts running (operations run one at a time in
  // issue order, so time spent queued behind earlier ones does not count). When it expires the
  // operation fails with DEADLINE_EXCEEDED and the communicator is broken (see Communicator).
  absl::Duration timeout = absl::Minutes(5);
  // Every rank must issue the same operation with the same tag. A mismatch (ranks disagreeing on
  // which collective comes next) then times out instead of silently mixing data.
  uint32_t tag = 0;
};

// Counters a backend keeps; cheap to read at any time.
struct CommunicatorStats {
  int64_t operations_completed = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  // Memory the backend holds for its collectives outside the callers' buffers (staging and
  // scratch, kept between operations), in bytes, as of the last completed operation; the owner
  // reports it as its own memory category. 0 for backends whose buffers live inside a library
  // that does not say (NCCL).
  int64_t scratch_bytes = 0;
  // CPU time the backend's own communication thread has used since the communicator was made
  // (cumulative; the owner takes differences per step), in nanoseconds. 0 for backends without
  // such a thread (NCCL) or where the thread's clock cannot be read.
  int64_t thread_cpu_ns = 0;
};

// A handle to one issued operation. Thread-safe: Wait and Done may be called from any thread.
class Work {
 public:
  virtual ~Work() = default;

  // Blocks until the operation finished or `timeout` passed. Returns the operation's status
  // once it finished. If `timeout` passes first, returns DEADLINE_EXCEEDED with a message saying
  // the operation is still running: it goes on (bounded by its own CollectiveOptions::timeout,
  // or ended promptly by Communicator::Abort()) and its buffers stay in use until Done().
  virtual absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration()) = 0;

  // Whether the operation finished (successfully or not). After Done(), the operation no longer
  // touches its buffers.
  virtual bool Done() const = 0;

  // Orders whatever consumes the operation's results after it, blocking the host only where the
  // backend has nothing else to wait on. A device backend (NcclCommunicator) makes its compute
  // stream wait for the operation on the device and returns at once: work queued on that stream
  // afterwards sees the results, and the calling thread goes on queueing. Host backends wait on
  // the host, so by default this is Wait(). Call it from the thread that queues the consumer's
  // work. A failure already known is returned (the results must not be used); OK means ordered,
  // not succeeded: Wait() or Done() still tell how the operation ended, and the caller checks
  // that before trusting what it computed from the results.
  virtual absl::Status WaitOnComputeStream() { return Wait(); }

  // How long the operation ran on the backend: from when it started executing (after the
  // operations issued before it finished) until it finished, so time queued behind earlier
  // operations does not count. Valid once Done(); before that, and from backends that do not
  // record it, nullopt. An operation that finished without running (a bad call, world size 1,
  // zero counts, a communicator that had already ended) reports zero.
  virtual std::optional<absl::Duration> RunTime() const { return std::nullopt; }
};

// A group of world_size() ranks that run collectives together.
//
// Buffers: host memory for CPU backends, device memory for GPU backends. A buffer passed to an
// operation must stay valid, and must not be touched by the caller, until its Work is Done().
// "count" arguments are element counts. Every rank must issue the same sequence of operations
// with the same counts, types, ops, roots and tags.
//
// Reproducibility: for a fixed world size, every reduction adds in a fixed order that does not
// depend on timing, so reruns are bitwise identical. AllReduce(kSum) over a buffer whose count is
// a multiple of world_size() gives, for each piece, exactly the bits ReduceScatter gives for that
// piece (ddp and zero modes agree bitwise).
//
// Failure: the first operation that fails (timeout, lost peer, transport error) ends the
// communicator: that operation reports the cause (DEADLINE_EXCEEDED, UNAVAILABLE, INTERNAL), and
// every queued and later operation fails with ABORTED. A communicator is not reused after that;
// the owner builds a new one for the next generation. INVALID_ARGUMENT (a bad call) is reported
// on the returned Work without issuing anything and does not end the communicator.
//
// Thread contract: operations are issued from one thread at a time (the owner's); they run on the
// backend's own thread(s) (or stream) one after another in issue order. Abort(), rank(),
// world_size(), stats() and LostPeers() may be called from any thread. Work handles are
// thread-safe.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // ReduceScatter: `input` holds world_size() pieces of `piece_count` elements (piece r at
  // element offset r * piece_count); `output` (piece_count elements) receives this rank's piece
  // of the element-wise reduction over ranks. `input` and `output` must not overlap.
  virtual std::unique_ptr<Work> ReduceScatter(const void* input, void* output, size_t piece_count,
                                              ElementType type, ReduceOp op,
                                              const CollectiveOptions& options = {}) = 0;

  // In place on a whole bucket: `buffer` holds world_size() * piece_count elements; afterwards
  // piece rank() (at element offset rank() * piece_count) holds the reduced piece. The other
  // pieces are used as scratch and hold unspecified values afterwards.
  virtual std::unique_ptr<Work> ReduceScatterInPlace(void* buffer, size_t piece_count,
                                                     ElementType type, ReduceOp op,
                                                     const CollectiveOptions& options = {}) = 0;

  // AllGather: `input` (piece_count elements) is this rank's piece; `output` receives all
  // world_size() pieces, piece r at element offset r * piece_count. No overlap allowed.
  virtual std::unique_ptr<Work> AllGather(const void* input, void* output, size_t piece_count,
                                          ElementType type,
                                          const CollectiveOptions& options = {}) = 0;

  // In place on a whole bucket: piece rank() of `buffer` (world_size() * piece_count elements)
  // is this rank's piece; afterwards every piece is filled.
  virtual std::unique_ptr<Work> AllGatherInPlace(void* buffer, size_t piece_count, ElementType type,
                                                 const CollectiveOptions& options = {}) = 0;

  // In place: afterwards every rank's `buffer` (count elements, any count) holds the element-wise
  // reduction over ranks.
  virtual std::unique_ptr<Work> AllReduce(void* buffer, size_t count, ElementType type, ReduceOp op,
                                          const CollectiveOptions& options = {}) = 0;

  // In place: afterwards every rank's `buffer` holds root's.
  virtual std::unique_ptr<Work> Broadcast(void* buffer, size_t count, ElementType type, int root,
                                          const CollectiveOptions& options = {}) = 0;

  // Finishes once every rank has issued it (and everything issued before it has finished).
  virtual std::unique_ptr<Work> Barrier(const CollectiveOptions& options = {}) = 0;

  // Ends the communicator: the running operation and every queued one finish promptly with
  // ABORTED (their Wait returns), later calls return Work that already failed with ABORTED, and
  // connections to peers are closed (so peers fail fast instead of waiting for their timeouts).
  // Idempotent; callable from any thread, including while another thread is in Wait.
  virtual void Abort() = 0;

  virtual CommunicatorStats stats() const = 0;

  // The peers this rank saw die (their processes ended: their connections closed or broke
  // without a word), in the order seen, so that the owner of a failed run can say which ranks
  // are gone. A peer whose communicator failed or was aborted while its process lives on is not
  // one. Empty when none died, and from backends that cannot tell (NCCL).
  virtual std::vector<int> LostPeers() const { return {}; }
};

// A Work that finished before it was returned (validation errors, world size 1, zero counts).
std::unique_ptr<Work> MakeFinishedWork(absl::Status status);

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_COMMUNICATOR_H_

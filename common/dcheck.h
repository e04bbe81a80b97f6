// Debug-build checks of invariants and preconditions: ZS_DCHECK(condition) and the comparisons
// ZS_DCHECK_EQ/NE/LT/LE/GT/GE(a, b). On unless NDEBUG is defined (bazel -c opt defines it).
#ifndef ZEROSHARD_COMMON_DCHECK_H_
#define ZEROSHARD_COMMON_DCHECK_H_

#include "absl/base/optimization.h"
#include "common/logging.h"

// 1 where checks run (no NDEBUG: fastbuild, dbg, asan), 0 under NDEBUG (opt).
#ifdef NDEBUG
#define ZS_DCHECK_IS_ON() 0
#else
#define ZS_DCHECK_IS_ON() 1
#endif

// ZS_DCHECK(condition) << optional context;
//
// When checks are on, a false `condition` logs "DCHECK failed: <condition text>" at its file and
// line through ZS_LOG(FATAL), which aborts. When they are off, neither the condition nor the
// context is evaluated, but both still compile (so a check cannot rot in opt-only code): a
// condition must have no side effects. A failed check is a programmer error; anything a caller
// or a peer can cause is reported as a Status instead. Thread-safe (as ZS_LOG).
#define ZS_DCHECK(condition) ZS_DCHECK_INTERNAL_(condition, #condition)

// As ZS_DCHECK(a op b), and the message also shows both operands (which must be streamable).
// They are evaluated once when the check passes and again, for the message, when it fails.
#define ZS_DCHECK_EQ(a, b) ZS_DCHECK_OP_INTERNAL_(==, a, b)
#define ZS_DCHECK_NE(a, b) ZS_DCHECK_OP_INTERNAL_(!=, a, b)
#define ZS_DCHECK_LT(a, b) ZS_DCHECK_OP_INTERNAL_(<, a, b)
#define ZS_DCHECK_LE(a, b) ZS_DCHECK_OP_INTERNAL_(<=, a, b)
#define ZS_DCHECK_GT(a, b) ZS_DCHECK_OP_INTERNAL_(>, a, b)
#define ZS_DCHECK_GE(a, b) ZS_DCHECK_OP_INTERNAL_(>=, a, b)

// An expression of type void, so a check is one statement wherever it is used (no dangling
// else). Off, `true || (condition)` keeps the condition compiled but never evaluated.
#define ZS_DCHECK_INTERNAL_(condition, text)           \
  (!ZS_DCHECK_IS_ON() || ABSL_PREDICT_TRUE(condition)) \
      ? (void)0                                        \
      : ZS_LOG(FATAL) << "DCHECK failed: " text " "

#define ZS_DCHECK_OP_INTERNAL_(op, a, b) \
  ZS_DCHECK_INTERNAL_((a)op(b), #a " " #op " " #b) << "(" << (a) << " vs. " << (b) << ") "

#endif  // ZEROSHARD_COMMON_DCHECK_H_

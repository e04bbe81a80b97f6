// Status propagation macros: ZS_RETURN_IF_ERROR and ZS_ASSIGN_OR_RETURN.
#ifndef ZEROSHARD_COMMON_STATUS_MACROS_H_
#define ZEROSHARD_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns `expr` from the enclosing function when it is not OK.
#define ZS_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status zs_status_ = (expr);      \
    if (!zs_status_.ok()) return zs_status_; \
  } while (false)

#define ZS_STATUS_CONCAT_INNER_(a, b) a##b
#define ZS_STATUS_CONCAT_(a, b) ZS_STATUS_CONCAT_INNER_(a, b)

// `ZS_ASSIGN_OR_RETURN(auto x, F());` assigns the value of an OK StatusOr to `lhs`,
// or returns its status from the enclosing function.
#define ZS_ASSIGN_OR_RETURN(lhs, expr) \
  ZS_ASSIGN_OR_RETURN_IMPL_(ZS_STATUS_CONCAT_(zs_statusor_, __LINE__), lhs, expr)

#define ZS_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)     \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // ZEROSHARD_COMMON_STATUS_MACROS_H_

// Field checks shared by the job spec and request validators (see the header).
#include "jobspec/job_spec_validation_checks.h"

#include <cmath>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace zeroshard::jobspec {
namespace {

constexpr size_t kMaxQuotedBytes = 64;

// Integers up to this magnitude print exactly in plain digits.
constexpr double kPlainDigitsLimit = 1e15;

bool IsNameChar(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; }

absl::Status NotFinite(absl::string_view field, double value) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", FormatDouble(value), " is not allowed (must be a finite number)"));
}

std::string EnumValueName(const google::protobuf::EnumDescriptor& type, int value) {
  const google::protobuf::EnumValueDescriptor* known = type.FindValueByNumber(value);
  return known != nullptr ? known->name() : absl::StrCat(value);
}

std::string AllowedNames(const google::protobuf::EnumDescriptor& type,
                         absl::Span<const int> allowed) {
  std::vector<std::string> names;
  for (int value : allowed) names.push_back(EnumValueName(type, value));
  return absl::StrJoin(names, ", ");
}

}  // namespace

std::string FormatDouble(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Inf" : "-Inf";
  if (value == std::trunc(value) && std::fabs(value) < kPlainDigitsLimit) {
    return absl::StrFormat("%.0f", value);
  }
  for (int precision = 1; precision < 17; ++precision) {
    std::string text = absl::StrFormat("%.*g", precision, value);
    double parsed = 0;
    if (absl::SimpleAtod(text, &parsed) && parsed == value) return text;
  }
  return absl::StrFormat("%.17g", value);
}

std::string Quote(absl::string_view value) {
  if (value.size() <= kMaxQuotedBytes) return absl::StrCat("\"", absl::CEscape(value), "\"");
  return absl::StrCat("\"", absl::CEscape(value.substr(0, kMaxQuotedBytes)), "\"... (",
                      value.size(), " bytes)");
}

absl::Status CheckDoubleInRange(absl::string_view field, double value, double low, Bound low_bound,
                                double high, Bound high_bound) {
  if (!std::isfinite(value)) return NotFinite(field, value);
  const bool above_low = low_bound == Bound::kClosed ? value >= low : value > low;
  const bool below_high = high_bound == Bound::kClosed ? value <= high : value < high;
  if (above_low && below_high) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", FormatDouble(value), " is out of range ",
                   low_bound == Bound::kClosed ? "[" : "(", FormatDouble(low), ", ",
                   FormatDouble(high), high_bound == Bound::kClosed ? "]" : ")"));
}

absl::Status CheckFiniteNonNegative(absl::string_view field, double value) {
  if (!std::isfinite(value)) return NotFinite(field, value);
  if (value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", FormatDouble(value), " is negative (must be >= 0)"));
  }
  return absl::OkStatus();
}

absl::Status CheckFinite(absl::string_view field, double value) {
  if (!std::isfinite(value)) return NotFinite(field, value);
  return absl::OkStatus();
}

absl::Status CheckIntInRange(absl::string_view field, int64_t value, int64_t low, int64_t high) {
  if (value >= low && value <= high) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", value, " is out of range [", low, ", ", high, "]"));
}

absl::Status CheckName(absl::string_view field, absl::string_view value) {
  if (!value.empty() && value.size() <= kMaxNameLength && absl::c_all_of(value, IsNameChar)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", Quote(value), " must be 1 to ",
                                                 kMaxNameLength, " characters of [a-z0-9-]"));
}

absl::Status CheckEnumIn(absl::string_view field, const google::protobuf::EnumDescriptor& type,
                         int value, absl::Span<const int> allowed) {
  if (absl::c_linear_search(allowed, value)) return absl::OkStatus();
  const std::string allowed_names = AllowedNames(type, allowed);
  if (type.FindValueByNumber(value) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": unknown ", type.name(), " value ",
                                                   value, "; allowed: ", allowed_names));
  }
  if (value == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": required; allowed: ", allowed_names));
  }
  if (allowed.size() == 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": only ", allowed_names, " is supported, got ", EnumValueName(type, value)));
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", EnumValueName(type, value),
                                                 " is not supported; allowed: ", allowed_names));
}

absl::Status CheckMaxBytes(absl::string_view field, absl::string_view value, size_t max_bytes) {
  if (value.size() <= max_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", value.size(), " bytes is longer than the limit of ", max_bytes));
}

}  // namespace zeroshard::jobspec

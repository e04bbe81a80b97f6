// GlooStoreAdapter: forwards Gloo's store calls to our Store and throws on failure.
#include "worker/comm/gloo_store_adapter.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"

namespace zeroshard::comm {
namespace {

[[noreturn]] void ThrowFor(const absl::Status& status) {
  const std::string message = absl::StrCat("rendezvous store: ", status.ToString());
  if (status.code() == absl::StatusCode::kDeadlineExceeded) throw gloo::IoException(message);
  throw gloo::Exception(message);
}

}  // namespace

GlooStoreAdapter::GlooStoreAdapter(comm::Store* store, std::string prefix, absl::Duration timeout)
    : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

std::string GlooStoreAdapter::FullKey(const std::string& key) const {
  return absl::StrCat(prefix_, "/", key);
}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  absl::Status status = store_->Set(FullKey(key), absl::string_view(data.data(), data.size()));
  if (!status.ok()) ThrowFor(status);
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  absl::StatusOr<std::string> value = store_->Get(FullKey(key), timeout_);
  if (!value.ok()) ThrowFor(value.status());
  return std::vector<char>(value->begin(), value->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  const absl::Time deadline = absl::Now() + absl::Milliseconds(timeout.count());
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> value =
        store_->Get(FullKey(key), std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!value.ok()) ThrowFor(value.status());
  }
}

}  // namespace zeroshard::comm

// GlooStoreAdapter: presents our Store as a gloo::rendezvous::Store, so Gloo's connectFullMesh
// exchanges its addresses through whatever Store the worker has (in-memory, file, coordinator).
#ifndef ZEROSHARD_WORKER_COMM_GLOO_STORE_ADAPTER_H_
#define ZEROSHARD_WORKER_COMM_GLOO_STORE_ADAPTER_H_

#include <chrono>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "worker/comm/store.h"

namespace zeroshard::comm {

// Keys are prefixed with `prefix` + "/", so several communicators can share one Store. Gloo's
// interface reports errors by throwing: failures of the underlying Store become gloo::Exception
// (DEADLINE_EXCEEDED becomes gloo::IoException, as Gloo's own stores do), which the caller
// (GlooCommunicator::Create) turns back into a Status.
//
// Thread contract: as thread-safe as the wrapped Store (all ours are). `store` must outlive it.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  // `timeout` bounds get() and wait() calls that carry no timeout of their own.
  GlooStoreAdapter(comm::Store* store, std::string prefix, absl::Duration timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string FullKey(const std::string& key) const;

  comm::Store* const store_;
  const std::string prefix_;
  const absl::Duration timeout_;
};

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_GLOO_STORE_ADAPTER_H_

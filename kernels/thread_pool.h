// A small fixed-size thread pool for the CPU kernels: ParallelFor runs numbered tasks on the
// pool's threads and the caller's, and returns when all are done.
#ifndef ZEROSHARD_KERNELS_THREAD_POOL_H_
#define ZEROSHARD_KERNELS_THREAD_POOL_H_

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace zeroshard::kernels {

// Thread contract: ParallelFor may be called from any thread; concurrent calls are serialised
// (one runs at a time). Tasks must not call ParallelFor on the same pool. Which thread runs a
// task is unspecified, so results must depend only on the task index.
class ThreadPool {
 public:
  // `num_threads` >= 1 counts the calling thread: the pool starts num_threads - 1 workers.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs task(0) ... task(num_tasks - 1), each once, and returns when all have returned.
  // REQUIRES: not called from a task of this pool (it would wait for itself forever).
  void ParallelFor(int64_t num_tasks, absl::FunctionRef<void(int64_t)> task);

 private:
  // Claims and runs tasks of the current ParallelFor until none are left unclaimed.
  void RunTasks();
  void WorkerLoop();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AllTasksFinished() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex call_mu_;  // held for the whole of one ParallelFor
  absl::Mutex mu_;
  // The current ParallelFor's task; null between calls.
  const absl::FunctionRef<void(int64_t)>* task_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t num_tasks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_task_ ABSL_GUARDED_BY(mu_) = 0;       // first unclaimed task
  int64_t finished_tasks_ ABSL_GUARDED_BY(mu_) = 0;  // tasks that have returned
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_THREAD_POOL_H_

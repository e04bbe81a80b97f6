// A small fixed-size thread pool for the CPU kernels.
#include "kernels/thread_pool.h"

#include "common/dcheck.h"

namespace zeroshard::kernels {
namespace {

// The pool whose tasks this thread is running, if any, so ParallelFor can catch a task calling
// back into its own pool (a deadlock) in debug builds.
thread_local const ThreadPool* tasks_of_pool = nullptr;

// Marks this thread as running tasks of `pool` while it lives; restores the previous mark, as a
// task of one pool may run tasks of another. Thread contract: made and destroyed on the thread
// it marks.
class RunningTasksOf {
 public:
  explicit RunningTasksOf(const ThreadPool* pool) : previous_(tasks_of_pool) {
    tasks_of_pool = pool;
  }
  ~RunningTasksOf() { tasks_of_pool = previous_; }
  RunningTasksOf(const RunningTasksOf&) = delete;
  RunningTasksOf& operator=(const RunningTasksOf&) = delete;

 private:
  const ThreadPool* const previous_;
};

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  const int workers = num_threads > 1 ? num_threads - 1 : 0;
  workers_.reserve(workers);
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& worker : workers_) worker.join();
}

bool ThreadPool::HasWorkOrStopping() const {
  return stopping_ || (task_ != nullptr && next_task_ < num_tasks_);
}

bool ThreadPool::AllTasksFinished() const { return finished_tasks_ == num_tasks_; }

void ThreadPool::ParallelFor(int64_t num_tasks, absl::FunctionRef<void(int64_t)> task) {
  ZS_DCHECK(tasks_of_pool != this) << "a task called ParallelFor on its own pool";
  if (num_tasks <= 0) return;
  absl::MutexLock call_lock(&call_mu_);
  if (workers_.empty() || num_tasks == 1) {
    RunningTasksOf running(this);
    for (int64_t i = 0; i < num_tasks; ++i) task(i);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    task_ = &task;
    num_tasks_ = num_tasks;
    next_task_ = 0;
    finished_tasks_ = 0;
  }
  RunTasks();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &ThreadPool::AllTasksFinished));
  task_ = nullptr;
}

void ThreadPool::RunTasks() {
  RunningTasksOf running(this);
  while (true) {
    const absl::FunctionRef<void(int64_t)>* task;
    int64_t index;
    {
      absl::MutexLock lock(&mu_);
      if (task_ == nullptr || next_task_ >= num_tasks_) return;
      task = task_;
      index = next_task_++;
    }
    (*task)(index);
    absl::MutexLock lock(&mu_);
    ++finished_tasks_;
  }
}

void ThreadPool::WorkerLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ThreadPool::HasWorkOrStopping));
      if (stopping_) return;
    }
    RunTasks();
  }
}

}  // namespace zeroshard::kernels

// The persistent CPU worker pool (see thread_pool.h): a queue of (batch, k)
// items, workers that pop them, and callers that wait for their own batch,
// running queued items meanwhile.
#include "colossus/kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace colossus::kernels::detail {

namespace {

struct Batch {
  void (*task)(const void*, int64_t);
  const void* context;
  std::atomic<int64_t> left;  // items not yet finished
};

struct Item {
  Batch* batch = nullptr;
  int64_t k = 0;
};

thread_local bool on_pool_worker = false;

class CpuPool {
 public:
  explicit CpuPool(int workers) {
    for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { work(); });
  }
  ~CpuPool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_ready_.notify_all();
    for (auto& w : workers_) w.join();
  }
  CpuPool(const CpuPool&) = delete;
  CpuPool& operator=(const CpuPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()); }

  void run(int64_t tasks, void (*task)(const void*, int64_t), const void* context) {
    Batch batch{task, context, tasks - 1};
    {
      std::lock_guard lock(mutex_);
      for (int64_t k = 1; k < tasks; ++k) queue_.push_back({&batch, k});
    }
    work_ready_.notify_all();
    task(context, 0);
    for (;;) {
      Item item;
      {
        std::unique_lock lock(mutex_);
        batch_done_.wait(lock, [&] { return batch.left.load() == 0 || !queue_.empty(); });
        if (batch.left.load() == 0) return;
        item = queue_.front();
        queue_.pop_front();
      }
      execute(item);
    }
  }

 private:
  void work() {
    on_pool_worker = true;
    for (;;) {
      Item item;
      {
        std::unique_lock lock(mutex_);
        work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        item = queue_.front();
        queue_.pop_front();
      }
      execute(item);
    }
  }

  void execute(const Item& item) {
    item.batch->task(item.batch->context, item.k);
    if (item.batch->left.fetch_sub(1) == 1) {
      // The batch's caller may return (and its batch go) as soon as it sees
      // zero; only the pool's own members are touched from here on.
      std::lock_guard lock(mutex_);
      batch_done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_ready_, batch_done_;
  std::deque<Item> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

std::atomic<int> threads_started{0};

CpuPool& pool() {
  static CpuPool instance([] {
    const int workers = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1);
    threads_started.store(workers);
    return workers;
  }());
  return instance;
}

}  // namespace

void run_on_cpu_pool(int64_t tasks, void (*task)(const void*, int64_t), const void* context) {
  if (tasks <= 1 || on_pool_worker) {
    for (int64_t k = 0; k < tasks; ++k) task(context, k);
    return;
  }
  pool().run(tasks, task, context);
}

int cpu_pool_threads_started() { return threads_started.load(); }

}  // namespace colossus::kernels::detail

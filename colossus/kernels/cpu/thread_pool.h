// Internal to colossus/kernels: the persistent CPU worker pool the
// multi-tensor CPU steps split their elements over (thread_split.h). Its
// threads start once, at the first split that wants more than one, and stay
// for the life of the process: a CPU Adam runs per chunk per step, and
// starting threads for each call cost ~20-50 us a thread each time.
#pragma once
#include <cstdint>

namespace colossus::kernels::detail {

// Runs task(context, k) for every k in [0, tasks): k = 0 on the calling
// thread, the others on the pool's workers (the caller runs queued ones too
// while it waits); returns when all have run. Concurrent callers share the
// pool; a call from inside a task runs its tasks inline.
void run_on_cpu_pool(int64_t tasks, void (*task)(const void* context, int64_t k), const void* context);

// Worker threads the pool has started so far (0 before its first use; then
// one fewer than the cores, at least one).
int cpu_pool_threads_started();

}  // namespace colossus::kernels::detail

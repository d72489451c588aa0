// Persistent helper threads for the fused decode step, and the phase counters its work is
// claimed through.
//
// A fork-join region (OpenMP's) ends only when every thread has reached its end. When the
// processes beside a model node take one of its cores for a while, which on a shared machine
// they do all the time, the whole step waits for the thread that lost its core. Here work is
// claimed in chunks from a counter per phase: a thread that was descheduled before claiming
// anything holds nobody up, and the caller returns as soon as the last chunk is done, not when
// every helper has come back.
#pragma once

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace crescent {

// Pause instructions a waiting thread spins before it starts yielding its core to whatever
// else wants it (another process on the same cores, usually).
constexpr int kSpinsBeforeYield = 2000;
// Spins a helper waits for the next step before it sleeps: the time between two steps (the
// engine's own work, sampling) is longer than this, so helpers sleep rather than steal the
// cores the node's other threads and neighbours need then.
constexpr int kSpinsBeforeSleep = 4000;

// Waits for `ready`; returns the nanoseconds it waited (0 when it was ready at once).
template <typename Ready>
int64_t spin_until(Ready ready) {
  if (ready()) return 0;
  const auto start = std::chrono::steady_clock::now();
  for (int spins = 0; !ready(); ++spins) {
    if (spins < kSpinsBeforeYield) _mm_pause();
    else sched_yield();
  }
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start).count();
}

// One phase of a job: `chunks` pieces of work, claimed one at a time.
struct alignas(64) Phase {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t chunks = 0;
  bool complete() const { return done.load(std::memory_order_acquire) == chunks; }
};

// Work that any number of threads may join at any time, each calling `work` once; `work`
// returns when no chunk is left to claim (chunks others claimed may still be running).
class Job {
 public:
  virtual ~Job() = default;
  virtual void work() = 0;
};

// Owns the helper threads (created on first use, as many as asked for since) and hands each
// new job to all of them. Invariant: `generation_` counts the jobs posted, and a helper runs
// the current job at most once.
class WorkerPool {
 public:
  static WorkerPool& instance() {
    static std::once_flag once;
    // A forked child has none of the parent's threads: it starts a pool of its own.
    std::call_once(once, [] { pthread_atfork(nullptr, nullptr, [] { pool_ = nullptr; }); });
    // Never destroyed: helpers may still be asleep in it when the process exits.
    if (pool_ == nullptr) pool_ = new WorkerPool();
    return *pool_;
  }

  // Posts `job` to the helpers (at least `helpers` of them exist), then works on it.
  void run(const std::shared_ptr<Job>& job, int helpers) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (; threads_ < helpers; ++threads_) std::thread(&WorkerPool::serve, this).detach();
      job_ = job;
      generation_.fetch_add(1, std::memory_order_release);
    }
    generation_.notify_all();
    job->work();
  }

 private:
  WorkerPool() = default;

  void serve() {
    uint64_t seen = generation_.load(std::memory_order_acquire);
    for (;;) {
      for (int spins = 0; generation_.load(std::memory_order_acquire) == seen; ++spins) {
        if (spins < kSpinsBeforeSleep) _mm_pause();
        else generation_.wait(seen, std::memory_order_acquire);
      }
      std::shared_ptr<Job> job;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        seen = generation_.load(std::memory_order_acquire);
        job = job_;
      }
      job->work();
    }
  }

  static inline WorkerPool* pool_ = nullptr;
  std::mutex mutex_;
  std::shared_ptr<Job> job_;  // the latest job; helpers keep it alive while they work on it
  std::atomic<uint64_t> generation_{0};
  int threads_ = 0;
};

}  // namespace crescent

// The phase counters the fused decode step's work is claimed through, and how its threads
// wait for a phase to complete.
//
// Work is claimed in chunks from a counter per phase rather than split in fixed shares: a
// thread that joins late, or loses its core to another process for a while, leaves its
// share to the others instead of holding every phase up.
#pragma once

#include <immintrin.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>

namespace crescent {

// Pause instructions a waiting thread spins before it starts yielding its core to whatever
// else wants it (another process on the same cores, usually).
constexpr int kSpinsBeforeYield = 2000;

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

// One phase of a job: `chunks` pieces of work, claimed one at a time. A chunk's result is
// committed once, by the first thread to finish computing it (`taken`): a chunk held too long
// by a thread that lost its core may be computed again by another, and the slower copy is
// dropped. Invariant: `done` counts committed chunks, and the phase is complete when all are.
struct alignas(64) Phase {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t chunks = 0;
  std::atomic<uint8_t>* taken = nullptr;  // [chunks], set by the committing thread

  bool complete() const { return done.load(std::memory_order_acquire) == chunks; }
  bool committed(int64_t chunk) const { return taken[chunk].load(std::memory_order_acquire); }
  // True for the one thread that gets to commit `chunk`.
  bool take(int64_t chunk) { return !taken[chunk].exchange(1, std::memory_order_acq_rel); }
  // The first chunk not committed yet, or -1.
  int64_t first_open() const {
    for (int64_t c = 0; c < chunks; ++c)
      if (!committed(c)) return c;
    return -1;
  }
};

}  // namespace crescent

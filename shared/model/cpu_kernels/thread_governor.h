// How many threads the next fused decode step runs on.
#pragma once

#include <algorithm>
#include <cstdint>

namespace crescent {

// Decides the thread count of each step from how the last shared steps went. A step whose
// threads spent a large share of it waiting for each other means another process took one of
// the cores meanwhile; on cores taken that way, every phase of a shared step waits for the
// thread that lost its core, while one thread alone never waits. So after such a step the
// next ones run on the calling thread alone, for a stretch that doubles each time sharing
// fails again (up to a cap) and starts over once a shared step runs clean.
class ThreadGovernor {
 public:
  static constexpr double kMaxWaitShare = 0.3;  // of all threads' time in a step
  static constexpr int64_t kFirstStretch = 16, kLongestStretch = 1024;  // steps alone

  int threads_for_next_step(int wanted) {
    if (wanted <= 1) return 1;
    if (alone_left_ > 0) {
      --alone_left_;
      ++steps_alone_;
      return 1;
    }
    return wanted;
  }

  void record(int threads, int64_t wall_ns, int64_t waited_ns) {
    ++steps_;
    if (threads <= 1) return;
    shared_wall_ns_ += wall_ns * threads;
    shared_waited_ns_ += waited_ns;
    if (static_cast<double>(waited_ns) > kMaxWaitShare * threads * static_cast<double>(wall_ns)) {
      alone_left_ = stretch_;
      stretch_ = std::min(2 * stretch_, kLongestStretch);
      ++contended_;
    } else {
      stretch_ = kFirstStretch;
    }
  }

  int64_t steps() const { return steps_; }
  int64_t steps_alone() const { return steps_alone_; }
  int64_t contended_steps() const { return contended_; }
  // Of all threads' time in shared steps, the nanoseconds spent waiting for each other.
  int64_t shared_ns() const { return shared_wall_ns_; }
  int64_t shared_waited_ns() const { return shared_waited_ns_; }

 private:
  int64_t alone_left_ = 0, stretch_ = kFirstStretch;
  int64_t steps_ = 0, steps_alone_ = 0, contended_ = 0;
  int64_t shared_wall_ns_ = 0, shared_waited_ns_ = 0;
};

}  // namespace crescent

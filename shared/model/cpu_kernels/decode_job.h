// One fused decode step as a job for the worker pool: phases of chunks, claimed by whichever
// threads join, each phase starting once the one before it is complete.
#pragma once

#include <memory>
#include <vector>

#include "llama_weights.h"
#include "worker_pool.h"

namespace crescent {

// Owns one step's buffers and phase counters. Invariant: a phase's chunks only read what
// earlier phases wrote, and each chunk writes its own part of the shared buffers, so the
// result is the same whichever thread runs a chunk.
class DecodeJob final : public Job {
 public:
  DecodeJob(const LlamaWeights& model, const Batch& batch, float* logits, int participants);
  void work() override;
  // Returns once every chunk is done.
  void wait() { waited_ns_ += spin_until([&] { return phases_[num_phases_ - 1].complete(); }); }
  // Nanoseconds the participants spent waiting for each other, all of them together.
  int64_t waited_ns() const { return waited_ns_.load(std::memory_order_relaxed); }

 private:
  // Per layer: QKV, attention, output projection, gate/up, down; then the output head.
  enum Kind { kQkv, kAttention, kOutput, kGateUp, kDown, kPerLayer };
  struct Own {  // a participant's private buffers
    float *normed, *attn, *act;
  };
  struct WorkItem {  // attention for the query heads of one KV head, over one span of a row
    int64_t row, kv_head, span;
  };
  int64_t chunks_of(int64_t phase) const;
  void prologue(int64_t phase, const Own& own) const;
  void run_chunk(int64_t phase, int64_t chunk, const Own& own);
  void tile_chunk(const Weight& w, int64_t chunk, int64_t chunks, const float* x, int64_t ldx,
                  float* y, int64_t ldy, bool add) const;
  void attend(int64_t layer, const WorkItem& item);
  void merge(float* out) const;

  const LlamaWeights& m_;
  const Batch batch_;
  float* const logits_;
  const int participants_;
  std::vector<WorkItem> items_;
  std::vector<float> x_, qkv_, gate_up_, partials_, scratch_;
  int64_t num_phases_, tile_chunks_;
  std::unique_ptr<Phase[]> phases_;
  std::atomic<int> joined_{0};
  std::atomic<int64_t> waited_ns_{0};
};

}  // namespace crescent

// One fused decode step as a job: phases of chunks, claimed by whichever threads join, each
// phase starting once the one before it is complete.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "llama_weights.h"
#include "phases.h"

namespace crescent {

// Owns one step's buffers and phase counters.
//
// A chunk is computed into its thread's own buffer and committed (copied, or added to the
// residual stream) by the first thread to finish it, so a chunk may safely be computed twice:
// a thread that finds a phase's chunks all claimed but the phase not complete waits a little,
// then computes the oldest open chunk itself. A thread that lost its core in the middle of a
// chunk then costs the step that chunk's time, not the time it was away. Invariant: a
// committed chunk wrote only its own part of the shared buffers, from inputs that no later
// phase had changed yet (a phase is incomplete until its last commit), so the result is the
// same whichever thread, and however many, ran each chunk.
class DecodeJob {
 public:
  DecodeJob(const LlamaWeights& model, const Batch& batch, float* logits, int participants);
  // Claims, helps with and commits chunks until the last phase is complete; each
  // participating thread calls it once.
  void work();
  // Nanoseconds the participants spent waiting for each other, all of them together.
  int64_t waited_ns() const { return waited_ns_.load(std::memory_order_relaxed); }
  // Chunks computed again because the thread holding them took too long.
  int64_t redone_chunks() const { return redone_.load(std::memory_order_relaxed); }

 private:
  // Per layer: QKV, attention, output projection, gate/up, down; then the output head.
  enum Kind { kQkv, kAttention, kOutput, kGateUp, kDown, kPerLayer };
  struct Own {  // a participant's private buffers
    float *normed, *attn, *act, *out;
    float* split;  // the phase's input split for integer dot products (ggml_intdot.h)
  };
  struct Input {  // what a projection multiplies
    const float* x;
    int64_t width;
  };
  struct WorkItem {  // attention for the query heads of one KV head, over one span of a row
    int64_t row, kv_head, span;
  };
  struct Rows {  // the weight rows (output columns) a projection chunk computes
    int64_t first, count;
  };

  int64_t chunks_of(int64_t phase) const;
  const Weight* weight_of(int64_t phase) const;
  Rows rows_of(const Weight& w, int64_t phase, int64_t chunk) const;
  int64_t run_phase(int64_t phase, const Own& own);
  bool compute(int64_t phase, int64_t chunk, const Own& own);
  void commit(int64_t phase, int64_t chunk, const Own& own);
  void prologue(int64_t phase, const Own& own) const;
  Input input_of(int64_t phase, const Own& own) const;
  // The split of the phase's input, or none where its weight has no integer path or the
  // input's width does not allow one.
  std::optional<formats::SplitRows> split_of(int64_t phase, const Own& own) const;
  void attend(int64_t layer, const WorkItem& item, float* out) const;
  void commit_attention(int64_t layer, const WorkItem& item, const float* out);
  void merge(float* out) const;

  const LlamaWeights& m_;
  const Batch batch_;
  float* const logits_;
  const int participants_;
  std::vector<WorkItem> items_;
  std::vector<float> x_, qkv_, gate_up_, partials_, scratch_;
  int64_t num_phases_, tile_chunks_, own_size_, out_size_;
  std::vector<bool> splits_;  // per phase: whether its weight has parts of an integer format
  std::unique_ptr<Phase[]> phases_;
  std::unique_ptr<std::atomic<uint8_t>[]> taken_;
  std::atomic<int> joined_{0};
  std::atomic<int64_t> waited_ns_{0}, redone_{0};
};

}  // namespace crescent

// What the fused decode step reads: a Llama-family model's weights and shape, and one step's
// batch as it lies in the paged KV cache.
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "attention_span.h"
#include "ggml_matmul.h"
#include "kv_values.h"
#include "vector_math.h"

namespace crescent {

using formats::kTileRows;
using formats::matmul_tile_count;

// Rows of a projection kept in one ggml type: a GGUF tensor's blocks as the file stores them
// (ggml_rows.h), `rows` rows of the projection's `cols` inputs.
struct WeightPart {
  at::Tensor blocks;  // keeps the bytes alive
  const uint8_t* data;
  int64_t qtype, rows, row_bytes;
};

// A projection [rows, cols]: its parts stacked by rows (Q, K and V, or gate and up, as the file
// keeps them: apart, each in its own type).
struct Weight {
  std::vector<WeightPart> parts;
  int64_t rows, cols;
};

// Tile t of y[M, rows] = x[M, cols] . W^T on the calling thread (from `xs`, x split, for the
// formats with integer dot products), y's columns starting at
// weight row `first_row`. A tile may straddle two parts: each row is summed the same way
// whichever tile holds it.
inline void weight_tile(const Weight& w, const float* x, int64_t ldx,
                        const formats::SplitRows* xs, int64_t M, float* y, int64_t ldy, int64_t t,
                        int64_t first_row) {
  int64_t r0 = t * kTileRows;
  const int64_t r1 = std::min(r0 + kTileRows, w.rows);
  int64_t part_start = 0;
  for (const WeightPart& p : w.parts) {
    const int64_t part_end = part_start + p.rows;
    if (r0 < part_end && r0 < r1) {
      const int64_t n = std::min(r1, part_end) - r0;
      const uint8_t* rows = p.data + (r0 - part_start) * p.row_bytes;
      formats::visit_format(p.qtype, [&](auto fmt) {
        formats::matmul_rows_best<decltype(fmt)>(x, ldx, xs, M, rows, p.row_bytes, n, w.cols,
                                                 y + (r0 - first_row), ldy);
      });
      r0 += n;
    }
    part_start = part_end;
  }
}

// Tokens of context one attention work item covers: short enough that a single long sequence
// still splits between the threads, long enough that merging the spans costs little.
constexpr int64_t kSpanTokens = 128;
constexpr int64_t kMaxGroup = 8;  // query heads per KV head
constexpr int64_t kMaxHeadDim = 128;

// One step's rows, checked: each adds one token at position context_lens[r] - 1.
struct Batch {
  int64_t rows, max_blocks, block_size;
  const int64_t* token_ids;
  const int32_t* block_tables;  // [rows, max_blocks]
  const int32_t* context_lens;  // [rows]: tokens attended to, the new one included
  void* kv;  // [blocks, layers, 2, block_size, kv_heads, head_dim] of kv_type
  KvType kv_type;
  int64_t max_spans;

  int64_t spans(int64_t row) const { return (context_lens[row] + kSpanTokens - 1) / kSpanTokens; }
};

// A model's weights in the order the step uses them. Invariant: the shapes agree with the dims
// (checked where it is built).
struct LlamaWeights {
  int64_t layers, hidden, inter, heads, kv_heads, head_dim, vocab;
  float eps;
  at::Tensor embed, cos, sin;  // [vocab, hidden] blocks; rotary tables [positions, head_dim]
  int64_t embed_qtype;
  at::Tensor qkv_order;  // empty, or int32 [qkv_width]: where each QKV output column goes
  std::vector<at::Tensor> norms;  // per layer: before attention, before the MLP; then final
  std::vector<Weight> weights;  // per layer: qkv, o, gate_up, down; then the output head
  AttendSpan attend_span = nullptr;

  int64_t group() const { return heads / kv_heads; }
  int64_t qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
  int64_t attn_width() const { return heads * head_dim; }
  int64_t partial_size() const { return head_dim + 2; }  // max, sum, weighted values
  const Weight& weight(int64_t layer, int64_t which) const { return weights[4 * layer + which]; }
  const float* norm(int64_t index) const { return norms[index].data_ptr<float>(); }

  // Where position `pos`'s K (kind 0) or V (kind 1) of one KV head lies, in the cache's type.
  void* kv_slot(const Batch& b, int64_t row, int64_t layer, int64_t kind, int64_t pos,
                int64_t kv_head) const {
    const int64_t block = b.block_tables[row * b.max_blocks + pos / b.block_size];
    const int64_t chunk = (block * layers + layer) * 2 + kind;
    const int64_t index = ((chunk * b.block_size + pos % b.block_size) * kv_heads + kv_head) * head_dim;
    return static_cast<uint8_t*>(b.kv) + index * kv_bytes(b.kv_type);
  }
  void rms_norm(const float* x, const float* weight, float* out, int64_t rows) const {
    for (int64_t r = 0; r < rows; ++r) rms_norm_row(x + r * hidden, weight, out + r * hidden, hidden, eps);
  }
  void rotate(const float* x, int64_t pos, float* out) const {
    rotate_half(x, cos.data_ptr<float>() + pos * head_dim, sin.data_ptr<float>() + pos * head_dim,
                out, head_dim);
  }
};

}  // namespace crescent

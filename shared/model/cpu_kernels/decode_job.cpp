// The phases of a fused decode step (decode_job.h).

#include "decode_job.h"

#include <algorithm>
#include <cstring>

namespace crescent {

namespace {
// Chunks a projection's tiles are claimed in, per participant: enough that a thread that
// joins late or loses its core leaves the rest to the others, few enough that claiming stays
// cheap next to the work.
constexpr int64_t kChunksPerThread = 4;
}  // namespace

DecodeJob::DecodeJob(const LlamaWeights& model, const Batch& batch, float* logits,
                     int participants)
    : m_(model), batch_(batch), logits_(logits), participants_(participants) {
  const int64_t B = batch.rows;
  for (int64_t r = 0; r < B; ++r)
    for (int64_t g = 0; g < m_.kv_heads; ++g)
      for (int64_t s = 0; s < batch.spans(r); ++s) items_.push_back({r, g, s});
  x_.resize(B * m_.hidden);
  qkv_.resize(B * m_.qkv_width());
  gate_up_.resize(B * 2 * m_.inter);
  partials_.resize(B * m_.heads * batch.max_spans * m_.partial_size());
  scratch_.resize(participants * B * (m_.hidden + m_.attn_width() + m_.inter));
  const float* table = m_.embed.data_ptr<float>();
  for (int64_t r = 0; r < B; ++r)
    std::memcpy(&x_[r * m_.hidden], table + batch.token_ids[r] * m_.hidden, m_.hidden * 4);
  tile_chunks_ = kChunksPerThread * participants;
  num_phases_ = kPerLayer * m_.layers + 1;
  phases_ = std::make_unique<Phase[]>(num_phases_);
  for (int64_t k = 0; k < num_phases_; ++k) phases_[k].chunks = chunks_of(k);
}

int64_t DecodeJob::chunks_of(int64_t phase) const {
  if (phase == num_phases_ - 1) return std::min(tile_chunks_, tile_count(m_.vocab));
  const int64_t layer = phase / kPerLayer;
  switch (phase % kPerLayer) {
    case kAttention: return static_cast<int64_t>(items_.size());
    case kQkv: return std::min(tile_chunks_, tile_count(m_.weight(layer, 0).rows));
    case kOutput: return std::min(tile_chunks_, tile_count(m_.weight(layer, 1).rows));
    case kGateUp: return std::min(tile_chunks_, tile_count(m_.weight(layer, 2).rows));
    default: return std::min(tile_chunks_, tile_count(m_.weight(layer, 3).rows));
  }
}

void DecodeJob::work() {
  const int slot = joined_.fetch_add(1, std::memory_order_relaxed);
  if (slot >= participants_) return;
  const int64_t B = batch_.rows;
  float* base = scratch_.data() + slot * B * (m_.hidden + m_.attn_width() + m_.inter);
  const Own own{base, base + B * m_.hidden, base + B * (m_.hidden + m_.attn_width())};
  int64_t waited = 0;
  for (int64_t k = 0; k < num_phases_; ++k) {
    if (k > 0) waited += spin_until([&] { return phases_[k - 1].complete(); });
    Phase& phase = phases_[k];
    bool prepared = false;
    for (int64_t c; (c = phase.next.fetch_add(1, std::memory_order_acq_rel)) < phase.chunks;) {
      if (!prepared) prologue(k, own);
      prepared = true;
      run_chunk(k, c, own);
      phase.done.fetch_add(1, std::memory_order_release);
    }
  }
  waited_ns_.fetch_add(waited, std::memory_order_relaxed);
}

// What a thread computes for itself before its first chunk of a phase: small enough that
// each computing it beats sharing it through one more phase.
void DecodeJob::prologue(int64_t phase, const Own& own) const {
  const int64_t B = batch_.rows, layer = phase / kPerLayer;
  if (phase == num_phases_ - 1) return m_.rms_norm(x_.data(), m_.norm(2 * m_.layers), own.normed, B);
  switch (phase % kPerLayer) {
    case kQkv: return m_.rms_norm(x_.data(), m_.norm(2 * layer), own.normed, B);
    case kOutput: return merge(own.attn);
    case kGateUp: return m_.rms_norm(x_.data(), m_.norm(2 * layer + 1), own.normed, B);
    case kDown:
      for (int64_t r = 0; r < B; ++r)
        silu_mul(&gate_up_[r * 2 * m_.inter], &gate_up_[r * 2 * m_.inter + m_.inter],
                 own.act + r * m_.inter, m_.inter);
      return;
    default: return;
  }
}

void DecodeJob::run_chunk(int64_t phase, int64_t chunk, const Own& own) {
  const int64_t chunks = phases_[phase].chunks, H = m_.hidden;
  if (phase == num_phases_ - 1)
    return tile_chunk(m_.weights.back(), chunk, chunks, own.normed, H, logits_, m_.vocab, false);
  const int64_t layer = phase / kPerLayer;
  switch (phase % kPerLayer) {
    case kQkv:
      return tile_chunk(m_.weight(layer, 0), chunk, chunks, own.normed, H, qkv_.data(),
                        m_.qkv_width(), false);
    case kAttention: return attend(layer, items_[chunk]);
    case kOutput:
      return tile_chunk(m_.weight(layer, 1), chunk, chunks, own.attn, m_.attn_width(), x_.data(),
                        H, true);
    case kGateUp:
      return tile_chunk(m_.weight(layer, 2), chunk, chunks, own.normed, H, gate_up_.data(),
                        2 * m_.inter, false);
    default:
      return tile_chunk(m_.weight(layer, 3), chunk, chunks, own.act, m_.inter, x_.data(), H, true);
  }
}

void DecodeJob::tile_chunk(const Weight& w, int64_t chunk, int64_t chunks, const float* x,
                           int64_t ldx, float* y, int64_t ldy, bool add) const {
  const int64_t tiles = tile_count(w.rows);
  const int64_t t0 = tiles * chunk / chunks, t1 = tiles * (chunk + 1) / chunks;
  if (add) weight_tiles<true>(w, x, ldx, batch_.rows, y, ldy, t0, t1);
  else weight_tiles<false>(w, x, ldx, batch_.rows, y, ldy, t0, t1);
}

// One work item: leaves, per query head, the span's max score, its sum of exponentials and
// the weighted sum of values; the span holding the new token also stores its K and V.
void DecodeJob::attend(int64_t layer, const WorkItem& item) {
  const int64_t len = batch_.context_lens[item.row], pos = len - 1, hd = m_.head_dim;
  const int64_t group = m_.group(), first_head = item.kv_head * group;
  const float* row = qkv_.data() + item.row * m_.qkv_width();
  alignas(64) float q[kMaxGroup * kMaxHeadDim], k_new[kMaxHeadDim];
  alignas(64) float scores[kMaxGroup * kSpanTokens];
  for (int64_t h = 0; h < group; ++h) m_.rotate(row + (first_head + h) * hd, pos, q + h * hd);
  const float* v_new = row + (m_.heads + m_.kv_heads + item.kv_head) * hd;
  m_.rotate(row + (m_.heads + item.kv_head) * hd, pos, k_new);
  const int64_t begin = item.span * kSpanTokens, end = std::min(begin + kSpanTokens, len);
  const float* keys[kSpanTokens];
  const float* values[kSpanTokens];
  for (int64_t p = begin; p < end; ++p) {
    const bool fresh = p == pos;  // read from the projection, not the cache
    keys[p - begin] = fresh ? k_new : m_.kv_slot(batch_, item.row, layer, 0, p, item.kv_head);
    values[p - begin] = fresh ? v_new : m_.kv_slot(batch_, item.row, layer, 1, p, item.kv_head);
  }
  if (end == len) {
    std::memcpy(m_.kv_slot(batch_, item.row, layer, 0, pos, item.kv_head), k_new, hd * 4);
    std::memcpy(m_.kv_slot(batch_, item.row, layer, 1, pos, item.kv_head), v_new, hd * 4);
  }
  float* out[kMaxGroup];
  for (int64_t h = 0; h < group; ++h)
    out[h] = partials_.data() + ((item.row * m_.heads + first_head + h) * batch_.max_spans +
                                 item.span) * m_.partial_size();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  m_.attend_span(q, keys, values, end - begin, scale, scores, out);
}

// Each row's attention output from its spans' partials, combined in span order.
void DecodeJob::merge(float* out) const {
  const int64_t hd = m_.head_dim, size = m_.partial_size();
  for (int64_t r = 0; r < batch_.rows; ++r) {
    for (int64_t h = 0; h < m_.heads; ++h) {
      const float* part = partials_.data() + (r * m_.heads + h) * batch_.max_spans * size;
      float max = part[0];
      for (int64_t s = 1; s < batch_.spans(r); ++s) max = std::max(max, part[s * size]);
      float* o = out + (r * m_.heads + h) * hd;
      std::fill(o, o + hd, 0.0f);
      float total = 0.0f;
      for (int64_t s = 0; s < batch_.spans(r); ++s) {
        const float* p = part + s * size;
        const float weight = std::exp(p[0] - max);
        total += weight * p[1];
        axpy(weight, p + 2, o, hd);
      }
      scale_in_place(o, 1.0f / total, hd);
    }
  }
}

}  // namespace crescent

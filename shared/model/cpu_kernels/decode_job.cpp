// The phases of a fused decode step (decode_job.h).

#include "decode_job.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace crescent {

namespace {
// Chunks a projection's tiles are claimed in, per participant: enough that a thread that
// joins late or loses its core leaves the rest to the others, few enough that claiming stays
// cheap next to the work.
constexpr int64_t kChunksPerThread = 8;
// How long a thread with nothing left to claim waits for a phase's open chunks before it
// computes one itself: a multiple of its own last chunk's time in the phase, and at least
// kMinGraceNs, so that a thread merely a little behind is not duplicated.
constexpr double kGraceChunks = 1.5;
constexpr int64_t kMinGraceNs = 20'000;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

DecodeJob::DecodeJob(const LlamaWeights& model, const Batch& batch, float* logits,
                     int participants)
    : m_(model), batch_(batch), logits_(logits), participants_(participants) {
  const int64_t B = batch.rows, H = m_.hidden;
  for (int64_t r = 0; r < B; ++r)
    for (int64_t g = 0; g < m_.kv_heads; ++g)
      for (int64_t s = 0; s < batch.spans(r); ++s) items_.push_back({r, g, s});
  x_.resize(B * H);
  qkv_.resize(B * m_.qkv_width());
  gate_up_.resize(B * 2 * m_.inter);
  partials_.resize(B * m_.heads * batch.max_spans * m_.partial_size());
  tile_chunks_ = kChunksPerThread * participants;
  num_phases_ = kPerLayer * m_.layers + 1;
  phases_ = std::make_unique<Phase[]>(num_phases_);
  int64_t total = 0, max_rows = 0;
  for (int64_t k = 0; k < num_phases_; ++k) {
    const int64_t chunks = phases_[k].chunks = chunks_of(k);
    total += chunks;
    if (const Weight* w = weight_of(k))
      max_rows = std::max(max_rows, (matmul_tile_count(w->rows) + chunks - 1) / chunks * kTileRows);
  }
  taken_ = std::make_unique<std::atomic<uint8_t>[]>(total);
  for (int64_t k = 0, offset = 0; k < num_phases_; offset += phases_[k].chunks, ++k)
    phases_[k].taken = taken_.get() + offset;
  const int64_t attention_out = m_.group() * m_.partial_size() + 2 * m_.head_dim;
  out_size_ = std::max(B * max_rows, attention_out);
  const int64_t widest = std::max({H, m_.attn_width(), m_.inter});
  own_size_ = B * (H + m_.attn_width() + m_.inter) + out_size_ + formats::SplitRows::floats(B, widest);
  splits_.resize(num_phases_);
  for (int64_t k = 0; k < num_phases_; ++k)
    if (const Weight* w = weight_of(k))
      for (const WeightPart& p : w->parts) splits_[k] = splits_[k] || formats::has_int_path(p.qtype);
  scratch_.resize(participants * own_size_);
  const uint8_t* table = m_.embed.data_ptr<uint8_t>();
  const int64_t stride = m_.embed.stride(0);
  formats::visit_format(m_.embed_qtype, [&](auto fmt) {
    for (int64_t r = 0; r < B; ++r)
      formats::expand_row<decltype(fmt)>(table + batch.token_ids[r] * stride, H, &x_[r * H]);
  });
}

const Weight* DecodeJob::weight_of(int64_t phase) const {
  if (phase == num_phases_ - 1) return &m_.weights.back();
  const int64_t layer = phase / kPerLayer;
  switch (phase % kPerLayer) {
    case kQkv: return &m_.weight(layer, 0);
    case kOutput: return &m_.weight(layer, 1);
    case kGateUp: return &m_.weight(layer, 2);
    case kDown: return &m_.weight(layer, 3);
    default: return nullptr;
  }
}

int64_t DecodeJob::chunks_of(int64_t phase) const {
  const Weight* w = weight_of(phase);
  if (w == nullptr) return static_cast<int64_t>(items_.size());
  return std::min(tile_chunks_, matmul_tile_count(w->rows));
}

DecodeJob::Rows DecodeJob::rows_of(const Weight& w, int64_t phase, int64_t chunk) const {
  const int64_t tiles = matmul_tile_count(w.rows), chunks = phases_[phase].chunks;
  const int64_t first = tiles * chunk / chunks * kTileRows;
  const int64_t end = std::min(w.rows, tiles * (chunk + 1) / chunks * kTileRows);
  return {first, end - first};
}

void DecodeJob::work() {
  const int slot = joined_.fetch_add(1, std::memory_order_relaxed);
  if (slot >= participants_) return;
  const int64_t B = batch_.rows;
  float* base = scratch_.data() + slot * own_size_;
  float* attn = base + B * m_.hidden;
  float* act = attn + B * m_.attn_width();
  float* out = act + B * m_.inter;
  const Own own{base, attn, act, out, out + out_size_};
  int64_t waited = 0;
  for (int64_t k = 0; k < num_phases_; ++k) waited += run_phase(k, own);
  waited_ns_.fetch_add(waited, std::memory_order_relaxed);
}

// Runs a phase until it is complete (the one before it is); returns the time spent waiting.
int64_t DecodeJob::run_phase(int64_t k, const Own& own) {
  Phase& phase = phases_[k];
  bool prepared = false;
  int64_t chunk_ns = 0, waited = 0;
  auto attempt = [&](int64_t c) {
    if (!prepared) prologue(k, own);
    prepared = true;
    const int64_t start = now_ns();
    if (compute(k, c, own) && phase.take(c)) {
      commit(k, c, own);
      phase.done.fetch_add(1, std::memory_order_release);
    }
    chunk_ns = now_ns() - start;
  };
  for (int64_t c; (c = phase.next.fetch_add(1, std::memory_order_acq_rel)) < phase.chunks;)
    attempt(c);
  while (!phase.complete()) {
    const int64_t grace = std::max(kMinGraceNs, static_cast<int64_t>(kGraceChunks * chunk_ns));
    const int64_t start = now_ns();
    bool complete = false;
    for (int spins = 0; !(complete = phase.complete()) && now_ns() - start < grace; ++spins) {
      if (spins < kSpinsBeforeYield) _mm_pause();
      else sched_yield();
    }
    waited += now_ns() - start;
    if (complete) break;
    const int64_t open = phase.first_open();
    if (open < 0) continue;  // the last chunks are being committed
    redone_.fetch_add(1, std::memory_order_relaxed);
    attempt(open);
  }
  return waited;
}

// Computes a chunk into the thread's own buffer; false when another thread committed it first
// (a projection chunk stops between tiles then).
bool DecodeJob::compute(int64_t k, int64_t chunk, const Own& own) {
  const Weight* w = weight_of(k);
  if (w == nullptr) {
    attend(k / kPerLayer, items_[chunk], own.out);
    return true;
  }
  const Input in = input_of(k, own);
  const std::optional<formats::SplitRows> split = split_of(k, own);
  const formats::SplitRows* xs = split ? &*split : nullptr;
  const Rows rows = rows_of(*w, k, chunk);
  const int64_t tiles = (rows.count + kTileRows - 1) / kTileRows;
  for (int64_t t = 0; t < tiles; ++t) {
    if (phases_[k].committed(chunk)) return false;
    weight_tile(*w, in.x, in.width, xs, batch_.rows, own.out, rows.count,
                rows.first / kTileRows + t, rows.first);
  }
  return true;
}

DecodeJob::Input DecodeJob::input_of(int64_t k, const Own& own) const {
  if (k != num_phases_ - 1 && k % kPerLayer == kOutput) return {own.attn, m_.attn_width()};
  if (k != num_phases_ - 1 && k % kPerLayer == kDown) return {own.act, m_.inter};
  return {own.normed, m_.hidden};
}

std::optional<formats::SplitRows> DecodeJob::split_of(int64_t k, const Own& own) const {
  const int64_t width = input_of(k, own).width;
  if (!splits_[k] || width % 32 != 0) return std::nullopt;
  return formats::SplitRows::in(own.split, batch_.rows, width);
}

// Writes a computed chunk into the shared buffers: once per chunk, by the thread that took it.
void DecodeJob::commit(int64_t k, int64_t chunk, const Own& own) {
  const Weight* w = weight_of(k);
  if (w == nullptr) return commit_attention(k / kPerLayer, items_[chunk], own.out);
  float* dst = logits_;
  int64_t ld = m_.vocab;
  bool add = false;
  if (k != num_phases_ - 1) {
    switch (k % kPerLayer) {
      case kQkv: dst = qkv_.data(), ld = m_.qkv_width(); break;
      case kGateUp: dst = gate_up_.data(), ld = 2 * m_.inter; break;
      default: dst = x_.data(), ld = m_.hidden, add = true;  // a residual connection
    }
  }
  const Rows rows = rows_of(*w, k, chunk);
  const int32_t* order = nullptr;
  if (k != num_phases_ - 1 && k % kPerLayer == kQkv && m_.qkv_order.defined() &&
      m_.qkv_order.numel() > 0)
    order = m_.qkv_order.data_ptr<int32_t>() + rows.first;
  for (int64_t r = 0; r < batch_.rows; ++r) {
    float* d = dst + r * ld + rows.first;
    const float* s = own.out + r * rows.count;
    if (order != nullptr) {  // Q and K rows as llama.cpp stores them, put in rotate-half order
      for (int64_t j = 0; j < rows.count; ++j) dst[r * ld + order[j]] = s[j];
    } else if (add) {
      for (int64_t j = 0; j < rows.count; ++j) d[j] += s[j];
    } else {
      std::memcpy(d, s, rows.count * sizeof(float));
    }
  }
}

// What a thread computes for itself before its first chunk of a phase: small enough that
// each computing it beats sharing it through one more phase.
// A projection's input is then split for the integer dot products.
void DecodeJob::prologue(int64_t phase, const Own& own) const {
  const int64_t B = batch_.rows, layer = phase / kPerLayer;
  if (phase == num_phases_ - 1) {
    m_.rms_norm(x_.data(), m_.norm(2 * m_.layers), own.normed, B);
  } else {
    switch (phase % kPerLayer) {
      case kQkv: m_.rms_norm(x_.data(), m_.norm(2 * layer), own.normed, B); break;
      case kOutput: merge(own.attn); break;
      case kGateUp: m_.rms_norm(x_.data(), m_.norm(2 * layer + 1), own.normed, B); break;
      case kDown:
        for (int64_t r = 0; r < B; ++r)
          silu_mul(&gate_up_[r * 2 * m_.inter], &gate_up_[r * 2 * m_.inter + m_.inter],
                   own.act + r * m_.inter, m_.inter);
        break;
      default: return;  // attention
    }
  }
  if (const std::optional<formats::SplitRows> split = split_of(phase, own)) {
    const Input in = input_of(phase, own);
    formats::split_rows(in.x, in.width, *split);
  }
}

// One work item into `out`: per query head the span's max score, its sum of exponentials and
// the weighted sum of values, then the new token's rotated K and its V.
void DecodeJob::attend(int64_t layer, const WorkItem& item, float* out) const {
  const int64_t len = batch_.context_lens[item.row], pos = len - 1, hd = m_.head_dim;
  const int64_t group = m_.group(), first_head = item.kv_head * group;
  const float* row = qkv_.data() + item.row * m_.qkv_width();
  alignas(64) float q[kMaxGroup * kMaxHeadDim], scores[kMaxGroup * kSpanTokens];
  for (int64_t h = 0; h < group; ++h) m_.rotate(row + (first_head + h) * hd, pos, q + h * hd);
  float* k_new = out + group * m_.partial_size();
  float* v_new = k_new + hd;
  m_.rotate(row + (m_.heads + item.kv_head) * hd, pos, k_new);
  std::memcpy(v_new, row + (m_.heads + m_.kv_heads + item.kv_head) * hd, hd * sizeof(float));
  // The new token is attended to as the cache will hold it, like every other.
  kv_round(batch_.kv_type, k_new, hd);
  kv_round(batch_.kv_type, v_new, hd);
  const int64_t begin = item.span * kSpanTokens, end = std::min(begin + kSpanTokens, len);
  const float* keys[kSpanTokens];
  const float* values[kSpanTokens];
  // A cache of another type is widened a span at a time (at most 128 KiB here).
  const bool widen = batch_.kv_type != KvType::kF32;
  alignas(64) float widened[2 * kSpanTokens * kMaxHeadDim];
  for (int64_t p = begin; p < end; ++p) {
    const bool fresh = p == pos;  // from the projection: its slot is written at the commit
    const int64_t i = p - begin;
    if (fresh) {
      keys[i] = k_new, values[i] = v_new;
    } else if (!widen) {
      keys[i] = static_cast<const float*>(m_.kv_slot(batch_, item.row, layer, 0, p, item.kv_head));
      values[i] = static_cast<const float*>(m_.kv_slot(batch_, item.row, layer, 1, p, item.kv_head));
    } else {
      float* k = widened + 2 * i * hd;
      kv_load(batch_.kv_type, m_.kv_slot(batch_, item.row, layer, 0, p, item.kv_head), k, hd);
      kv_load(batch_.kv_type, m_.kv_slot(batch_, item.row, layer, 1, p, item.kv_head), k + hd, hd);
      keys[i] = k, values[i] = k + hd;
    }
  }
  float* partial[kMaxGroup];
  for (int64_t h = 0; h < group; ++h) partial[h] = out + h * m_.partial_size();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  m_.attend_span(q, keys, values, end - begin, scale, scores, partial);
}

void DecodeJob::commit_attention(int64_t layer, const WorkItem& item, const float* out) {
  const int64_t hd = m_.head_dim, group = m_.group(), size = m_.partial_size();
  for (int64_t h = 0; h < group; ++h) {
    const int64_t head = item.kv_head * group + h;
    float* dst = partials_.data() + ((item.row * m_.heads + head) * batch_.max_spans + item.span) * size;
    std::memcpy(dst, out + h * size, size * sizeof(float));
  }
  const int64_t len = batch_.context_lens[item.row];
  if ((item.span + 1) * kSpanTokens >= len) {  // the span of the new token
    const float* k_new = out + group * size;
    kv_store(batch_.kv_type, k_new, m_.kv_slot(batch_, item.row, layer, 0, len - 1, item.kv_head), hd);
    kv_store(batch_.kv_type, k_new + hd, m_.kv_slot(batch_, item.row, layer, 1, len - 1, item.kv_head), hd);
  }
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

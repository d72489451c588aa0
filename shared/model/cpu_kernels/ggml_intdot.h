// Integer dot products for the K-quant formats, without giving up fp32's precision.
//
// A K-quant weight is a small integer times its block's float scales, so a row's dot product
// with x is, per 256-weight super-block, d * sum(int16 weight * x) plus a term of x's sums.
// x is split exactly enough for that sum to run on integers: per 256 values a power-of-two
// scale s puts the largest within [8192, 16384), and each value is written as
// s * (hi + lo / 2^14) with hi and lo int16: 27 to 28 bits relative to the block's largest
// value (an fp32 keeps 24), exact for every value at least 1/16 of it. The products then sum
// in int32 lanes with no rounding at all (vpdpwssd: two int16 products per lane), and are
// rounded once, per super-block, when they are widened to float. At one row of x this runs
// 1.8x (Q4_K) and 2.9x (Q6_K) faster than expanding each weight to fp32 and multiplying there
// (docs/benchmarks.md, "Integer products for the K-quants"); at 16 rows Q4_K's is slower, the
// per-block widening then costing a third of the products, and it is used at every batch size
// all the same so that a row's result never depends on its batch.
//
// Bounds: a weight is at most 945 (Q4_K: 63 x 15) or 4,096 (Q6_K: 128 x 32) in magnitude, hi
// at most 16,384, and a lane sums 16 products per super-block: under 2^31.
#pragma once

#include <cmath>
#include <limits>

#include "ggml_formats.h"

namespace crescent::formats {

constexpr int64_t kSplitBlock = 256;
// How far ahead of the unpacking (and the fp32 expansion, ggml_matmul.h) W is prefetched.
constexpr int64_t kAheadBytes = 32768;
constexpr int64_t kIntRows = 4;  // rows of x per pass over a tile of W
constexpr float kLowUnit = 1.0f / 16384.0f;  // lo counts 2^-14 of hi's unit

// Rows of x as split above; row r's values start at r * K. `scale` has one entry per
// kSplitBlock values, `sums` the fp32 sum of each 32 values (for formats with a minimum).
struct SplitRows {
  int64_t rows = 0, K = 0;
  int16_t *hi = nullptr, *lo = nullptr;
  float *scale = nullptr, *sums = nullptr;

  static int64_t blocks(int64_t K) { return (K + kSplitBlock - 1) / kSplitBlock; }
  // Floats of storage `rows` rows of K values take (K a multiple of 32).
  static int64_t floats(int64_t rows, int64_t K) { return rows * (K + blocks(K) + K / 32); }
  // Lays the rows out in `storage`, floats(rows, K) long.
  static SplitRows in(float* storage, int64_t rows, int64_t K) {
    SplitRows s;
    s.rows = rows, s.K = K;
    s.hi = reinterpret_cast<int16_t*>(storage);
    s.lo = s.hi + rows * K;
    s.scale = storage + rows * K;
    s.sums = s.scale + rows * blocks(K);
    return s;
  }
};

inline void split_block(const float* x, int64_t n, int16_t* hi, int16_t* lo, float& scale,
                        float* sums) {
  __m512 amax = _mm512_setzero_ps();
  __mmask16 nan = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
  }
  const float largest = _mm512_reduce_max_ps(amax);
  // A NaN or an infinity has no split: the scale carries it into every product, as an fp32
  // multiply would.
  const bool finite = nan == 0 && std::isfinite(largest);
  // s = 2^(e - 13) for largest = m * 2^e, m in [1, 2); scalef multiplies by 2^-that exactly.
  const int shift = finite && largest > 0.0f ? 13 - std::ilogb(largest) : 0;
  scale = !finite ? std::numeric_limits<float>::quiet_NaN()
                  : largest > 0.0f ? std::ldexp(1.0f, -shift) : 0.0f;
  const __m512 by = _mm512_set1_ps(static_cast<float>(shift));
  for (int64_t i = 0; i < n; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    sums[i / 32] = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
    for (int half = 0; half < 2; ++half) {
      const __m512 v = finite && largest > 0.0f ? _mm512_scalef_ps(half ? b : a, by)
                                                : _mm512_setzero_ps();
      const __m512i h = _mm512_cvtps_epi32(v);  // rounds to nearest
      const __m512 rest = _mm512_sub_ps(v, _mm512_cvtepi32_ps(h));  // exact: |rest| <= 1/2
      const __m512i l = _mm512_cvtps_epi32(_mm512_mul_ps(rest, _mm512_set1_ps(16384.0f)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + i + 16 * half), _mm512_cvtepi32_epi16(h));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + i + 16 * half), _mm512_cvtepi32_epi16(l));
    }
  }
}

// Splits rows of x [rows, K] (row stride ldx) into `out`, laid out for K.
inline void split_rows(const float* x, int64_t ldx, const SplitRows& out) {
  const int64_t K = out.K, nb = SplitRows::blocks(K);
  for (int64_t r = 0; r < out.rows; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t first = b * kSplitBlock, n = std::min(kSplitBlock, K - first);
      split_block(x + r * ldx + first, n, out.hi + r * K + first, out.lo + r * K + first,
                  out.scale[r * nb + b], out.sums + (r * K + first) / 32);
    }
}

inline __m512i dot_pairs(__m512i acc, __m512i w, const int16_t* x) {
  const __m512i v = _mm512_loadu_si512(x);
#ifdef __AVX512VNNI__
  return _mm512_dpwssd_epi32(acc, w, v);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(w, v));
#endif
}

inline __m512i widen_bytes(const uint8_t* p) {
  return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// A super-block as eight vectors of 32 int16 weights (chunk c: weights 32c..32c+31), its
// scale d and, per chunk, the weight of x's sum (formats with a minimum). kTiled: whether
// rows of W go through a tile together at one row of x (as measured: Q6_K's longer unpacking
// overlaps better so, Q4_K's scalar header work does not; more rows of x always take tiles).
template <typename Fmt> struct IntBlock { static constexpr bool kHas = false; };

template <> struct IntBlock<Format<kQ4_K>> {
  static constexpr bool kHas = true, kHasMin = true, kTiled = false;
  // Weight = d * sc * q - dmin * m: the int16 weight is sc * q.
  static float unpack(const uint8_t* b, __m512i w[8], float mins[8]) {
    uint32_t a, m, md;
    std::memcpy(&a, b + 4, 4);
    std::memcpy(&m, b + 8, 4);
    std::memcpy(&md, b + 12, 4);
    const uint64_t sc = (a & 0x3F3F3F3Fu) | uint64_t((md & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u)) << 32;
    const uint64_t mn = (m & 0x3F3F3F3Fu) | uint64_t(((md >> 4) & 0x0F0F0F0Fu) | ((m >> 2) & 0x30303030u)) << 32;
    _mm256_store_ps(mins, _mm256_mul_ps(_mm256_set1_ps(half_at(b + 2)), bytes8(mn)));
    for (int p = 0; p < 4; ++p) {
      const __m512i q = widen_bytes(b + 16 + 32 * p);
      const auto s0 = static_cast<int16_t>((sc >> (16 * p)) & 0xFF);
      const auto s1 = static_cast<int16_t>((sc >> (16 * p + 8)) & 0xFF);
      w[2 * p] = _mm512_mullo_epi16(_mm512_and_si512(q, _mm512_set1_epi16(15)), _mm512_set1_epi16(s0));
      w[2 * p + 1] = _mm512_mullo_epi16(_mm512_srli_epi16(q, 4), _mm512_set1_epi16(s1));
    }
    return half_at(b);
  }
};

template <> struct IntBlock<Format<kQ6_K>> {
  static constexpr bool kHas = true, kHasMin = false, kTiled = true;
  // Weight = d * sc * (q - 32), a scale per 16 weights: the int16 weight is sc * (q - 32).
  static float unpack(const uint8_t* b, __m512i w[8], float*) {
    // 16 int8 scales as int16 lanes 0-15 (the block ends 2 bytes after them: no wider load).
    const __m512i scales = _mm512_zextsi256_si512(
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192))));
    for (int h = 0; h < 2; ++h) {
      const __m512i ql[2] = {widen_bytes(b + 64 * h), widen_bytes(b + 64 * h + 32)};
      const __m512i qh = widen_bytes(b + 128 + 32 * h);
      for (int s = 0; s < 4; ++s) {
        const int c = 4 * h + s;
        const __m512i low = s < 2 ? _mm512_and_si512(ql[s % 2], _mm512_set1_epi16(15))
                                  : _mm512_srli_epi16(ql[s % 2], 4);
        const __m512i high = _mm512_slli_epi16(
            _mm512_and_si512(_mm512_srli_epi16(qh, 2 * s), _mm512_set1_epi16(3)), 4);
        const __m512i q = _mm512_sub_epi16(_mm512_or_si512(low, high), _mm512_set1_epi16(32));
        // Lanes 0-15 take scale 2c, lanes 16-31 scale 2c + 1.
        const __m512i pick = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(int16_t(2 * c)),
                                                     _mm512_set1_epi16(int16_t(2 * c + 1)));
        w[c] = _mm512_mullo_epi16(q, _mm512_permutexvar_epi16(pick, scales));
      }
    }
    return half_at(b + 208);
  }
};

// y[i * ldy + j] = x_i . W_j for MR rows of x (split, starting at row x0) and NR rows of W.
// Per super-block and per pair: 16 integer dot products, widened once to float.
template <typename Fmt, int MR, int NR>
void int_tile(const SplitRows& xs, int64_t x0, const uint8_t* w, int64_t row_bytes, float* y,
              int64_t ldy) {
  using Block = IntBlock<Fmt>;
  const int64_t K = xs.K, nb = K / kSplitBlock;
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int j = 0; j < NR; ++j) {
      const uint8_t* block = w + j * row_bytes + b * Fmt::kBytes;
      for (int64_t line = 0; line < Fmt::kBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(block + kAheadBytes + line), _MM_HINT_T0);
      __m512i wv[8];
      alignas(32) float mins[8];
      const float d = Block::unpack(block, wv, mins);
      for (int i = 0; i < MR; ++i) {
        const int64_t r = x0 + i, at = r * K + b * kSplitBlock;
        // Two chains per plane, so a product waits for one other, not seven (integer sums
        // are exact in any order).
        __m512i hi[2], lo[2];
        for (int c = 0; c < 2; ++c) {
          hi[c] = _mm512_madd_epi16(wv[c], _mm512_loadu_si512(xs.hi + at + 32 * c));
          lo[c] = _mm512_madd_epi16(wv[c], _mm512_loadu_si512(xs.lo + at + 32 * c));
        }
        for (int c = 2; c < 8; ++c) {
          hi[c % 2] = dot_pairs(hi[c % 2], wv[c], xs.hi + at + 32 * c);
          lo[c % 2] = dot_pairs(lo[c % 2], wv[c], xs.lo + at + 32 * c);
        }
        const __m512 sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo[0], lo[1])),
                                           _mm512_set1_ps(kLowUnit),
                                           _mm512_cvtepi32_ps(_mm512_add_epi32(hi[0], hi[1])));
        const float s = xs.scale[r * nb + b];
        acc[i][j] = _mm512_fmadd_ps(sum, _mm512_set1_ps(d * s), acc[i][j]);
        if constexpr (Block::kHasMin)  // lanes 0-7 less the chunks' minimums times x's sums
          acc[i][j] = _mm512_fnmadd_ps(_mm512_zextps256_ps512(_mm256_load_ps(mins)),
                                       _mm512_zextps256_ps512(_mm256_loadu_ps(xs.sums + at / 32)),
                                       acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]);
}

template <typename Fmt, int NR>
void int_tile_rows(const SplitRows& xs, int64_t x0, int64_t mr, const uint8_t* w,
                   int64_t row_bytes, float* y, int64_t ldy) {
  switch (mr) {
    case 1: return int_tile<Fmt, 1, NR>(xs, x0, w, row_bytes, y, ldy);
    case 2: return int_tile<Fmt, 2, NR>(xs, x0, w, row_bytes, y, ldy);
    case 3: return int_tile<Fmt, 3, NR>(xs, x0, w, row_bytes, y, ldy);
    default: static_assert(kIntRows == 4); return int_tile<Fmt, 4, NR>(xs, x0, w, row_bytes, y, ldy);
  }
}

}  // namespace crescent::formats

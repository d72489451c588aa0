// Decode attention over one span of a sequence's context: the query heads that share a KV
// head, against keys and values wherever the paged cache holds them.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "vector_math.h"

namespace crescent {

// The four sums of four vectors, in one register: fewer shuffles than four full reductions.
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 lanes = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 halves = _mm256_add_ps(_mm512_castps512_ps256(lanes),
                                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lanes), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1));
}

// For each of the G query heads (q: G x HD, contiguous): the span's max score, the sum of
// e^(score - max), and the values weighted by those terms, written to out[h] as
// [max, sum, HD weighted values]. keys[p] and values[p] point at position p's vectors;
// positions are taken four at a time (a missing fourth counts as a zero key), so a score
// never depends on where the span ends.
template <int HD, int G>
void attend_span(const float* q, const float* const* keys, const float* const* values, int64_t n,
                 float scale, float* scores /* G x n, padded to 4 */, float* const* out) {
  constexpr int C = HD / 16;
  __m512 qv[G][C];
  for (int h = 0; h < G; ++h)
    for (int c = 0; c < C; ++c) qv[h][c] = _mm512_loadu_ps(q + h * HD + c * 16);
  const int64_t stride = (n + 3) & ~int64_t{3};
  const __m128 vscale = _mm_set1_ps(scale);
  for (int64_t p = 0; p < n; p += 4) {
    __m512 acc[G][4];
    for (int j = 0; j < 4; ++j) {
      for (int h = 0; h < G; ++h) acc[h][j] = _mm512_setzero_ps();
      if (p + j >= n) continue;
      const float* k = keys[p + j];
      for (int c = 0; c < C; ++c) {
        const __m512 kc = _mm512_loadu_ps(k + c * 16);
        for (int h = 0; h < G; ++h) acc[h][j] = _mm512_fmadd_ps(qv[h][c], kc, acc[h][j]);
      }
    }
    for (int h = 0; h < G; ++h)
      _mm_storeu_ps(scores + h * stride + p,
                    _mm_mul_ps(reduce4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]), vscale));
  }
  for (int h = 0; h < G; ++h) {
    out[h][0] = max_of(scores + h * stride, n);
    out[h][1] = exp_shifted(scores + h * stride, n, out[h][0]);
  }
  __m512 vacc[G][C];
  for (int h = 0; h < G; ++h)
    for (int c = 0; c < C; ++c) vacc[h][c] = _mm512_setzero_ps();
  for (int64_t p = 0; p < n; ++p) {
    const float* v = values[p];
    for (int c = 0; c < C; ++c) {
      const __m512 vc = _mm512_loadu_ps(v + c * 16);
      for (int h = 0; h < G; ++h)
        vacc[h][c] = _mm512_fmadd_ps(_mm512_set1_ps(scores[h * stride + p]), vc, vacc[h][c]);
    }
  }
  for (int h = 0; h < G; ++h)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out[h] + 2 + c * 16, vacc[h][c]);
}

using AttendSpan = void (*)(const float*, const float* const*, const float* const*, int64_t, float,
                            float*, float* const*);

// The instance for a head size and group size, or nullptr where there is none.
template <int HD>
AttendSpan attend_span_for_group(int64_t group) {
  switch (group) {
    case 1: return attend_span<HD, 1>;
    case 2: return attend_span<HD, 2>;
    case 3: return attend_span<HD, 3>;
    case 4: return attend_span<HD, 4>;
    case 5: return attend_span<HD, 5>;
    case 6: return attend_span<HD, 6>;
    case 7: return attend_span<HD, 7>;
    case 8: return attend_span<HD, 8>;
    default: return nullptr;
  }
}

inline AttendSpan attend_span_for(int64_t head_dim, int64_t group) {
  if (head_dim == 64) return attend_span_for_group<64>(group);
  if (head_dim == 128) return attend_span_for_group<128>(group);
  return nullptr;
}

}  // namespace crescent

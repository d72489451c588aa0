// Small AVX-512 vector routines of the fused decode step: norms, rotary embedding, softmax
// pieces and the SwiGLU activation. Widths are multiples of 16 floats unless a routine says
// otherwise; each routine sums in a fixed order, so equal inputs give equal outputs.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

namespace crescent {

// e^x for every lane, to within about 2 ulp: 2^n * e^r with n = round(x / ln 2), r the rest,
// e^r from a degree-7 polynomial (Cephes' coefficients). Inputs are clamped to where float
// neither overflows nor flushes, so -inf gives a tiny positive value, never NaN.
inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

// Lanes of the last, partial vector of an n-float array (all 16 when n is a multiple).
inline __mmask16 tail_mask(int64_t n, int64_t i) {
  const int64_t left = n - i;
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

inline float dot(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  return _mm512_reduce_add_ps(acc);
}

// y += a * x
inline void axpy(float a, const float* x, float* y, int64_t n) {
  const __m512 va = _mm512_set1_ps(a);
  for (int64_t i = 0; i < n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
}

inline void scale_in_place(float* x, float a, int64_t n) {
  const __m512 va = _mm512_set1_ps(a);
  for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(va, _mm512_loadu_ps(x + i)));
}

// Any n.
inline float max_of(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16)
    m = _mm512_mask_max_ps(m, tail_mask(n, i), m, _mm512_maskz_loadu_ps(tail_mask(n, i), x + i));
  return _mm512_reduce_max_ps(m);
}

// x[i] = e^(x[i] - shift) for any n; returns their sum.
inline float exp_shifted(float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n, i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s));
    _mm512_mask_storeu_ps(x + i, m, e);
    sum = _mm512_mask_add_ps(sum, m, sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

// out = x / rms(x) * weight, the rms over the n values of the row.
inline void rms_norm_row(const float* x, const float* weight, float* out, int64_t n, float eps) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  const float inv = 1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / static_cast<float>(n) + eps);
  const __m512 vinv = _mm512_set1_ps(inv);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), vinv);
    _mm512_storeu_ps(out + i, _mm512_mul_ps(v, _mm512_loadu_ps(weight + i)));
  }
}

// Rotary embedding of one head: out = x * cos + swap_halves(x) * sin, where sin has its
// first half negated (shared/model/layers.py keeps the tables that way). d is a multiple of 32.
inline void rotate_half(const float* x, const float* cos, const float* sin, float* out, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; i += 16) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + half + i);
    _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_mul_ps(a, _mm512_loadu_ps(cos + i)),
                                            _mm512_mul_ps(b, _mm512_loadu_ps(sin + i))));
    _mm512_storeu_ps(out + half + i,
                     _mm512_add_ps(_mm512_mul_ps(b, _mm512_loadu_ps(cos + half + i)),
                                   _mm512_mul_ps(a, _mm512_loadu_ps(sin + half + i))));
  }
}

// out = silu(gate) * up = gate / (1 + e^-gate) * up
inline void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 sig = _mm512_div_ps(g, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(sig, _mm512_loadu_ps(up + i)));
  }
}

}  // namespace crescent

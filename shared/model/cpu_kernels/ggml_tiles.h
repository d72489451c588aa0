// The inner loops of Crescent's few-row matmuls over ggml-quantized weights, shared by the
// standalone op (ggml_gemm.cpp) and the fused decode step (decode_step.cpp).
//
// Each weight is expanded with the same operations and rounding as gguf's reference
// dequantizer (a multiply, then an add, never fused), so the weights multiplied are
// bit-identical to the fp32 copy. The summation order of a row's dot products is fixed by the
// tile code alone, so a row's result depends neither on the rest of the batch nor on how the
// tiles are split between threads.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace crescent {

// ggml's type ids, which are also the values the Python side passes.
constexpr int64_t kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8;
constexpr int64_t kBlock = 32;  // weights per block, for all three types
constexpr int kRowsPerTile = 3;  // weight rows expanded together: 3 x 8 accumulators fit
constexpr int kMaxXRows = 8;  // rows of x per pass over a tile
// How far ahead of the expansion the weight stream is prefetched. The hardware prefetcher
// alone leaves the loop waiting on memory; a few KiB ahead keeps it fed (to compare distances,
// change this and rerun bench/ggml_gemm.py, which rebuilds the library).
constexpr int64_t kPrefetchBytes = 8192;

inline int64_t scale_count(int64_t qtype) { return qtype == kQ4_1 ? 2 : 1; }
inline int64_t quant_bytes(int64_t qtype) { return qtype == kQ8_0 ? 32 : 16; }
// Bytes of one block in the file (fp16 scales) and once repacked (fp32 scales).
inline int64_t ggml_block_bytes(int64_t qtype) { return 2 * scale_count(qtype) + quant_bytes(qtype); }
inline int64_t packed_block_bytes(int64_t qtype) { return 4 * scale_count(qtype) + quant_bytes(qtype); }
inline bool known_qtype(int64_t qtype) { return qtype == kQ4_0 || qtype == kQ4_1 || qtype == kQ8_0; }

template <int64_t QT>
constexpr int64_t kPacked = QT == kQ4_1 ? 24 : QT == kQ4_0 ? 20 : 36;

inline float scale_at(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, sizeof f);
  return f;
}

// The 32 weights of one packed block as two vectors: weights 0..15 and 16..31. For 4-bit
// types, low nibbles are weights 0..15 and high nibbles 16..31, as in ggml; the 16 values a
// block can take are computed once, and each nibble selects its value with a permute, which
// reads only an index's low 4 bits.
template <int64_t QT>
inline void expand_block(const uint8_t* p, __m512& lo, __m512& hi) {
  const __m512 d = _mm512_set1_ps(scale_at(p));
  if constexpr (QT == kQ8_0) {
    const auto* qs = reinterpret_cast<const __m128i*>(p + 4);
    lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(qs))));
    hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(qs + 1))));
  } else {
    const __m512 levels =
        _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 values;
    if constexpr (QT == kQ4_1) {
      values = _mm512_add_ps(_mm512_mul_ps(d, levels), _mm512_set1_ps(scale_at(p + 4)));
    } else {  // Q4_0: d * (q - 8)
      values = _mm512_mul_ps(d, _mm512_sub_ps(levels, _mm512_set1_ps(8.0f)));
    }
    const auto* qs = reinterpret_cast<const __m128i*>(p + 4 * scale_count(QT));
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs));
    lo = _mm512_permutexvar_ps(bytes, values);
    hi = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), values);
  }
}

// y[i, j] (+)= sum_k x[i, k] * w[j, k] for MR rows of x and NR packed weight rows. With ADD the
// products are added to what y holds (a residual connection), else they replace it.
template <int64_t QT, int MR, int NR, bool ADD>
void tile(const float* x, int64_t ldx, const uint8_t* w, int64_t row_bytes, int64_t K, float* y,
          int64_t ldy) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < K / kBlock; ++b) {
    __m512 lo[NR], hi[NR];
    for (int j = 0; j < NR; ++j) {
      const uint8_t* block = w + j * row_bytes + b * kPacked<QT>;
      _mm_prefetch(reinterpret_cast<const char*>(block + kPrefetchBytes), _MM_HINT_T0);
      expand_block<QT>(block, lo[j], hi[j]);
    }
    const float* xb = x + b * kBlock;
    for (int i = 0; i < MR; ++i) {
      const __m512 x_lo = _mm512_loadu_ps(xb + i * ldx);
      const __m512 x_hi = _mm512_loadu_ps(xb + i * ldx + 16);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(x_lo, lo[j], acc[i][j]);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(x_hi, hi[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      const float sum = _mm512_reduce_add_ps(acc[i][j]);
      if constexpr (ADD) y[i * ldy + j] += sum;
      else y[i * ldy + j] = sum;
    }
}

template <int64_t QT, int NR, bool ADD>
void tile_rows(int64_t mr, const float* x, int64_t ldx, const uint8_t* w, int64_t row_bytes,
               int64_t K, float* y, int64_t ldy) {
  switch (mr) {
    case 1: return tile<QT, 1, NR, ADD>(x, ldx, w, row_bytes, K, y, ldy);
    case 2: return tile<QT, 2, NR, ADD>(x, ldx, w, row_bytes, K, y, ldy);
    case 3: return tile<QT, 3, NR, ADD>(x, ldx, w, row_bytes, K, y, ldy);
    case 4: return tile<QT, 4, NR, ADD>(x, ldx, w, row_bytes, K, y, ldy);
    case 5: return tile<QT, 5, NR, ADD>(x, ldx, w, row_bytes, K, y, ldy);
    case 6: return tile<QT, 6, NR, ADD>(x, ldx, w, row_bytes, K, y, ldy);
    case 7: return tile<QT, 7, NR, ADD>(x, ldx, w, row_bytes, K, y, ldy);
    default: return tile<QT, 8, NR, ADD>(x, ldx, w, row_bytes, K, y, ldy);
  }
}

// Tiles [t0, t1) of y[M, N] (row stride ldy) (+)= x[M, K] . W[N, K]^T, on the calling thread.
// y's columns start at weight row `first_row` (0: y holds every output column).
template <int64_t QT, bool ADD>
void gemm_tiles(const float* x, int64_t ldx, int64_t M, const uint8_t* w, int64_t row_bytes,
                int64_t N, int64_t K, float* y, int64_t ldy, int64_t t0, int64_t t1,
                int64_t first_row = 0) {
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n0 = t * kRowsPerTile;
    const int64_t nr = std::min<int64_t>(kRowsPerTile, N - n0);
    const uint8_t* wt = w + n0 * row_bytes;
    for (int64_t m0 = 0; m0 < M; m0 += kMaxXRows) {
      const int64_t mr = std::min<int64_t>(kMaxXRows, M - m0);
      const float* xm = x + m0 * ldx;
      float* ym = y + m0 * ldy + (n0 - first_row);
      if (nr == kRowsPerTile) {
        tile_rows<QT, kRowsPerTile, ADD>(mr, xm, ldx, wt, row_bytes, K, ym, ldy);
      } else {
        for (int64_t j = 0; j < nr; ++j)
          tile_rows<QT, 1, ADD>(mr, xm, ldx, wt + j * row_bytes, row_bytes, K, ym + j, ldy);
      }
    }
  }
}

inline int64_t tile_count(int64_t N) { return (N + kRowsPerTile - 1) / kRowsPerTile; }

}  // namespace crescent

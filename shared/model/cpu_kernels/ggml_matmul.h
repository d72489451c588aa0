// y[M, N] = x[M, K] . W[N, K]^T for few rows of x, W read in its file's blocks (ggml_rows.h).
//
// A decode step multiplies a handful of rows by every weight, so it is bound by how fast the
// weights reach the cores: each weight is expanded once into registers (a block's scales
// decoded once per row) and multiplied there by up to kMaxXRows rows of x. A row's dot
// products are summed in an order fixed by K alone, so its result depends neither on the rest
// of the batch nor on how rows of W are split between threads.
#pragma once

#include <algorithm>

#include "ggml_intdot.h"
#include "ggml_rows.h"

namespace crescent::formats {

constexpr int kTileRows = 3;  // rows of W expanded together: 3 x 8 accumulators fit
constexpr int kMaxXRows = 8;  // rows of x per pass over a tile

template <typename Fmt, int MR, int NR>
void block_tile(const float* x, int64_t ldx, const uint8_t* w, int64_t row_bytes, int64_t K,
                float* y, int64_t ldy) {
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  typename Fmt::Head head[NR];
  for (int64_t b = 0; b < K / Fmt::kWeights; ++b) {
    for (int j = 0; j < NR; ++j) {
      const uint8_t* block = w + j * row_bytes + b * Fmt::kBytes;
      _mm_prefetch(reinterpret_cast<const char*>(block + kAheadBytes), _MM_HINT_T0);
      Fmt::head(block, head[j]);
    }
    for (int c = 0; c < Fmt::kWeights / kChunk; ++c) {
      __m512 lo[NR], hi[NR];
      for (int j = 0; j < NR; ++j)
        Fmt::expand(w + j * row_bytes + b * Fmt::kBytes, head[j], c, lo[j], hi[j]);
      const float* xb = x + b * Fmt::kWeights + c * kChunk;
      for (int i = 0; i < MR; ++i) {
        const __m512 x_lo = _mm512_loadu_ps(xb + i * ldx);
        const __m512 x_hi = _mm512_loadu_ps(xb + i * ldx + 16);
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(x_lo, lo[j], acc[i][j]);
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(x_hi, hi[j], acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]);
}

template <typename Fmt, int NR>
void block_tile_rows(int64_t mr, const float* x, int64_t ldx, const uint8_t* w,
                     int64_t row_bytes, int64_t K, float* y, int64_t ldy) {
  switch (mr) {
    case 1: return block_tile<Fmt, 1, NR>(x, ldx, w, row_bytes, K, y, ldy);
    case 2: return block_tile<Fmt, 2, NR>(x, ldx, w, row_bytes, K, y, ldy);
    case 3: return block_tile<Fmt, 3, NR>(x, ldx, w, row_bytes, K, y, ldy);
    case 4: return block_tile<Fmt, 4, NR>(x, ldx, w, row_bytes, K, y, ldy);
    case 5: return block_tile<Fmt, 5, NR>(x, ldx, w, row_bytes, K, y, ldy);
    case 6: return block_tile<Fmt, 6, NR>(x, ldx, w, row_bytes, K, y, ldy);
    case 7: return block_tile<Fmt, 7, NR>(x, ldx, w, row_bytes, K, y, ldy);
    default: return block_tile<Fmt, 8, NR>(x, ldx, w, row_bytes, K, y, ldy);
  }
}

// y[:, 0:nr] = x . W[0:nr]^T for nr <= kTileRows rows of W starting at `w`, on the calling
// thread: one tile, which may start at any row (a row's sums do not depend on its neighbours).
template <typename Fmt>
void matmul_rows(const float* x, int64_t ldx, int64_t M, const uint8_t* w, int64_t row_bytes,
                 int64_t nr, int64_t K, float* y, int64_t ldy) {
  for (int64_t m0 = 0; m0 < M; m0 += kMaxXRows) {
    const int64_t mr = std::min<int64_t>(kMaxXRows, M - m0);
    const float* xm = x + m0 * ldx;
    float* ym = y + m0 * ldy;
    if (nr == kTileRows) {
      block_tile_rows<Fmt, kTileRows>(mr, xm, ldx, w, row_bytes, K, ym, ldy);
    } else {
      for (int64_t j = 0; j < nr; ++j)
        block_tile_rows<Fmt, 1>(mr, xm, ldx, w + j * row_bytes, row_bytes, K, ym + j, ldy);
    }
  }
}

// As matmul_rows, from x split for integer dot products (ggml_intdot.h), for the formats
// that have them; `xs` holds the same M rows.
template <typename Fmt>
void int_matmul_rows(const SplitRows& xs, int64_t M, const uint8_t* w, int64_t row_bytes,
                     int64_t nr, float* y, int64_t ldy) {
  for (int64_t m0 = 0; m0 < M; m0 += kIntRows) {
    const int64_t mr = std::min<int64_t>(kIntRows, M - m0);
    float* ym = y + m0 * ldy;
    // One row of x stays in L1 whichever way; more are read once per tile of W rows.
    if (nr == kTileRows && (IntBlock<Fmt>::kTiled || M > 1)) {
      int_tile_rows<Fmt, kTileRows>(xs, m0, mr, w, row_bytes, ym, ldy);
    } else {
      for (int64_t j = 0; j < nr; ++j)
        int_tile_rows<Fmt, 1>(xs, m0, mr, w + j * row_bytes, row_bytes, ym + j, ldy);
    }
  }
}

// The integer path where the format has one and `xs` is given, else the fp32 one.
template <typename Fmt>
void matmul_rows_best(const float* x, int64_t ldx, const SplitRows* xs, int64_t M,
                      const uint8_t* w, int64_t row_bytes, int64_t nr, int64_t K, float* y,
                      int64_t ldy) {
  if constexpr (IntBlock<Fmt>::kHas) {
    if (xs != nullptr) return int_matmul_rows<Fmt>(*xs, M, w, row_bytes, nr, y, ldy);
  }
  matmul_rows<Fmt>(x, ldx, M, w, row_bytes, nr, K, y, ldy);
}

// Whether rows of this type multiply on integers (and so want x split).
inline bool has_int_path(int64_t qtype) {
  bool has = false;
  for (int64_t t : kSupportedTypes)
    if (t == qtype) visit_format(qtype, [&](auto fmt) { has = IntBlock<decltype(fmt)>::kHas; });
  return has;
}

// Tiles [t0, t1) of y[M, N] (row stride ldy), on the calling thread; tile t covers W's rows
// t * kTileRows onwards.
template <typename Fmt>
void matmul_tiles(const float* x, int64_t ldx, const SplitRows* xs, int64_t M, const uint8_t* w,
                  int64_t row_bytes, int64_t N, int64_t K, float* y, int64_t ldy, int64_t t0,
                  int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n0 = t * kTileRows;
    const int64_t nr = std::min<int64_t>(kTileRows, N - n0);
    matmul_rows_best<Fmt>(x, ldx, xs, M, w + n0 * row_bytes, row_bytes, nr, K, y + n0, ldy);
  }
}

inline int64_t matmul_tile_count(int64_t N) { return (N + kTileRows - 1) / kTileRows; }

}  // namespace crescent::formats

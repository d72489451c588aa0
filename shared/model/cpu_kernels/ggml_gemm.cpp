// Few-row matmuls that read ggml-quantized weights directly: y[M, N] = x[M, K] . W[N, K]^T.
//
// A decode step multiplies a handful of rows by every weight of the model, so on a CPU it is
// bound by how fast weights reach the cores. Reading the 4- or 8-bit blocks that the GGUF file
// ships, instead of their fp32 expansion, moves about five times fewer bytes. Each weight is
// expanded with the same operations and rounding as gguf's reference dequantizer (a multiply,
// then an add, never fused), so the weights multiplied are bit-identical to the fp32 copy. Only
// the summation order differs from a BLAS, and it is the same for every row of x whatever M
// is: a row's result does not depend on what else is in the batch.
//
// Blocks are repacked once at load time with their fp16 scales widened to fp32, which the
// inner loop can then broadcast straight from memory.
//
// Built for AVX-512 (F, BW, VL, DQ) and loaded into torch as the `crescent` op library.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

// ggml's type ids, which are also the values the Python side passes.
constexpr int64_t kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8;
constexpr int64_t kBlock = 32;  // weights per block, for all three types
constexpr int kRowsPerTile = 3;  // weight rows expanded together: 3 x 8 accumulators fit
constexpr int kMaxXRows = 8;  // rows of x per pass over a tile
// How far ahead of the expansion the weight stream is prefetched. The hardware prefetcher
// alone leaves the loop waiting on memory; a few KiB ahead keeps it fed (to compare distances,
// change this and rerun bench/ggml_gemm.py, which rebuilds the library).
constexpr int64_t kPrefetchBytes = 8192;

int64_t scale_count(int64_t qtype) { return qtype == kQ4_1 ? 2 : 1; }

int64_t quant_bytes(int64_t qtype) { return qtype == kQ8_0 ? 32 : 16; }

void check_qtype(int64_t qtype) {
  TORCH_CHECK(qtype == kQ4_0 || qtype == kQ4_1 || qtype == kQ8_0,
              "ggml: unsupported ggml type ", qtype, " (supported: Q4_0=2, Q4_1=3, Q8_0=8)");
}

// Bytes of one block in the file (fp16 scales) and once repacked (fp32 scales).
int64_t ggml_block_bytes(int64_t qtype) { return 2 * scale_count(qtype) + quant_bytes(qtype); }
int64_t packed_block_bytes(int64_t qtype) { return 4 * scale_count(qtype) + quant_bytes(qtype); }

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

// y[i, j] = sum_k x[i, k] * w[j, k] for MR rows of x and NR packed weight rows.
template <int64_t QT, int MR, int NR>
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
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]);
}

template <int64_t QT, int NR>
void tile_rows(int64_t mr, const float* x, int64_t ldx, const uint8_t* w, int64_t row_bytes,
               int64_t K, float* y, int64_t ldy) {
  switch (mr) {
    case 1: return tile<QT, 1, NR>(x, ldx, w, row_bytes, K, y, ldy);
    case 2: return tile<QT, 2, NR>(x, ldx, w, row_bytes, K, y, ldy);
    case 3: return tile<QT, 3, NR>(x, ldx, w, row_bytes, K, y, ldy);
    case 4: return tile<QT, 4, NR>(x, ldx, w, row_bytes, K, y, ldy);
    case 5: return tile<QT, 5, NR>(x, ldx, w, row_bytes, K, y, ldy);
    case 6: return tile<QT, 6, NR>(x, ldx, w, row_bytes, K, y, ldy);
    case 7: return tile<QT, 7, NR>(x, ldx, w, row_bytes, K, y, ldy);
    default: return tile<QT, 8, NR>(x, ldx, w, row_bytes, K, y, ldy);
  }
}

template <int64_t QT>
void gemm(const float* x, int64_t ldx, int64_t M, const uint8_t* w, int64_t row_bytes,
          int64_t N, int64_t K, float* y) {
  const int64_t tiles = (N + kRowsPerTile - 1) / kRowsPerTile;
  at::parallel_for(0, tiles, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * kRowsPerTile;
      const int64_t nr = std::min<int64_t>(kRowsPerTile, N - n0);
      const uint8_t* wt = w + n0 * row_bytes;
      for (int64_t m0 = 0; m0 < M; m0 += kMaxXRows) {
        const int64_t mr = std::min<int64_t>(kMaxXRows, M - m0);
        const float* xm = x + m0 * ldx;
        float* ym = y + m0 * N + n0;
        if (nr == kRowsPerTile) {
          tile_rows<QT, kRowsPerTile>(mr, xm, ldx, wt, row_bytes, K, ym, N);
        } else {
          for (int64_t j = 0; j < nr; ++j)
            tile_rows<QT, 1>(mr, xm, ldx, wt + j * row_bytes, row_bytes, K, ym + j, N);
        }
      }
    }
  });
}

// A [N, bytes] uint8 matrix whose rows hold K weights in blocks of `block_bytes` each.
void check_rows(const at::Tensor& rows, int64_t qtype, int64_t K, int64_t block_bytes,
                const char* what) {
  TORCH_CHECK(K > 0 && K % kBlock == 0, "ggml: K must be a positive multiple of 32, got ", K);
  TORCH_CHECK(rows.device().is_cpu() && rows.dim() == 2 && rows.scalar_type() == at::kByte &&
                  rows.is_contiguous(),
              "ggml: ", what, " must be a contiguous uint8 [N, bytes] CPU tensor");
  TORCH_CHECK(rows.size(1) == K / kBlock * block_bytes, "ggml: a row of ", rows.size(1),
              " bytes does not hold ", K, " ", what, " of type ", qtype);
}

void check_packed(const at::Tensor& packed, int64_t qtype, int64_t K) {
  check_qtype(qtype);
  check_rows(packed, qtype, K, packed_block_bytes(qtype), "packed weights");
}

at::Tensor ggml_gemm(const at::Tensor& x, const at::Tensor& packed, int64_t qtype, int64_t K) {
  check_packed(packed, qtype, K);
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kFloat &&
                  x.size(1) == K && x.stride(1) == 1,
              "ggml_gemm: x must be a float32 [M, ", K, "] CPU tensor with contiguous rows");
  const int64_t M = x.size(0), N = packed.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const float* xp = x.data_ptr<float>();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const int64_t ldx = x.stride(0), row_bytes = packed.size(1);
  if (qtype == kQ4_1) gemm<kQ4_1>(xp, ldx, M, wp, row_bytes, N, K, yp);
  else if (qtype == kQ4_0) gemm<kQ4_0>(xp, ldx, M, wp, row_bytes, N, K, yp);
  else gemm<kQ8_0>(xp, ldx, M, wp, row_bytes, N, K, yp);
  return y;
}

// The file's blocks [N, K / 32 * ggml bytes] -> the layout ggml_gemm reads.
at::Tensor ggml_repack(const at::Tensor& blocks, int64_t qtype, int64_t K) {
  check_qtype(qtype);
  check_rows(blocks, qtype, K, ggml_block_bytes(qtype), "ggml blocks");
  const int64_t count = blocks.size(0) * (K / kBlock), scales = scale_count(qtype);
  const int64_t in_bytes = ggml_block_bytes(qtype), out_bytes = packed_block_bytes(qtype);
  at::Tensor out = at::empty({blocks.size(0), K / kBlock * out_bytes}, blocks.options());
  const uint8_t* src = blocks.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  for (int64_t b = 0; b < count; ++b, src += in_bytes, dst += out_bytes) {
    for (int64_t s = 0; s < scales; ++s) {
      uint16_t half;
      std::memcpy(&half, src + 2 * s, sizeof half);
      const float wide = _cvtsh_ss(half);
      std::memcpy(dst + 4 * s, &wide, sizeof wide);
    }
    std::memcpy(dst + 4 * scales, src + 2 * scales, quant_bytes(qtype));
  }
  return out;
}

template <int64_t QT>
void dequantize_rows(const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, float* out) {
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t b = 0; b < K / kBlock; ++b) {
        __m512 lo, hi;
        expand_block<QT>(w + n * row_bytes + b * kPacked<QT>, lo, hi);
        _mm512_storeu_ps(out + n * K + b * kBlock, lo);
        _mm512_storeu_ps(out + n * K + b * kBlock + 16, hi);
      }
    }
  });
}

// The fp32 weights ggml_gemm multiplies by: what checks its expansion against the reference.
at::Tensor ggml_dequantize(const at::Tensor& packed, int64_t qtype, int64_t K) {
  check_packed(packed, qtype, K);
  const int64_t N = packed.size(0), row_bytes = packed.size(1);
  at::Tensor out = at::empty({N, K}, packed.options().dtype(at::kFloat));
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  if (qtype == kQ4_1) dequantize_rows<kQ4_1>(wp, row_bytes, N, K, op);
  else if (qtype == kQ4_0) dequantize_rows<kQ4_0>(wp, row_bytes, N, K, op);
  else dequantize_rows<kQ8_0>(wp, row_bytes, N, K, op);
  return out;
}

}  // namespace

TORCH_LIBRARY(crescent, m) {
  m.def("ggml_repack(Tensor blocks, int qtype, int k) -> Tensor", &ggml_repack);
  m.def("ggml_gemm(Tensor x, Tensor packed, int qtype, int k) -> Tensor", &ggml_gemm);
  m.def("ggml_dequantize(Tensor packed, int qtype, int k) -> Tensor", &ggml_dequantize);
}

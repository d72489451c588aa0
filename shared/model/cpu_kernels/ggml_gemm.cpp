// Few-row matmuls that read ggml-quantized weights directly: y[M, N] = x[M, K] . W[N, K]^T.
//
// A decode step multiplies a handful of rows by every weight of the model, so on a CPU it is
// bound by how fast weights reach the cores. Reading the 4- or 8-bit blocks that the GGUF file
// ships, instead of their fp32 expansion, moves about five times fewer bytes. The expansion and
// the tiles are in ggml_tiles.h: weights bit-identical to the fp32 copy, and a row's result
// independent of what else is in the batch.
//
// Blocks are repacked once at load time with their fp16 scales widened to fp32, which the
// inner loop can then broadcast straight from memory.
//
// Built for AVX-512 (F, BW, VL, DQ) and loaded into torch as the `crescent` op library.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "ggml_tiles.h"

namespace crescent {
namespace {

void check_qtype(int64_t qtype) {
  TORCH_CHECK(known_qtype(qtype), "ggml: unsupported ggml type ", qtype,
              " (supported: Q4_0=2, Q4_1=3, Q8_0=8)");
}

template <int64_t QT>
void gemm(const float* x, int64_t ldx, int64_t M, const uint8_t* w, int64_t row_bytes,
          int64_t N, int64_t K, float* y) {
  at::parallel_for(0, tile_count(N), 16, [&](int64_t begin, int64_t end) {
    gemm_tiles<QT, false>(x, ldx, M, w, row_bytes, N, K, y, N, begin, end);
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
}  // namespace crescent

TORCH_LIBRARY_FRAGMENT(crescent, m) {
  m.def("ggml_repack(Tensor blocks, int qtype, int k) -> Tensor", &crescent::ggml_repack);
  m.def("ggml_gemm(Tensor x, Tensor packed, int qtype, int k) -> Tensor", &crescent::ggml_gemm);
  m.def("ggml_dequantize(Tensor packed, int qtype, int k) -> Tensor", &crescent::ggml_dequantize);
}

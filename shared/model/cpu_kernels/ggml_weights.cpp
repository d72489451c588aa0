// Weights read from a GGUF file's own blocks, whatever their ggml type (ggml_formats.h).
//
// ggml_expand turns rows of blocks into fp32 rows: what checks every format against the gguf
// package's dequantizer, and what an embedding lookup reads a token's row with.
// ggml_matmul multiplies by the blocks: few rows of x in registers (ggml_matmul.h), many rows
// a few MB of W's rows at a time, expanded into a buffer and multiplied there by torch's BLAS,
// so no fp32 copy of a whole matrix is ever kept.
//
// Built for AVX-512 (F, BW, VL, DQ) and loaded into torch as the `crescent` op library.

#include <ATen/Parallel.h>
#include <algorithm>
#include <vector>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

#include "ggml_matmul.h"
#include "ggml_rows.h"

namespace crescent {
namespace {

using namespace formats;

// A [N, bytes] uint8 matrix whose rows hold K weights of type qtype.
void check_block_rows(const at::Tensor& rows, int64_t qtype, int64_t K) {
  int64_t weights = 0, bytes = 0;
  block_shape(qtype, weights, bytes);
  TORCH_CHECK(weights > 0, "ggml: unsupported ggml type ", qtype);
  TORCH_CHECK(K > 0 && K % weights == 0, "ggml: K must be a positive multiple of ", weights,
              " for type ", qtype, ", got ", K);
  TORCH_CHECK(rows.device().is_cpu() && rows.dim() == 2 && rows.scalar_type() == at::kByte &&
                  rows.stride(1) == 1,
              "ggml: blocks must be a uint8 [N, bytes] CPU tensor with contiguous rows");
  TORCH_CHECK(rows.size(1) == K / weights * bytes, "ggml: a row of ", rows.size(1),
              " bytes does not hold ", K, " weights of type ", qtype);
}

at::Tensor ggml_expand(const at::Tensor& blocks, int64_t qtype, int64_t K) {
  check_block_rows(blocks, qtype, K);
  const int64_t N = blocks.size(0), stride = blocks.stride(0);
  at::Tensor out = at::empty({N, K}, blocks.options().dtype(at::kFloat));
  const uint8_t* src = blocks.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  visit_format(qtype, [&](auto fmt) {
    using Fmt = decltype(fmt);
    at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) expand_row<Fmt>(src + n * stride, K, dst + n * K);
    });
  });
  return out;
}

// Up to this many rows of x the register tiles beat expanding W and calling BLAS.
constexpr int64_t kMaxRegisterRows = 24;
// Many rows of x: W is expanded this many bytes of fp32 rows at a time (a cache-sized buffer
// on a small model, a few L2s' worth on a large one), and at least this many rows.
constexpr int64_t kRoundBytes = 8 << 20;
constexpr int64_t kMinRoundRows = 64;

at::Tensor ggml_matmul(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype, int64_t K) {
  check_block_rows(blocks, qtype, K);
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kFloat &&
                  x.size(1) == K && x.stride(1) == 1,
              "ggml_matmul: x must be a float32 [M, ", K, "] CPU tensor with contiguous rows");
  const int64_t M = x.size(0), N = blocks.size(0), stride = blocks.stride(0);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  visit_format(qtype, [&](auto fmt) {
    using Fmt = decltype(fmt);
    if (M <= kMaxRegisterRows) {
      const float* xp = x.data_ptr<float>();
      float* yp = y.data_ptr<float>();
      // Split once for the formats with integer dot products; each tile reads the split.
      std::vector<float> storage;
      SplitRows split;
      const SplitRows* xs = nullptr;
      if constexpr (IntBlock<Fmt>::kHas) {
        storage.resize(SplitRows::floats(M, K));
        split = SplitRows::in(storage.data(), M, K);
        split_rows(xp, x.stride(0), split);
        xs = &split;
      }
      at::parallel_for(0, matmul_tile_count(N), 16, [&](int64_t t0, int64_t t1) {
        matmul_tiles<Fmt>(xp, x.stride(0), xs, M, w, stride, N, K, yp, N, t0, t1);
      });
      return;
    }
    // Rounds of up to kRoundBytes of expanded weights: the expansion is one parallel region,
    // the product one call to torch's BLAS (threaded by itself). BLAS must not run inside
    // the expansion's threads: there it starts threads of its own, more than there are
    // cores, and a prefill waits seconds on them once another process takes a core.
    const int64_t round_rows = std::clamp<int64_t>(kRoundBytes / (4 * K), kMinRoundRows, N);
    at::Tensor buffer = at::empty({round_rows, K}, x.options());
    float* out = buffer.data_ptr<float>();
    for (int64_t n0 = 0; n0 < N; n0 += round_rows) {
      const int64_t rows = std::min(round_rows, N - n0);
      at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
        for (int64_t n = r0; n < r1; ++n) expand_row<Fmt>(w + (n0 + n) * stride, K, out + n * K);
      });
      y.narrow(1, n0, rows).copy_(at::mm(x, buffer.narrow(0, 0, rows).t()));
    }
  });
  return y;
}

}  // namespace
}  // namespace crescent

TORCH_LIBRARY_FRAGMENT(crescent, m) {
  m.def("ggml_expand(Tensor blocks, int qtype, int k) -> Tensor", &crescent::ggml_expand);
  m.def("ggml_matmul(Tensor x, Tensor blocks, int qtype, int k) -> Tensor", &crescent::ggml_matmul);
}

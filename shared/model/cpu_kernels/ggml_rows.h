// Rows of ggml blocks as a GGUF file stores them: a weight matrix [N, K] is N rows of
// K / kWeights blocks each. `visit_format` calls a generic lambda with the Format of a type id,
// so an op is written once for every type.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>

#include "ggml_formats.h"

namespace crescent::formats {

inline constexpr int64_t kSupportedTypes[] = {kF32,  kF16,  kBF16, kQ4_0, kQ4_1, kQ5_0, kQ5_1,
                                              kQ8_0, kQ2_K, kQ3_K, kQ4_K, kQ5_K, kQ6_K, kIQ4_NL,
                                              kIQ4_XS};

template <typename F>
decltype(auto) visit_format(int64_t qtype, F&& f) {
  switch (qtype) {
    case kF32: return f(Format<kF32>{});
    case kF16: return f(Format<kF16>{});
    case kBF16: return f(Format<kBF16>{});
    case kQ4_0: return f(Format<kQ4_0>{});
    case kQ4_1: return f(Format<kQ4_1>{});
    case kQ5_0: return f(Format<kQ5_0>{});
    case kQ5_1: return f(Format<kQ5_1>{});
    case kQ8_0: return f(Format<kQ8_0>{});
    case kQ2_K: return f(Format<kQ2_K>{});
    case kQ3_K: return f(Format<kQ3_K>{});
    case kQ4_K: return f(Format<kQ4_K>{});
    case kQ5_K: return f(Format<kQ5_K>{});
    case kQ6_K: return f(Format<kQ6_K>{});
    case kIQ4_NL: return f(Format<kIQ4_NL>{});
    case kIQ4_XS: return f(Format<kIQ4_XS>{});
    default: TORCH_CHECK(false, "ggml: unsupported ggml type ", qtype);
  }
}

// Weights per block and bytes per block of a type id (0, 0 when unsupported).
inline void block_shape(int64_t qtype, int64_t& weights, int64_t& bytes) {
  weights = bytes = 0;
  for (int64_t t : kSupportedTypes)
    if (t == qtype) {
      visit_format(qtype, [&](auto fmt) {
        weights = decltype(fmt)::kWeights;
        bytes = decltype(fmt)::kBytes;
      });
    }
}

// One row's K weights as fp32, chunk by chunk.
template <typename Fmt>
void expand_row(const uint8_t* row, int64_t K, float* out) {
  typename Fmt::Head head;
  for (int64_t b = 0; b < K / Fmt::kWeights; ++b) {
    const uint8_t* block = row + b * Fmt::kBytes;
    Fmt::head(block, head);
    for (int c = 0; c < Fmt::kWeights / kChunk; ++c) {
      __m512 lo, hi;
      Fmt::expand(block, head, c, lo, hi);
      float* dst = out + b * Fmt::kWeights + c * kChunk;
      _mm512_storeu_ps(dst, lo);
      _mm512_storeu_ps(dst + 16, hi);
    }
  }
}

}  // namespace crescent::formats

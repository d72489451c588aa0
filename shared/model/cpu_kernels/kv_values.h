// The paged KV cache's element types: fp32 (as computed), or bf16 / fp16 (CRESCENT_KV_DTYPE),
// widened to fp32 where attention reads them and rounded as torch rounds where K and V are
// stored, so the fused step and the op-by-op step see the same values.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace crescent {

enum class KvType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

inline int64_t kv_bytes(KvType t) { return t == KvType::kF32 ? 4 : 2; }

// Round to nearest even, a NaN to the quiet NaN: torch's float -> bfloat16.
inline __m256i bf16_of(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

inline __m512 widen_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// n values (a multiple of 16) from the cache's type into fp32.
inline void kv_load(KvType t, const void* src, float* dst, int64_t n) {
  if (t == KvType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  const auto* h = static_cast<const __m256i*>(src);
  for (int64_t i = 0; i < n; i += 16) {
    const __m256i bits = _mm256_loadu_si256(h + i / 16);
    _mm512_storeu_ps(dst + i, t == KvType::kBF16 ? widen_bf16(bits) : _mm512_cvtph_ps(bits));
  }
}

// n fp32 values (a multiple of 16) stored in the cache's type.
inline void kv_store(KvType t, const float* src, void* dst, int64_t n) {
  if (t == KvType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  auto* h = static_cast<__m256i*>(dst);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_loadu_ps(src + i);
    _mm256_storeu_si256(h + i / 16, t == KvType::kBF16
                                        ? bf16_of(v)
                                        : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

// n fp32 values replaced by what the cache's type keeps of them.
inline void kv_round(KvType t, float* v, int64_t n) {
  if (t == KvType::kF32) return;
  alignas(64) uint16_t stored[16];
  for (int64_t i = 0; i < n; i += 16) {
    kv_store(t, v + i, stored, 16);
    kv_load(t, stored, v + i, 16);
  }
}

}  // namespace crescent

// The paged KV cache's element types: fp32 (as computed), bf16 / fp16 or fp8 e4m3
// (CRESCENT_KV_DTYPE), widened to fp32 where attention reads them and rounded as torch rounds
// where K and V are stored, so the fused step and the op-by-op step see the same values.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace crescent {

enum class KvType : int { kF32 = 0, kBF16 = 1, kF16 = 2, kFP8E4M3 = 3 };

inline int64_t kv_bytes(KvType t) {
  return t == KvType::kF32 ? 4 : t == KvType::kFP8E4M3 ? 1 : 2;
}

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

// torch's float -> float8_e4m3fn (c10::detail::fp8e4m3fn_from_fp32_value) after the clamp to
// +-448 that the op-by-op step applies first: round to nearest even, saturate to +-448 (so a
// finite value or an infinity never becomes NaN), a NaN to 0x7F with its sign.
inline __m128i fp8e4m3_of(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i sign = _mm512_and_si512(u, _mm512_set1_epi32(INT32_MIN));
  const __m512i a = _mm512_xor_si512(u, sign);
  // From 2^-6 (the smallest normal) up: drop 20 mantissa bits, rounding half to even, and
  // rebias the exponent from 127 to 7.
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_set1_epi32(static_cast<int32_t>((7u - 127u) << 23) + 0x7FFFF);
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(a, bias), odd), 20);
  // Rounding up to 480 would spell NaN (0x7F): saturate.
  r = _mm512_min_epu32(r, _mm512_set1_epi32(0x7E));
  // Below 2^-6: an fp32 add of 2^(141-127) rounds the value to a multiple of 2^-9, the
  // subnormals' step, in the low mantissa bits (exact, as the hardware rounds to even).
  const __m512i denorm = _mm512_set1_epi32(141 << 23);
  const __m512i sub = _mm512_sub_epi32(
      _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(denorm))),
      denorm);
  r = _mm512_mask_mov_epi32(r, _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(121 << 23)), sub);
  // 480 and above (infinity included) saturate; NaN stays NaN.
  r = _mm512_mask_mov_epi32(r, _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32(1087 << 20)),
                            _mm512_set1_epi32(0x7E));
  r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000)),
                            _mm512_set1_epi32(0x7F));
  return _mm512_cvtepi32_epi8(_mm512_or_si512(r, _mm512_srli_epi32(sign, 24)));
}

// 16 e4m3 bytes to fp32 exactly as torch widens them: the 7 bits of exponent and mantissa,
// placed in an fp16's (bias 15 instead of 7, subnormals included), are the value times 2^-8,
// which fp16 -> fp32 keeps exactly and a multiply by 2^8 undoes; 0x7F / 0xFF are NaN.
inline __m512 widen_fp8e4m3(__m128i bytes) {
  const __m256i b = _mm256_cvtepu8_epi16(bytes);
  const __m256i magnitude = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7F)), 7);
  const __m512 value = _mm512_mul_ps(_mm512_cvtph_ps(magnitude), _mm512_set1_ps(256.0f));
  const __m512i sign = _mm512_slli_epi32(
      _mm512_and_si512(_mm512_cvtepu16_epi32(b), _mm512_set1_epi32(0x80)), 24);
  const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(b, _mm256_set1_epi16(0x7F)),
                                                _mm256_set1_epi16(0x7F));
  const __m512i bits = _mm512_mask_mov_epi32(_mm512_castps_si512(value), nan,
                                             _mm512_set1_epi32(0x7FF00000));
  return _mm512_castsi512_ps(_mm512_or_si512(bits, sign));
}

// n values (a multiple of 16) from the cache's type into fp32.
inline void kv_load(KvType t, const void* src, float* dst, int64_t n) {
  if (t == KvType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  if (t == KvType::kFP8E4M3) {
    const auto* b = static_cast<const __m128i*>(src);
    for (int64_t i = 0; i < n; i += 16) {
      _mm512_storeu_ps(dst + i, widen_fp8e4m3(_mm_loadu_si128(b + i / 16)));
    }
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
  if (t == KvType::kFP8E4M3) {
    auto* b = static_cast<__m128i*>(dst);
    for (int64_t i = 0; i < n; i += 16) {
      _mm_storeu_si128(b + i / 16, fp8e4m3_of(_mm512_loadu_ps(src + i)));
    }
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
  alignas(64) uint16_t stored[16];  // 16 values of 2 bytes or less
  for (int64_t i = 0; i < n; i += 16) {
    kv_store(t, v + i, stored, 16);
    kv_load(t, stored, v + i, 16);
  }
}

}  // namespace crescent

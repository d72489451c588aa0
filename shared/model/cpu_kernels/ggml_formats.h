// ggml's weight formats read as a GGUF file stores them, 32 weights at a time.
//
// Each Format<T> describes one ggml type: a block of kWeights weights in kBytes bytes, a Head
// decoded once per block (its scales, widened to fp32), and expand(), which yields 32 weights of
// the block (a "chunk") as two vectors of 16 floats. Every weight is computed with the same
// operations, in the same order and rounding, as the reference dequantizer of the `gguf` Python
// package (gguf/quants.py): a multiply and an add are never fused (the library is built with
// -ffp-contract=off), so the expanded weights equal it bit for bit.
//
// Within a chunk, lane i of `lo` is weight i and lane i of `hi` is weight 16 + i.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace crescent::formats {

// ggml's type ids (enum ggml_type), which are also the values the Python side passes.
enum : int64_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kIQ4_NL = 20, kIQ4_XS = 23,
  kBF16 = 30,
};
constexpr int kChunk = 32;

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return _cvtsh_ss(h);
}

inline __m512 levels16() { return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }

// The 16 bytes at p as 32-bit lanes.
inline __m512i bytes16(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Low nibbles of 16 bytes select weights 0..15 of a 16-entry table, high nibbles 16..31.
inline void nibbles_from(const uint8_t* q, __m512 table, __m512& lo, __m512& hi) {
  const __m512i b = bytes16(q);
  lo = _mm512_permutexvar_ps(b, table);  // the permute reads an index's low 4 bits only
  hi = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table);
}

// Lanes whose bit is set in `bits` get 16 added to their index: the fifth bit of 5-bit quants.
inline __m512i with_high_bit(__m512i index, __mmask16 bits) {
  return _mm512_or_si512(index, _mm512_maskz_set1_epi32(bits, 16));
}

// ---- 32-weight blocks -------------------------------------------------------------------

template <int64_t T> struct Format;

template <> struct Format<kQ4_0> {  // d f16, 16 bytes of nibbles: d * (q - 8)
  static constexpr int64_t kWeights = 32, kBytes = 18;
  struct Head { __m512 table; };
  static void head(const uint8_t* b, Head& h) {
    h.table = _mm512_mul_ps(_mm512_set1_ps(half_at(b)), _mm512_sub_ps(levels16(), _mm512_set1_ps(8)));
  }
  static void expand(const uint8_t* b, const Head& h, int, __m512& lo, __m512& hi) {
    nibbles_from(b + 2, h.table, lo, hi);
  }
};

template <> struct Format<kQ4_1> {  // d, m f16, 16 bytes of nibbles: d * q + m
  static constexpr int64_t kWeights = 32, kBytes = 20;
  struct Head { __m512 table; };
  static void head(const uint8_t* b, Head& h) {
    h.table = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(half_at(b)), levels16()),
                            _mm512_set1_ps(half_at(b + 2)));
  }
  static void expand(const uint8_t* b, const Head& h, int, __m512& lo, __m512& hi) {
    nibbles_from(b + 4, h.table, lo, hi);
  }
};

// 5-bit quants: a nibble and one bit of a 32-bit mask (bit i belongs to weight i) select one
// of 32 values, kept as two 16-entry tables.
inline void five_bits(const uint8_t* qs, uint32_t high, __m512 t0, __m512 t1, __m512& lo,
                      __m512& hi) {
  const __m512i b = bytes16(qs);
  const __m512i il = with_high_bit(_mm512_and_si512(b, _mm512_set1_epi32(15)), __mmask16(high));
  const __m512i ih = with_high_bit(_mm512_srli_epi32(b, 4), __mmask16(high >> 16));
  lo = _mm512_permutex2var_ps(t0, il, t1);
  hi = _mm512_permutex2var_ps(t0, ih, t1);
}

template <> struct Format<kQ5_0> {  // d f16, 4 bytes of high bits, 16 of nibbles: d * (q - 16)
  static constexpr int64_t kWeights = 32, kBytes = 22;
  struct Head { __m512 t0, t1; };
  static void head(const uint8_t* b, Head& h) {
    const __m512 d = _mm512_set1_ps(half_at(b));
    h.t0 = _mm512_mul_ps(d, _mm512_sub_ps(levels16(), _mm512_set1_ps(16)));
    h.t1 = _mm512_mul_ps(d, levels16());
  }
  static void expand(const uint8_t* b, const Head& h, int, __m512& lo, __m512& hi) {
    uint32_t high;
    std::memcpy(&high, b + 2, sizeof high);
    five_bits(b + 6, high, h.t0, h.t1, lo, hi);
  }
};

template <> struct Format<kQ5_1> {  // d, m f16, 4 bytes of high bits, 16 of nibbles: d * q + m
  static constexpr int64_t kWeights = 32, kBytes = 24;
  struct Head { __m512 t0, t1; };
  static void head(const uint8_t* b, Head& h) {
    const __m512 d = _mm512_set1_ps(half_at(b)), m = _mm512_set1_ps(half_at(b + 2));
    h.t0 = _mm512_add_ps(_mm512_mul_ps(d, levels16()), m);
    h.t1 = _mm512_add_ps(_mm512_mul_ps(d, _mm512_add_ps(levels16(), _mm512_set1_ps(16))), m);
  }
  static void expand(const uint8_t* b, const Head& h, int, __m512& lo, __m512& hi) {
    uint32_t high;
    std::memcpy(&high, b + 4, sizeof high);
    five_bits(b + 8, high, h.t0, h.t1, lo, hi);
  }
};

template <> struct Format<kQ8_0> {  // d f16, 32 int8: q * d
  static constexpr int64_t kWeights = 32, kBytes = 34;
  struct Head { __m512 d; };
  static void head(const uint8_t* b, Head& h) { h.d = _mm512_set1_ps(half_at(b)); }
  static void expand(const uint8_t* b, const Head& h, int, __m512& lo, __m512& hi) {
    const auto* q = reinterpret_cast<const __m128i*>(b + 2);
    lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))), h.d);
    hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))), h.d);
  }
};

inline constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};
inline __m512 iq4_levels() {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Values))));
}

template <> struct Format<kIQ4_NL> {  // d f16, 16 bytes of nibbles into a fixed table: d * v[q]
  static constexpr int64_t kWeights = 32, kBytes = 18;
  struct Head { __m512 table; };
  static void head(const uint8_t* b, Head& h) {
    h.table = _mm512_mul_ps(_mm512_set1_ps(half_at(b)), iq4_levels());
  }
  static void expand(const uint8_t* b, const Head& h, int, __m512& lo, __m512& hi) {
    nibbles_from(b + 2, h.table, lo, hi);
  }
};

// ---- unquantized rows: a "block" of 32 weights ------------------------------------------

template <> struct Format<kF32> {
  static constexpr int64_t kWeights = 32, kBytes = 128;
  struct Head {};
  static void head(const uint8_t*, Head&) {}
  static void expand(const uint8_t* b, const Head&, int, __m512& lo, __m512& hi) {
    lo = _mm512_loadu_ps(b);
    hi = _mm512_loadu_ps(b + 64);
  }
};

template <> struct Format<kF16> {
  static constexpr int64_t kWeights = 32, kBytes = 64;
  struct Head {};
  static void head(const uint8_t*, Head&) {}
  static void expand(const uint8_t* b, const Head&, int, __m512& lo, __m512& hi) {
    lo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    hi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32)));
  }
};

template <> struct Format<kBF16> {  // the upper half of an fp32
  static constexpr int64_t kWeights = 32, kBytes = 64;
  struct Head {};
  static void head(const uint8_t*, Head&) {}
  static __m512 widen(const uint8_t* p) {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  }
  static void expand(const uint8_t* b, const Head&, int, __m512& lo, __m512& hi) {
    lo = widen(b);
    hi = widen(b + 32);
  }
};

}  // namespace crescent::formats

#include "ggml_kquants.h"

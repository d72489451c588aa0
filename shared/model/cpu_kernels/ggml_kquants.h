// ggml's 256-weight "K" formats (and IQ4_XS), read as stored: see ggml_formats.h.
//
// A block holds 8 chunks of 32 weights. Its Head decodes the packed scales of all of them once
// (they are shared by every chunk a row's pass reads); expand() then builds one chunk. The
// layouts follow gguf/quants.py's reshapes, noted per format as "chunk c reads ...".
#pragma once

// Included at the end of ggml_formats.h, whose helpers it uses.

namespace crescent::formats {

constexpr int kSuper = 256;

// Two 16-weight groups per chunk (Q2_K, Q3_K, Q6_K scale every 16 weights).
inline __m512 group_scale(const float* per_group, int c, bool high) {
  return _mm512_set1_ps(per_group[2 * c + (high ? 1 : 0)]);
}

// The 2-bit field `shift` of 16 bytes at p (Q2_K and Q3_K's low bits).
inline __m512i two_bits(const uint8_t* p, int shift) {
  return _mm512_and_si512(_mm512_srl_epi32(bytes16(p), _mm_cvtsi32_si128(shift)),
                          _mm512_set1_epi32(3));
}

// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin f16.
// Weight = (d * sc) * q - (dmin * m). Chunk c reads bits 2(c%4) of qs[32(c/4) + i].
template <> struct Format<kQ2_K> {
  static constexpr int64_t kWeights = kSuper, kBytes = 84;
  struct Head { float dl[16], ml[16]; };
  static void head(const uint8_t* b, Head& h) {
    const float d = half_at(b + 80), dmin = half_at(b + 82);
    for (int g = 0; g < 16; ++g) {
      h.dl[g] = d * static_cast<float>(b[g] & 15);
      h.ml[g] = dmin * static_cast<float>(b[g] >> 4);
    }
  }
  static void expand(const uint8_t* b, const Head& h, int c, __m512& lo, __m512& hi) {
    const uint8_t* q = b + 16 + 32 * (c / 4);
    const int shift = 2 * (c % 4);
    const __m512 ql = _mm512_cvtepi32_ps(two_bits(q, shift));
    const __m512 qh = _mm512_cvtepi32_ps(two_bits(q + 16, shift));
    lo = _mm512_sub_ps(_mm512_mul_ps(group_scale(h.dl, c, false), ql), group_scale(h.ml, c, false));
    hi = _mm512_sub_ps(_mm512_mul_ps(group_scale(h.dl, c, true), qh), group_scale(h.ml, c, true));
  }
};

// Q3_K: hmask[32], qs[64], scales[12] (16 six-bit scales, minus 32), d f16.
// Weight = (d * scale) * (q - 4 * !hbit). Chunk c reads bits 2(c%4) of qs[32(c/4) + i] and
// bit c of hmask[i].
template <> struct Format<kQ3_K> {
  static constexpr int64_t kWeights = kSuper, kBytes = 110;
  struct Head { float dl[16]; };
  static void head(const uint8_t* b, Head& h) {
    const uint8_t* s = b + 96;
    const float d = half_at(b + 108);
    for (int g = 0; g < 16; ++g) {
      const int low = (g < 8 ? s[g] : s[g - 8] >> 4) & 15;
      const int high = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
      h.dl[g] = d * static_cast<float>(static_cast<int8_t>(low | (high << 4)) - 32);
    }
  }
  static __m512 values(const uint8_t* q, const uint8_t* mask, int shift, int c) {
    const __m512i hbit = _mm512_and_si512(_mm512_srl_epi32(bytes16(mask), _mm_cvtsi32_si128(c)),
                                          _mm512_set1_epi32(1));
    const __m512i minus = _mm512_slli_epi32(_mm512_xor_si512(hbit, _mm512_set1_epi32(1)), 2);
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(two_bits(q, shift), minus));
  }
  static void expand(const uint8_t* b, const Head& h, int c, __m512& lo, __m512& hi) {
    const uint8_t* q = b + 32 + 32 * (c / 4);
    const int shift = 2 * (c % 4);
    lo = _mm512_mul_ps(group_scale(h.dl, c, false), values(q, b, shift, c));
    hi = _mm512_mul_ps(group_scale(h.dl, c, true), values(q + 16, b + 16, shift, c));
  }
};

// The eight bytes of v as floats.
inline __m256 bytes8(uint64_t v) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(v))));
}

// Q4_K: d, dmin f16, scales[12], qs[128]. Weight = (d * sc) * q - (dmin * m), per chunk.
// Chunk c reads nibble c%2 of qs[32(c/2) + i].
template <> struct Format<kQ4_K> {
  static constexpr int64_t kWeights = kSuper, kBytes = 144;
  struct Head { float d[8], dm[8]; };
  static void head(const uint8_t* b, Head& h) {
    // The eight 6-bit scales and mins packed in 12 bytes, four bytes to a word: a shift by 2 moves
    // each byte's top bits into its own bits 4-5, and the masks drop what crossed a byte.
    uint32_t a, m, md;
    std::memcpy(&a, b + 4, 4);
    std::memcpy(&m, b + 8, 4);
    std::memcpy(&md, b + 12, 4);
    const uint64_t sc = (a & 0x3F3F3F3Fu) |
                        uint64_t((md & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u)) << 32;
    const uint64_t mn = (m & 0x3F3F3F3Fu) |
                        uint64_t(((md >> 4) & 0x0F0F0F0Fu) | ((m >> 2) & 0x30303030u)) << 32;
    _mm256_storeu_ps(h.d, _mm256_mul_ps(_mm256_set1_ps(half_at(b)), bytes8(sc)));
    _mm256_storeu_ps(h.dm, _mm256_mul_ps(_mm256_set1_ps(half_at(b + 2)), bytes8(mn)));
  }
  static void expand(const uint8_t* b, const Head& h, int c, __m512& lo, __m512& hi) {
    const __m512 table = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(h.d[c]), levels16()),
                                       _mm512_set1_ps(h.dm[c]));
    const uint8_t* q = b + 16 + 32 * (c / 2);
    const __m512i shift = _mm512_set1_epi32(4 * (c % 2));
    lo = _mm512_permutexvar_ps(_mm512_srlv_epi32(bytes16(q), shift), table);
    hi = _mm512_permutexvar_ps(_mm512_srlv_epi32(bytes16(q + 16), shift), table);
  }
};

// Q5_K: d, dmin f16, scales[12], qh[32], qs[128]. As Q4_K with a fifth bit: bit c of qh[i].
template <> struct Format<kQ5_K> {
  static constexpr int64_t kWeights = kSuper, kBytes = 176;
  using Head = Format<kQ4_K>::Head;
  static void head(const uint8_t* b, Head& h) { Format<kQ4_K>::head(b, h); }
  static __m512i index(const uint8_t* q, const uint8_t* qh, int c) {
    const __m512i low = _mm512_and_si512(_mm512_srl_epi32(bytes16(q), _mm_cvtsi32_si128(4 * (c % 2))),
                                         _mm512_set1_epi32(15));
    const __m512i bit = _mm512_and_si512(_mm512_srl_epi32(bytes16(qh), _mm_cvtsi32_si128(c)),
                                         _mm512_set1_epi32(1));
    return _mm512_or_si512(low, _mm512_slli_epi32(bit, 4));
  }
  static void expand(const uint8_t* b, const Head& h, int c, __m512& lo, __m512& hi) {
    const __m512 d = _mm512_set1_ps(h.d[c]), dm = _mm512_set1_ps(h.dm[c]);
    const __m512 t0 = _mm512_sub_ps(_mm512_mul_ps(d, levels16()), dm);
    const __m512 t1 =
        _mm512_sub_ps(_mm512_mul_ps(d, _mm512_add_ps(levels16(), _mm512_set1_ps(16))), dm);
    const uint8_t* q = b + 48 + 32 * (c / 2);
    lo = _mm512_permutex2var_ps(t0, index(q, b + 16, c), t1);
    hi = _mm512_permutex2var_ps(t0, index(q + 16, b + 32, c), t1);
  }
};

// Q6_K: ql[128], qh[64], scales[16] int8, d f16. Weight = (d * scale) * (q - 32), q six bits:
// chunk c reads nibble (c%4)/2 of ql[64(c/4) + 32(c%2) + i] and bits 2(c%4) of qh[32(c/4) + i].
template <> struct Format<kQ6_K> {
  static constexpr int64_t kWeights = kSuper, kBytes = 210;
  struct Head { float dl[16]; };
  static void head(const uint8_t* b, Head& h) {
    const float d = half_at(b + 208);
    for (int g = 0; g < 16; ++g) h.dl[g] = d * static_cast<float>(static_cast<int8_t>(b[192 + g]));
  }
  static __m512 values(const uint8_t* ql, const uint8_t* qh, int nibble, int shift) {
    const __m512i low = _mm512_and_si512(_mm512_srl_epi32(bytes16(ql), _mm_cvtsi32_si128(4 * nibble)),
                                         _mm512_set1_epi32(15));
    const __m512i high = _mm512_and_si512(_mm512_srl_epi32(bytes16(qh), _mm_cvtsi32_si128(shift)),
                                          _mm512_set1_epi32(3));
    const __m512i q = _mm512_or_si512(low, _mm512_slli_epi32(high, 4));
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(32)));
  }
  static void expand(const uint8_t* b, const Head& h, int c, __m512& lo, __m512& hi) {
    const uint8_t* ql = b + 64 * (c / 4) + 32 * (c % 2);
    const uint8_t* qh = b + 128 + 32 * (c / 4);
    const int nibble = (c % 4) / 2, shift = 2 * (c % 4);
    lo = _mm512_mul_ps(group_scale(h.dl, c, false), values(ql, qh, nibble, shift));
    hi = _mm512_mul_ps(group_scale(h.dl, c, true), values(ql + 16, qh + 16, nibble, shift));
  }
};

// IQ4_XS: d f16, scales_h u16, scales_l[4], qs[128]. Weight = (d * scale) * v[q] (IQ4_NL's
// table); chunk c reads qs[16c + i]: low nibbles weights 0..15, high nibbles 16..31.
template <> struct Format<kIQ4_XS> {
  static constexpr int64_t kWeights = kSuper, kBytes = 136;
  struct Head { float dl[8]; };
  static void head(const uint8_t* b, Head& h) {
    const float d = half_at(b);
    uint16_t high;
    std::memcpy(&high, b + 2, sizeof high);
    for (int j = 0; j < 8; ++j) {
      const int low = (b[4 + j / 2] >> (4 * (j % 2))) & 15;
      const int top = (high >> (2 * j)) & 3;
      h.dl[j] = d * static_cast<float>(static_cast<int8_t>(low | (top << 4)) - 32);
    }
  }
  static void expand(const uint8_t* b, const Head& h, int c, __m512& lo, __m512& hi) {
    nibbles_from(b + 8 + 16 * c, _mm512_mul_ps(_mm512_set1_ps(h.dl[c]), iq4_levels()), lo, hi);
  }
};

}  // namespace crescent::formats

#pragma once
// The AVX512 intrinsics the extension's sources are written with, on every x86-64 CPU it builds for
// (nn/quant_kernel.py INSTRUCTION_SETS). With AVX512 (-mavx512f ...) they are the compiler's own.
// Without (the "avx2" build: -mavx2 -mfma -mf16c), SIMDe (github.com/simd-everywhere/simde, MIT; the
// simde-py package's headers, 0.8.2, or Debian's libsimde-dev, 0.7.4) implements each on two AVX2 halves
// under the same name (SIMDE_ENABLE_NATIVE_ALIASES); the few that SIMDe 0.7.4 lacks or emulates slowly
// (masks, compares, blends) are defined below, in AVX2, with AVX512's results: the reductions in
// GCC's order (halves of 256, then of 128, then pairs), so fp32 sums round as in the AVX512 build;
// masked loads read no masked-out lane (no fault past a row's end), masked stores write none.
#if defined(__AVX512F__)
#include <immintrin.h>
#else
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

namespace attnlab_simd {
using P = simde__m512_private;
using PI = simde__m512i_private;
inline __m256 lo(simde__m512 a) { return simde__m512_to_private(a).m256[0]; }
inline __m256 hi(simde__m512 a) { return simde__m512_to_private(a).m256[1]; }
inline simde__m512 join(__m256 a, __m256 b) { P r; r.m256[0] = a; r.m256[1] = b; return simde__m512_from_private(r); }
inline __m256i lo(simde__m512i a) { return simde__m512i_to_private(a).m256i[0]; }
inline __m256i hi(simde__m512i a) { return simde__m512i_to_private(a).m256i[1]; }
inline simde__m512i join(__m256i a, __m256i b) { PI r; r.m256i[0] = a; r.m256i[1] = b; return simde__m512i_from_private(r); }
inline __m256i lanes8(unsigned k) {  // lane i all ones when bit i of k is set
  const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(k)), bits), bits);
}
inline simde__m512 cvtepi32_ps(simde__m512i a) { return join(_mm256_cvtepi32_ps(lo(a)), _mm256_cvtepi32_ps(hi(a))); }
inline simde__m512i cvtps_epi32(simde__m512 a) { return join(_mm256_cvtps_epi32(lo(a)), _mm256_cvtps_epi32(hi(a))); }
inline simde__m512i cvtepi8_epi32(__m128i a) { return join(_mm256_cvtepi8_epi32(a), _mm256_cvtepi8_epi32(_mm_srli_si128(a, 8))); }
inline simde__m512i cvtepu8_epi32(__m128i a) { return join(_mm256_cvtepu8_epi32(a), _mm256_cvtepu8_epi32(_mm_srli_si128(a, 8))); }
inline simde__m512i cvtepu16_epi32(__m256i a) {
  return join(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(a)), _mm256_cvtepu16_epi32(_mm256_extracti128_si256(a, 1)));
}
inline simde__m512 cvtph_ps(__m256i a) {
  return join(_mm256_cvtph_ps(_mm256_castsi256_si128(a)), _mm256_cvtph_ps(_mm256_extracti128_si256(a, 1)));
}
inline __m256i cvtepi32_epi16(simde__m512i a) {  // truncation, lane order kept
  const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                        0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i l = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(lo(a), pick), 0x08);
  const __m256i h = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(hi(a), pick), 0x08);
  return _mm256_inserti128_si256(l, _mm256_castsi256_si128(h), 1);
}
inline __m128i cvtepi32_epi8(simde__m512i a) {
  alignas(32) int32_t v[16];
  alignas(16) int8_t r[16];
  std::memcpy(v, &a, 64);
  for (int i = 0; i < 16; ++i) r[i] = static_cast<int8_t>(v[i]);
  return _mm_load_si128(reinterpret_cast<const __m128i*>(r));
}
__attribute__((always_inline)) inline simde__m512 maskz_loadu_ps(simde__mmask16 k, const void* p) {
  const float* f = static_cast<const float*>(p);
  if (k == 0xFFFF) return join(_mm256_loadu_ps(f), _mm256_loadu_ps(f + 8));  // a whole row: no mask to build
  return join(_mm256_maskload_ps(f, lanes8(k & 0xFF)), _mm256_maskload_ps(f + 8, lanes8(k >> 8)));
}
__attribute__((always_inline)) inline void mask_storeu_ps(void* p, simde__mmask16 k, simde__m512 a) {
  float* f = static_cast<float*>(p);
  if (k == 0xFFFF) {  // a whole row
    _mm256_storeu_ps(f, lo(a));
    _mm256_storeu_ps(f + 8, hi(a));
    return;
  }
  _mm256_maskstore_ps(f, lanes8(k & 0xFF), lo(a));
  _mm256_maskstore_ps(f + 8, lanes8(k >> 8), hi(a));
}
inline simde__m512i maskz_loadu_epi8(simde__mmask64 k, const void* p) {
  if (k == ~0ULL) return simde_mm512_loadu_si512(p);
  alignas(64) uint8_t r[64] = {};
  const uint8_t* s = static_cast<const uint8_t*>(p);
  for (int i = 0; i < 64; ++i) if ((k >> i) & 1) r[i] = s[i];
  return simde_mm512_load_si512(r);
}
inline __m256i maskz_loadu_epi16(simde__mmask16 k, const void* p) {
  if (k == 0xFFFF) return _mm256_loadu_si256(static_cast<const __m256i*>(p));
  alignas(32) uint16_t r[16] = {};
  const uint16_t* s = static_cast<const uint16_t*>(p);
  for (int i = 0; i < 16; ++i) if ((k >> i) & 1) r[i] = s[i];
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(r));
}
// compares to a 16-bit mask and blends by one through AVX2's vector compares and blends (SIMDe's go
// through 128-bit pieces and bit tests, several times the cost)
template <int imm>
__attribute__((always_inline)) inline simde__mmask16 cmp_ps_mask(simde__m512 a, simde__m512 b) {
  const int l = _mm256_movemask_ps(_mm256_cmp_ps(lo(a), lo(b), imm));
  const int h = _mm256_movemask_ps(_mm256_cmp_ps(hi(a), hi(b), imm));
  return static_cast<simde__mmask16>(l | (h << 8));
}
__attribute__((always_inline)) inline simde__m512 mask_blend_ps(simde__mmask16 k, simde__m512 a, simde__m512 b) {
  return join(_mm256_blendv_ps(lo(a), lo(b), _mm256_castsi256_ps(lanes8(k & 0xFF))),
              _mm256_blendv_ps(hi(a), hi(b), _mm256_castsi256_ps(lanes8(k >> 8))));
}
// the reductions in GCC's order (halves of 256, of 128, then pairs), so sums round as with AVX512
inline float reduce_add_ps(simde__m512 a) {
  const __m256 t = _mm256_add_ps(hi(a), lo(a));
  const __m128 u = _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
  const __m128 v = _mm_add_ps(u, _mm_shuffle_ps(u, u, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(v) + _mm_cvtss_f32(_mm_shuffle_ps(v, v, 1));
}
inline float reduce_max_ps(simde__m512 a) {
  const __m256 t = _mm256_max_ps(hi(a), lo(a));
  const __m128 u = _mm_max_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
  const __m128 v = _mm_max_ps(u, _mm_shuffle_ps(u, u, _MM_SHUFFLE(1, 0, 3, 2)));
  return std::max(_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_shuffle_ps(v, v, 1)));
}
inline int reduce_add_epi32(simde__m512i a) {
  const __m256i t = _mm256_add_epi32(hi(a), lo(a));
  const __m128i u = _mm_add_epi32(_mm256_extracti128_si256(t, 1), _mm256_castsi256_si128(t));
  const __m128i v = _mm_add_epi32(u, _mm_shuffle_epi32(u, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtsi128_si32(v) + _mm_cvtsi128_si32(_mm_shuffle_epi32(v, 1));
}
// roundscale with a scale of 0 (round to an integer: the immediate's low 4 bits, SSE4.1's encoding)
template <int imm>
inline simde__m512 roundscale_ps(simde__m512 a) {
  static_assert((imm >> 4) == 0, "simd_compat.h: roundscale with a scale of 0 only");
  return join(_mm256_round_ps(lo(a), imm & 0xF), _mm256_round_ps(hi(a), imm & 0xF));
}
// a · 2^b for integer-valued b with |b| <= 252 (exp16's u · 2^q): two exact power-of-2 factors, one
// rounding, as AVX512's scalef (SIMDe's multiplies by exp2(b), which is itself rounded below 2^-126)
__attribute__((always_inline)) inline __m256 scalef8(__m256 a, __m256 b) {
  const __m256i q = _mm256_cvtps_epi32(b), h = _mm256_srai_epi32(q, 1);
  const __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, _mm256_set1_epi32(127)), 23));
  const __m256 f2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(q, h), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(a, f1), f2);
}
__attribute__((always_inline)) inline simde__m512 scalef_ps(simde__m512 a, simde__m512 b) { return join(scalef8(lo(a), lo(b)), scalef8(hi(a), hi(b))); }
// vpdpbusd (u8 × s8, each group of 4 bytes summed into the int32 lane, no saturation) exactly, in 9
// AVX2 operations without byte shuffles (SIMDe's generic form shuffles bytes, ~3x slower in decoding):
// the even bytes, zero- (u8) and sign-extended (s8) to int16 in place, then vpmaddwd sums bytes 0 + 2
// of each group, the odd bytes' vpmaddwd bytes 1 + 3; |each product| ≤ 255 · 128, so no int16 or int32
// step overflows, and int32 addition wraps as vpdpbusd's does: the same bits in any order.
inline __m256i dpbusd8(__m256i acc, __m256i u, __m256i s) {
  const __m256i u_even = _mm256_and_si256(u, _mm256_set1_epi16(0x00FF));
  const __m256i u_odd = _mm256_srli_epi16(u, 8);
  const __m256i s_even = _mm256_srai_epi16(_mm256_slli_epi16(s, 8), 8);
  const __m256i s_odd = _mm256_srai_epi16(s, 8);
  const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(u_even, s_even), _mm256_madd_epi16(u_odd, s_odd));
  return _mm256_add_epi32(acc, sum);
}
inline simde__m512i dpbusd(simde__m512i acc, simde__m512i u, simde__m512i s) {
  return join(dpbusd8(lo(acc), lo(u), lo(s)), dpbusd8(hi(acc), hi(u), hi(s)));
}
}  // namespace attnlab_simd

#define _mm512_cvtepi32_ps attnlab_simd::cvtepi32_ps
#define _mm512_cvtps_epi32 attnlab_simd::cvtps_epi32
#define _mm512_cvtepi8_epi32 attnlab_simd::cvtepi8_epi32
#define _mm512_cvtepu8_epi32 attnlab_simd::cvtepu8_epi32
#define _mm512_cvtepu16_epi32 attnlab_simd::cvtepu16_epi32
#define _mm512_cvtph_ps attnlab_simd::cvtph_ps
#define _mm512_cvtepi32_epi16 attnlab_simd::cvtepi32_epi16
#define _mm512_cvtepi32_epi8 attnlab_simd::cvtepi32_epi8
#define _mm512_maskz_loadu_ps attnlab_simd::maskz_loadu_ps
#define _mm512_mask_storeu_ps attnlab_simd::mask_storeu_ps
#define _mm512_maskz_loadu_epi8 attnlab_simd::maskz_loadu_epi8
#define _mm256_maskz_loadu_epi16 attnlab_simd::maskz_loadu_epi16
#define _mm512_reduce_add_ps attnlab_simd::reduce_add_ps
#define _mm512_reduce_max_ps attnlab_simd::reduce_max_ps
#define _mm512_reduce_add_epi32 attnlab_simd::reduce_add_epi32
#define _mm512_shuffle_f32x4(a, b, imm8) simde_mm512_shuffle_f32x4(a, b, imm8)
#undef _mm512_cmp_ps_mask
#define _mm512_cmp_ps_mask(a, b, imm) attnlab_simd::cmp_ps_mask<(imm)>(a, b)
#undef _mm512_mask_blend_ps
#define _mm512_mask_blend_ps attnlab_simd::mask_blend_ps
#undef _mm512_roundscale_ps
#define _mm512_roundscale_ps(a, imm) attnlab_simd::roundscale_ps<(imm)>(a)
#undef _mm512_scalef_ps
#define _mm512_scalef_ps attnlab_simd::scalef_ps
#undef _mm512_dpbusd_epi32
#undef _mm256_dpbusd_epi32
#define _mm512_dpbusd_epi32 attnlab_simd::dpbusd
#define _mm256_dpbusd_epi32 attnlab_simd::dpbusd8
#endif

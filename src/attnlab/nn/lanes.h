// The vector the selective-scan kernels (ssm_scan.h, ssm_scan.cpp) and the short attention of training
// (short_attention.cpp) run on: kLanes fp32 values, 16 in a 512-bit register where the CPU has AVX512,
// 8 in a 256-bit one in the "avx2" build (nn/quant_kernel.py INSTRUCTION_SETS, CPUs such as AMD EPYC
// Zen 3). The other kernels reach AVX2 through SIMDe's emulated 512-bit vectors (simd_compat.h); these
// cannot: the scan keeps N state vectors in registers for a whole sequence, attention two rows of
// accumulators, and as pairs of 256-bit halves with bit-by-bit masks they were spilled and rebuilt at
// every step (the scan ran no faster than the PyTorch loop there, attention slower than SDPA). So they
// are written once against the functions below, each one instruction of either width (exp and log1p:
// Sleef's), in the same order: an element's value has the same bits in both builds; only the sums
// across lanes (∂B, ∂C; a softmax's denominator, do · o) add their lanes in groups of the width.
#pragma once

#include "simd_compat.h"
#include <cmath>
#include <cstdint>

namespace attnlab_lanes {

#if defined(__AVX512F__)
// Sleef's log1p (1 ulp), exported by libtorch_cpu like its exp (decode_ops.h), as F.softplus runs it.
// Weak, so a build of torch without it falls back to std::log1p lane by lane.
extern "C" __m512 Sleef_log1pf16_u10(__m512) __attribute__((weak));

using Vec = __m512;
using Mask = __mmask16;  // the lanes of a block that hold channels (all but the last block's tail)
constexpr int64_t kLanes = 16;

__attribute__((always_inline)) inline Mask lanes(int64_t d0, int64_t di) {
  return di - d0 >= kLanes ? (Mask)0xFFFF : (Mask)((1u << (di - d0)) - 1);
}
// A block with every lane (all but the last block's tail) takes plain loads and stores, as the AVX2 build
// does: the same values, and on AMD Zen 5 the masked forms were slower in the scan's loops.
__attribute__((always_inline)) inline Vec load(const float* p, Mask m) {
  return m == 0xFFFF ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}
__attribute__((always_inline)) inline void store(float* p, Mask m, Vec v) {
  if (m == 0xFFFF)
    _mm512_storeu_ps(p, v);
  else
    _mm512_mask_storeu_ps(p, m, v);
}
__attribute__((always_inline)) inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
__attribute__((always_inline)) inline Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
__attribute__((always_inline)) inline Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
__attribute__((always_inline)) inline Vec div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
__attribute__((always_inline)) inline Vec set1(float v) { return _mm512_set1_ps(v); }
__attribute__((always_inline)) inline Vec zero() { return _mm512_setzero_ps(); }
__attribute__((always_inline)) inline Vec loadu(const float* p) { return _mm512_loadu_ps(p); }
__attribute__((always_inline)) inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
__attribute__((always_inline)) inline Vec round_nearest(Vec v) {  // to an integer, ties to even
  return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
__attribute__((always_inline)) inline Vec scalef(Vec a, Vec q) { return _mm512_scalef_ps(a, q); }  // a · 2^q
// then where v > t (ordered: not for NaN), else otherwise; where_lt likewise for v < t
__attribute__((always_inline)) inline Vec where_gt(Vec v, float t, Vec otherwise, Vec then) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, _mm512_set1_ps(t), _CMP_GT_OQ), otherwise, then);
}
__attribute__((always_inline)) inline Vec where_lt(Vec v, float t, Vec otherwise, Vec then) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, _mm512_set1_ps(t), _CMP_LT_OQ), otherwise, then);
}
inline Vec vlog1p(Vec x) {
  if (Sleef_log1pf16_u10 != nullptr) return Sleef_log1pf16_u10(x);
  alignas(64) float t[16];
  _mm512_store_ps(t, x);
  for (float& v : t) v = std::log1p(v);
  return _mm512_load_ps(t);
}

// r[n] = Σ of the 16 lanes of v[n], n = 0 .. 15: a butterfly of shuffles (46 instructions in place of
// 16 horizontal reductions of 8 each), summing in another order than _mm512_reduce_add_ps.
inline Vec hsum_lanes(const Vec* v) {
  __m512 w[8], u[4], q[2];
  for (int i = 0; i < 8; ++i)  // 256-bit halves
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int i = 0; i < 4; ++i)  // 128-bit quarters: quarter k of u[i] holds v[4i + k]
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int i = 0; i < 2; ++i)  // pairs of lanes
    q[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(q[0], q[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(q[0], q[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // r[4k + j] is the sum of v[4j + k]
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(order, r);
}
inline float hsum(Vec v) { return _mm512_reduce_add_ps(v); }
inline void store_all(float* p, Vec v) { _mm512_storeu_ps(p, v); }
__attribute__((always_inline)) inline Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline float hmax(Vec v) { return _mm512_reduce_max_ps(v); }
// lanes [0, n) of a vector; none for n ≤ 0, all for n ≥ kLanes
__attribute__((always_inline)) inline Mask first(int64_t n) {
  return n >= kLanes ? (Mask)0xFFFF : n <= 0 ? (Mask)0 : (Mask)((1u << n) - 1);
}
__attribute__((always_inline)) inline Vec select(Mask m, Vec then, Vec otherwise) {
  return _mm512_mask_blend_ps(m, otherwise, then);
}
__attribute__((always_inline)) inline Vec keep(Mask m, Vec v) { return _mm512_maskz_mov_ps(m, v); }  // 0 elsewhere
// kLanes bf16 values widened to fp32 (exact)
__attribute__((always_inline)) inline Vec load_bf16(const uint16_t* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
// fp32 → bf16, round to nearest even, NaN kept a (quiet) NaN: c10::BFloat16's rule
__attribute__((always_inline)) inline void store_bf16(uint16_t* p, Vec x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}

#else  // AVX2, FMA, F16C
extern "C" __m256 Sleef_log1pf8_u10avx2(__m256) __attribute__((weak));

using Vec = __m256;
struct Mask {
  __m256i on;  // all ones in the lanes that hold channels
  bool full;   // every lane: plain loads and stores
};
constexpr int64_t kLanes = 8;

__attribute__((always_inline)) inline Mask lanes(int64_t d0, int64_t di) {
  const int64_t n = di - d0;
  return {_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n < kLanes ? n : kLanes)),
                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
          n >= kLanes};
}
__attribute__((always_inline)) inline Vec load(const float* p, const Mask& m) {
  return m.full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m.on);
}
__attribute__((always_inline)) inline void store(float* p, const Mask& m, Vec v) {
  if (m.full)
    _mm256_storeu_ps(p, v);
  else
    _mm256_maskstore_ps(p, m.on, v);
}
__attribute__((always_inline)) inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
__attribute__((always_inline)) inline Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
__attribute__((always_inline)) inline Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
__attribute__((always_inline)) inline Vec div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
__attribute__((always_inline)) inline Vec set1(float v) { return _mm256_set1_ps(v); }
__attribute__((always_inline)) inline Vec zero() { return _mm256_setzero_ps(); }
__attribute__((always_inline)) inline Vec loadu(const float* p) { return _mm256_loadu_ps(p); }
__attribute__((always_inline)) inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
__attribute__((always_inline)) inline Vec round_nearest(Vec v) {
  return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
__attribute__((always_inline)) inline Vec scalef(Vec a, Vec q) { return attnlab_simd::scalef8(a, q); }
__attribute__((always_inline)) inline Vec where_gt(Vec v, float t, Vec otherwise, Vec then) {
  return _mm256_blendv_ps(otherwise, then, _mm256_cmp_ps(v, _mm256_set1_ps(t), _CMP_GT_OQ));
}
__attribute__((always_inline)) inline Vec where_lt(Vec v, float t, Vec otherwise, Vec then) {
  return _mm256_blendv_ps(otherwise, then, _mm256_cmp_ps(v, _mm256_set1_ps(t), _CMP_LT_OQ));
}
inline Vec vlog1p(Vec x) {
  if (Sleef_log1pf8_u10avx2 != nullptr) return Sleef_log1pf8_u10avx2(x);
  alignas(32) float t[8];
  _mm256_store_ps(t, x);
  for (float& v : t) v = std::log1p(v);
  return _mm256_load_ps(t);
}

// r[n] = Σ of the 8 lanes of v[n], n = 0 .. 7: pairwise horizontal adds, then the two 128-bit halves.
inline Vec hsum_lanes(const Vec* v) {
  const __m256 a0 = _mm256_hadd_ps(v[0], v[1]), a1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 a2 = _mm256_hadd_ps(v[4], v[5]), a3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 b0 = _mm256_hadd_ps(a0, a1), b1 = _mm256_hadd_ps(a2, a3);  // halves: v0..3 | v4..7 of each
  return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}
inline float hsum(Vec v) {
  const __m128 u = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_add_ss(w, _mm_movehdup_ps(w)));
}
inline void store_all(float* p, Vec v) { _mm256_storeu_ps(p, v); }
__attribute__((always_inline)) inline Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline float hmax(Vec v) {
  const __m128 u = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  const __m128 w = _mm_max_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_max_ss(w, _mm_movehdup_ps(w)));
}
__attribute__((always_inline)) inline Mask first(int64_t n) { return lanes(0, n); }
__attribute__((always_inline)) inline Vec select(const Mask& m, Vec then, Vec otherwise) {
  return m.full ? then : _mm256_blendv_ps(otherwise, then, _mm256_castsi256_ps(m.on));
}
__attribute__((always_inline)) inline Vec keep(const Mask& m, Vec v) {
  return m.full ? v : _mm256_and_ps(_mm256_castsi256_ps(m.on), v);
}
__attribute__((always_inline)) inline Vec load_bf16(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
__attribute__((always_inline)) inline void store_bf16(uint16_t* p, Vec x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC0)),
                                           _mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
  // each lane ≤ 0xFFFF, so the unsigned saturating pack keeps it
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}
#endif

__attribute__((always_inline)) inline Vec ones() { return set1(1.0f); }
constexpr float kLog2e = 0x1.715476p+0f;  // log2(e) = 1 / ln 2, as float (vexp; the scan's decays, vexp2)
__attribute__((always_inline)) inline Vec neg(Vec v) { return sub(zero(), v); }

// e^x, bit for bit Sleef's expf_u10 (decode_ops.h exp16 says how; this is its one formula, for
// either width): q = round(x / ln 2), s = x − q ln 2 in two FMA steps, 1 + s + s² P(s) (degree 7),
// times 2^q; 0 below −104, ∞ above 100, NaN stays NaN.
__attribute__((always_inline)) inline Vec vexp(Vec x) {
  const Vec qf = round_nearest(mul(x, set1(kLog2e)));
  Vec s = fmadd(qf, set1(-0x1.62e4p-1f), x);                     // − ln 2, upper part
  s = fmadd(qf, set1(-0x1.7f7d1cp-20f), s);                      // − ln 2, lower part
  Vec u = set1(0x1.a057b4p-13f);
  u = fmadd(u, s, set1(0x1.6d2d92p-10f));
  u = fmadd(u, s, set1(0x1.11114cp-7f));
  u = fmadd(u, s, set1(0x1.5554f4p-5f));
  u = fmadd(u, s, set1(0x1.555556p-3f));
  u = fmadd(u, s, set1(0.5f));
  u = add(fmadd(mul(s, s), u, s), ones());
#if !defined(__AVX512F__)
  // Every lane in [−87, 88] (q in [−126, 127]): 2^q is a normal float, so u · 2^q in one multiply
  // rounds once to the same value as scalef8's two factors, and no lane needs the limits below.
  // AVX2 has no one-instruction scalef; this skips its emulation and the two blends (the scan's decays
  // exp(Δ A) are always here).
  if (_mm256_movemask_ps(_mm256_and_ps(_mm256_cmp_ps(x, set1(-87.0f), _CMP_GE_OQ),
                                       _mm256_cmp_ps(x, set1(88.0f), _CMP_LE_OQ))) == 0xFF) {
    const __m256i q = _mm256_cvtps_epi32(qf);
    return mul(u, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(q, _mm256_set1_epi32(127)), 23)));
  }
#endif
  u = scalef(u, qf);  // u · 2^q
  u = where_lt(x, -104.0f, u, zero());
  return where_gt(x, 100.0f, u, set1(__builtin_inff()));
}

// 2^x, relative error ≤ 1.6e-7 (3 ulp): r = round(x), f = x − r in [−½, ½], 2^f ≈ 1 + f · P(f) with P of
// degree 4 (a relative minimax fit on [−½, ½], evaluated with FMAs), times 2^r. Exactly 1 at x = 0 (and
// at −0); ∞ above 128 (AVX2: from 127.5); NaN stays NaN. Below the normal range the builds differ (the one exception to
// this file's same bits): AVX512's scalef keeps denormals, AVX2 gives 0 for x < −126.5. Eight
// operations in place of vexp's fifteen: the selective scan's decays exp(Δ A) = 2^(Δ log2(e) · A),
// one per state and step (ssm_scan.h), where vexp's last ulp buys nothing.
__attribute__((always_inline)) inline Vec vexp2(Vec x) {
#if !defined(__AVX512F__)
  x = _mm256_min_ps(set1(128.0f), _mm256_max_ps(set1(-127.0f), x));  // NaN: the second operand, x
#endif
  const Vec r = round_nearest(x), f = sub(x, r);
  Vec p = set1(0x1.5bd104p-10f);
  p = fmadd(p, f, set1(0x1.3cea8ap-7f));
  p = fmadd(p, f, set1(0x1.c6b714p-5f));
  p = fmadd(p, f, set1(0x1.ebf9bcp-3f));
  p = fmadd(p, f, set1(0x1.62e42ap-1f));
  p = fmadd(p, f, ones());
#if defined(__AVX512F__)
  return scalef(p, r);  // p · 2^r
#else
  // r in [−127, 128]: 2^r's bits are (r + 127) << 23, 0 for −127 (a flush) and ∞ for 128
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(r), _mm256_set1_epi32(127)), 23);
  return mul(p, _mm256_castsi256_ps(e));
#endif
}

// out[n] = Σ of the lanes of v[n] for n < N: kLanes at a time through hsum_lanes, the rest one by one.
inline void hsums(const Vec* v, int64_t N, float* out) {
  int64_t n = 0;
  for (; n + kLanes <= N; n += kLanes) store_all(out + n, hsum_lanes(v + n));
  for (; n < N; ++n) out[n] = hsum(v[n]);
}

}  // namespace attnlab_lanes

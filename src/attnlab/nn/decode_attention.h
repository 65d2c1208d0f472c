// Attention of one decoding step for the query heads that share one kv head (GQA; MHA is groups of
// one): out_h (Dh) = softmax(q_h · k_j / √Dh) v_j over the n visible slots j of that kv head's cache.
//
// Shapes: q (G, Dh) and out (G, Dh), head h at h·Dh; k, v (n, Dh) of one kv head, contiguous; p: scratch,
// head h's n scores at p + h·ldp. k and v are fp32, or fp16 (a half-size cache: each element widened
// exactly to fp32 when read); all arithmetic is fp32.
// Each head's arithmetic is its own (the same dot products, max, exp, sum and p·v additions in the
// same order whatever G), so a head's result does not depend on how many heads are taken together;
// the G heads only share the loads of each k_j and v_j (one pass over the kv head's cache instead of
// G). In a batched step the kv head's rows are the per-sequence cache's, read once per step from
// memory (SmolLM2-135M at B = 8: 368 KB of fp32 k and v per position, ~22 MB per step at 60
// positions, more than L2), so the caller prefetches the next group's rows while this one runs.
// The AVX2 build's attend_group_t is decode_attention_avx2.h's (native 8-lane vectors, 3 heads a pass).
// Source: Vaswani et al. 2017 eq. (1); Ainslie et al. 2023 (GQA); llama.cpp's flash-attention CPU path
// reads each kv row once for the heads of its group in the same way.
#pragma once

#include <ATen/ATen.h>
#include "simd_compat.h"
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "decode_ops.h"
#ifndef __AVX512F__
#include "decode_attention_avx2.h"  // attend_group_t on native 8-lane vectors (the AVX2 build)
#endif

namespace attnlab_decode {

// dst (n) = src (n) as the cache's dtype: fp32 copied, fp16 rounded to nearest even (as Tensor.half())
inline void store_row(float* dst, const float* src, int64_t n) { std::copy(src, src + n, dst); }
inline void store_row(at::Half* dst, const float* src, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)  // F16C (every build of the extension has it)
    _mm_storeu_si128((__m128i*)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) dst[i] = at::Half(src[i]);  // the same rounding
}

#ifdef __AVX512F__
constexpr int kHeadsPerPass = 4;

// 16 lanes of a cache row, read as fp32 (lanes outside m read as 0): fp32 rows as they are, fp16 rows
// (a half-size cache, as llama.cpp's default f16 cache) widened exactly
inline __m512 load_row(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load_row(const at::Half* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }

// four 16-lane sums at once, each added in _mm512_reduce_add_ps's tree (halves of 256, 128, then pairs
// of lanes: the same additions, so the same bits as reducing each alone): sum of a in lane 0, b in 4,
// c in 8, d in 12
inline __m512 reduce_add4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  const __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  const __m512 t = _mm512_add_ps(s, _mm512_shuffle_ps(s, s, 0x4E));
  return _mm512_add_ps(t, _mm512_shuffle_ps(t, t, 0xB1));
}

// G ≤ 4 heads from q against k, v (n, Dh), each head's arithmetic its own (module doc). Scores four keys at a
// time (4·G accumulators, one per (head, key), each summed over Dh in order, then reduce_add4); p·v
// from the normalized probabilities p·(1/Σ), each 16-lane chunk of Dh summed over the keys in order.
template <int G, class KV>
inline void attend_group_t(const float* q, const KV* k, const KV* v, int64_t n, int64_t dh, float* p,
                           int64_t ldp, float* out, const Ahead* ahead) {
  const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt((float)dh));
  const __m512i spread = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  __m512 mx[G];
#pragma GCC unroll 4
  for (int h = 0; h < G; ++h) mx[h] = _mm512_set1_ps(-INFINITY);
  const int64_t full = dh / 16 * 16;
  const __mmask16 tail = tail_mask(dh - full);
  for (int64_t j0 = 0; j0 < n; j0 += 4) {  // scores: dot(q_h, k_j), four keys j0..j0+3 side by side
    const int keys = (int)std::min<int64_t>(4, n - j0);
    if (ahead != nullptr)
      for (int t = 0; t < keys; ++t) ahead->step(j0 + t);
    const KV* kj[4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) kj[t] = k + (j0 + std::min(t, keys - 1)) * dh;  // past n: the last key again
    __m512 acc[G][4];
#pragma GCC unroll 4
    for (int h = 0; h < G; ++h)
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) acc[h][t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < dh; i += 16) {
      const __mmask16 m = i < full ? (__mmask16)0xFFFF : tail;
      __m512 kv[4];
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) kv[t] = load_row(kj[t] + i, m);
#pragma GCC unroll 4
      for (int h = 0; h < G; ++h) {
        const __m512 qv = _mm512_maskz_loadu_ps(m, q + h * dh + i);
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) acc[h][t] = _mm512_fmadd_ps(qv, kv[t], acc[h][t]);
      }
    }
    const __mmask16 valid = tail_mask(keys);
#pragma GCC unroll 4
    for (int h = 0; h < G; ++h) {
      const __m512 s = _mm512_mul_ps(
          _mm512_permutexvar_ps(spread, reduce_add4(acc[h][0], acc[h][1], acc[h][2], acc[h][3])), scale);
      _mm512_mask_storeu_ps(p + h * ldp + j0, valid, s);
      mx[h] = _mm512_mask_max_ps(mx[h], valid, mx[h], s);
    }
  }
  for (int h = 0; h < G; ++h) {  // exp(s − max) in place and its sum, then p · (1 / sum)
    float* ph = p + h * ldp;
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(mx[h]));
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = lanes_from(j, n);
      const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, ph + j), top));
      _mm512_mask_storeu_ps(ph + j, m, e);
      acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(m, e));
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(acc));
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = lanes_from(j, n);
      _mm512_mask_storeu_ps(ph + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, ph + j), inv));
    }
  }
  // out_h = Σ_j p_hj v_j, each 16-lane chunk of Dh summed over j in order, 4 chunks side by side
  // (lanes past Dh read as 0 and are not stored: always 4 chains, kept in registers)
  for (int64_t i0 = 0; i0 < dh; i0 += 64) {
    const int chunks = (int)std::min<int64_t>(4, (dh - i0 + 15) / 16);
    __mmask16 m[4];
    __m512 o[G][4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) m[c] = c < chunks ? lanes_from(i0 + 16 * c, dh) : (__mmask16)0;
#pragma GCC unroll 4
    for (int h = 0; h < G; ++h)
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) o[h][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      const KV* vj = v + j * dh + i0;
      __m512 vc[4];
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) vc[c] = load_row(vj + 16 * c, m[c]);
#pragma GCC unroll 4
      for (int h = 0; h < G; ++h) {
        const __m512 pj = _mm512_set1_ps(p[h * ldp + j]);
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) o[h][c] = _mm512_fmadd_ps(pj, vc[c], o[h][c]);
      }
    }
#pragma GCC unroll 4
    for (int h = 0; h < G; ++h)  // every chunk stored under its mask (none past Dh): o stays in registers
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) _mm512_mask_storeu_ps(out + h * dh + i0 + 16 * c, m[c], o[h][c]);
  }
}

#endif  // the AVX2 build's attend_group_t and kHeadsPerPass: decode_attention_avx2.h

// `heads` query heads from q (heads, Dh) sharing k, v (n, Dh), kHeadsPerPass at a time (4; AVX2: 3); out (heads, Dh); `ahead`
// (if any) asked for over the first 4 heads' pass over the keys
template <class KV>
inline void attend_group(const float* q, int64_t heads, const KV* k, const KV* v, int64_t n, int64_t dh,
                         float* p, int64_t ldp, float* out, const Ahead* ahead = nullptr) {
  for (int64_t h = 0; h < heads; h += kHeadsPerPass) {
    const float* qh = q + h * dh;
    float *ph = p + h * ldp, *oh = out + h * dh;
    const Ahead* a = h == 0 ? ahead : nullptr;
    switch (std::min<int64_t>(kHeadsPerPass, heads - h)) {
      case 4: if constexpr (kHeadsPerPass >= 4) attend_group_t<4, KV>(qh, k, v, n, dh, ph, ldp, oh, a); break;
      case 3: attend_group_t<3, KV>(qh, k, v, n, dh, ph, ldp, oh, a); break;
      case 2: attend_group_t<2, KV>(qh, k, v, n, dh, ph, ldp, oh, a); break;
      default: attend_group_t<1, KV>(qh, k, v, n, dh, ph, ldp, oh, a); break;
    }
  }
}

// rows n · Dh elements from k and from v into L2 (speed only: the next group's cache rows)
template <class KV>
inline void prefetch_rows(const KV* k, const KV* v, int64_t n, int64_t dh) {
  const char *kb = (const char*)k, *vb = (const char*)v;
  for (int64_t b = 0; b < n * dh * (int64_t)sizeof(KV); b += 64)
    _mm_prefetch(kb + b, _MM_HINT_T1), _mm_prefetch(vb + b, _MM_HINT_T1);
}

}  // namespace attnlab_decode

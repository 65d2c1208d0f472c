// Attention of one decoding step for the query heads that share one kv head (GQA; MHA is groups of
// one): out_h (Dh) = softmax(q_h · k_j / √Dh) v_j over the n visible slots j of that kv head's cache.
//
// Shapes: q (G, Dh) and out (G, Dh), head h at h·Dh; k, v (n, Dh) of one kv head, contiguous; p: scratch,
// head h's n scores at p + h·ldp; fp32 throughout.
// Each head's arithmetic is attend_head's (the same dot products, max, exp, sum and p·v additions in
// the same order), so a head's result does not depend on how many heads are taken together; the G
// heads only share the loads of each k_j and v_j (one pass over the kv head's cache instead of G).
// In a batched step the kv head's rows are the per-sequence cache's, read once per step from memory
// (SmolLM2-135M at B = 8: ~22 MB of k and v per step, more than L2), so the caller prefetches the next
// group's rows while this one runs (`prefetch_rows`).
// Source: Vaswani et al. 2017 eq. (1); Ainslie et al. 2023 (GQA); llama.cpp's flash-attention CPU path
// reads each kv row once for the heads of its group in the same way.
#pragma once

#include "simd_compat.h"
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "decode_ops.h"

namespace attnlab_decode {

// G ≤ 4 heads from q against k, v (n, Dh): as attend_head per head (module doc)
template <int G>
inline void attend_group_t(const float* q, const float* k, const float* v, int64_t n, int64_t dh, float* p,
                           int64_t ldp, float* out, const Ahead* ahead) {
  const float scale = 1.0f / std::sqrt((float)dh);
  float mx[G], inv[G];
  for (int h = 0; h < G; ++h) mx[h] = -INFINITY;
  const int64_t full = dh / 16 * 16;
  const __mmask16 tail = tail_mask(dh - full);
  for (int64_t j = 0; j < n; ++j) {  // scores: dot(q_h, k_j), each head's own 16-lane accumulator in order
    if (ahead != nullptr) ahead->step(j);
    const float* kj = k + j * dh;
    __m512 acc[G];
    for (int h = 0; h < G; ++h) acc[h] = _mm512_setzero_ps();
    for (int64_t i = 0; i < full; i += 16) {
      const __m512 kv = _mm512_loadu_ps(kj + i);
      for (int h = 0; h < G; ++h) acc[h] = _mm512_fmadd_ps(_mm512_loadu_ps(q + h * dh + i), kv, acc[h]);
    }
    if (full < dh) {
      const __m512 kv = _mm512_maskz_loadu_ps(tail, kj + full);
      for (int h = 0; h < G; ++h) acc[h] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q + h * dh + full), kv, acc[h]);
    }
    for (int h = 0; h < G; ++h) mx[h] = std::max(mx[h], p[h * ldp + j] = _mm512_reduce_add_ps(acc[h]) * scale);
  }
  for (int h = 0; h < G; ++h) {  // exp(s − max) in place, and its sum
    float* ph = p + h * ldp;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = lanes_from(j, n);
      const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, ph + j), _mm512_set1_ps(mx[h])));
      _mm512_mask_storeu_ps(ph + j, m, e);
      acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(m, e));
    }
    inv[h] = 1.0f / _mm512_reduce_add_ps(acc);
  }
  // out_h = Σ_j (p_hj · inv_h) v_j, each 16-lane chunk of Dh summed over j in order, 4 chunks side by side
  // (lanes past Dh read as 0 and are not stored: always 4 chains, kept in registers)
  for (int64_t i0 = 0; i0 < dh; i0 += 64) {
    const int chunks = (int)std::min<int64_t>(4, (dh - i0 + 15) / 16);
    __mmask16 m[4];
    __m512 o[G][4];
    for (int c = 0; c < 4; ++c) m[c] = c < chunks ? lanes_from(i0 + 16 * c, dh) : (__mmask16)0;
    for (int h = 0; h < G; ++h)
      for (int c = 0; c < 4; ++c) o[h][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      const float* vj = v + j * dh + i0;
      __m512 vc[4];
      for (int c = 0; c < 4; ++c) vc[c] = _mm512_maskz_loadu_ps(m[c], vj + 16 * c);
      for (int h = 0; h < G; ++h) {
        const __m512 pj = _mm512_set1_ps(p[h * ldp + j] * inv[h]);
        for (int c = 0; c < 4; ++c) o[h][c] = _mm512_fmadd_ps(pj, vc[c], o[h][c]);
      }
    }
    for (int h = 0; h < G; ++h)
      for (int c = 0; c < chunks; ++c) _mm512_mask_storeu_ps(out + h * dh + i0 + 16 * c, m[c], o[h][c]);
  }
}

// `heads` query heads from q (heads, Dh) sharing k, v (n, Dh), up to 4 at a time; out (heads, Dh); `ahead`
// (if any) asked for over the first 4 heads' pass over the keys
inline void attend_group(const float* q, int64_t heads, const float* k, const float* v, int64_t n, int64_t dh,
                         float* p, int64_t ldp, float* out, const Ahead* ahead = nullptr) {
  for (int64_t h = 0; h < heads; h += 4) {
    const float* qh = q + h * dh;
    float *ph = p + h * ldp, *oh = out + h * dh;
    const Ahead* a = h == 0 ? ahead : nullptr;
    switch (std::min<int64_t>(4, heads - h)) {
      case 4: attend_group_t<4>(qh, k, v, n, dh, ph, ldp, oh, a); break;
      case 3: attend_group_t<3>(qh, k, v, n, dh, ph, ldp, oh, a); break;
      case 2: attend_group_t<2>(qh, k, v, n, dh, ph, ldp, oh, a); break;
      default: attend_group_t<1>(qh, k, v, n, dh, ph, ldp, oh, a); break;
    }
  }
}

// rows n · Dh floats from k and from v into L2 (speed only: the next group's cache rows)
inline void prefetch_rows(const float* k, const float* v, int64_t n, int64_t dh) {
  const char *kb = (const char*)k, *vb = (const char*)v;
  for (int64_t b = 0; b < n * dh * 4; b += 64) _mm_prefetch(kb + b, _MM_HINT_T1), _mm_prefetch(vb + b, _MM_HINT_T1);
}

}  // namespace attnlab_decode

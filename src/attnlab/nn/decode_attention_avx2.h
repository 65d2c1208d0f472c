// decode_attention.h's attend_group_t for the AVX2 build: the same attention of G query heads that
// share one kv head, on native 8-lane vectors (lanes.h) where the AVX512 form, through SIMDe's
// emulated 16-lane vectors and masks, ran 2-3x slower (perf on an EPYC Zen 3: 37% of a batched Q8_0
// step at 128 positions). G ≤ 3 here: a pass's 3 × 4 score accumulators and 4 keys fill the 16 AVX2
// registers. Same algorithm, same order of operations per head whatever G; the additions of a dot
// product are grouped in 8 lanes instead of 16, so results differ from the AVX512 build's in the
// last bits (each build is exact against itself: a head's result does not depend on G or the batch).
// Shapes as decode_attention.h: q, out (G, Dh); k, v (n, Dh) fp32 or fp16; p (G, ldp) scratch.
#pragma once

#include <ATen/ATen.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "decode_ops.h"
#include "lanes.h"

namespace attnlab_decode {

constexpr int kHeadsPerPass = 3;  // register budget (module doc)

// 8 lanes of a cache row as fp32: fp32 as it is, fp16 widened exactly (F16C)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }

// [Σa, Σb, Σc, Σd] of four 8-lane vectors (pairwise horizontal adds, then the two 128-bit halves)
inline __m128 reduce_add4_8(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

template <int G, class KV>
inline void attend_group_t(const float* q, const KV* k, const KV* v, int64_t n, int64_t dh, float* p,
                           int64_t ldp, float* out, const Ahead* ahead) {
  using namespace attnlab_lanes;
  const float scale = 1.0f / std::sqrt((float)dh);
  const int64_t full = dh / 8 * 8;  // vector part of a row; the last dh − full elements one by one
  float mx[G];
  for (int h = 0; h < G; ++h) mx[h] = -INFINITY;
  for (int64_t j0 = 0; j0 < n; j0 += 4) {  // scores: dot(q_h, k_j), four keys j0..j0+3 side by side
    const int keys = (int)std::min<int64_t>(4, n - j0);
    if (ahead != nullptr)
      for (int t = 0; t < keys; ++t) ahead->step(j0 + t);
    const KV* kj[4];
    for (int t = 0; t < 4; ++t) kj[t] = k + (j0 + std::min(t, keys - 1)) * dh;  // past n: the last key again
    __m256 acc[G][4];
    for (int h = 0; h < G; ++h)
      for (int t = 0; t < 4; ++t) acc[h][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < full; i += 8) {
      __m256 kv[4];
      for (int t = 0; t < 4; ++t) kv[t] = load8(kj[t] + i);
      for (int h = 0; h < G; ++h) {
        const __m256 qv = _mm256_loadu_ps(q + h * dh + i);
        for (int t = 0; t < 4; ++t) acc[h][t] = _mm256_fmadd_ps(qv, kv[t], acc[h][t]);
      }
    }
    for (int h = 0; h < G; ++h) {
      alignas(16) float s[4];
      _mm_store_ps(s, reduce_add4_8(acc[h][0], acc[h][1], acc[h][2], acc[h][3]));
      for (int t = 0; t < keys; ++t) {
        for (int64_t i = full; i < dh; ++i) s[t] += q[h * dh + i] * (float)kj[t][i];
        const float score = s[t] * scale;
        p[h * ldp + j0 + t] = score;
        mx[h] = std::max(mx[h], score);
      }
    }
  }
  for (int h = 0; h < G; ++h) {  // exp(s − max) in place and its sum, then p · (1 / sum)
    float* ph = p + h * ldp;
    const Vec top = set1(mx[h]);
    Vec acc = zero();
    for (int64_t j = 0; j < n; j += kLanes) {
      const Mask m = lanes(j, n);
      const Vec e = vexp(sub(load(ph + j, m), top));
      store(ph + j, m, e);
      acc = add(acc, _mm256_and_ps(e, _mm256_castsi256_ps(m.on)));
    }
    const Vec inv = set1(1.0f / hsum(acc));
    for (int64_t j = 0; j < n; j += kLanes) {
      const Mask m = lanes(j, n);
      store(ph + j, m, mul(load(ph + j, m), inv));
    }
  }
  // out_h = Σ_j p_hj v_j, each 8-lane chunk of Dh summed over j in order, 4 chunks side by side
  for (int64_t i0 = 0; i0 < full; i0 += 32) {
    const int chunks = (int)std::min<int64_t>(4, (full - i0) / 8);
    __m256 o[G][4];
    for (int h = 0; h < G; ++h)
      for (int c = 0; c < 4; ++c) o[h][c] = _mm256_setzero_ps();
    if (chunks == 4) {
      for (int64_t j = 0; j < n; ++j) {
        const KV* vj = v + j * dh + i0;
        __m256 vc[4];
        for (int c = 0; c < 4; ++c) vc[c] = load8(vj + 8 * c);
        for (int h = 0; h < G; ++h) {
          const __m256 pj = _mm256_set1_ps(p[h * ldp + j]);
          for (int c = 0; c < 4; ++c) o[h][c] = _mm256_fmadd_ps(pj, vc[c], o[h][c]);
        }
      }
    } else {
      for (int64_t j = 0; j < n; ++j) {
        const KV* vj = v + j * dh + i0;
        for (int h = 0; h < G; ++h) {
          const __m256 pj = _mm256_set1_ps(p[h * ldp + j]);
          for (int c = 0; c < chunks; ++c) o[h][c] = _mm256_fmadd_ps(pj, load8(vj + 8 * c), o[h][c]);
        }
      }
    }
    for (int h = 0; h < G; ++h)
      for (int c = 0; c < chunks; ++c) _mm256_storeu_ps(out + h * dh + i0 + 8 * c, o[h][c]);
  }
  for (int h = 0; h < G; ++h)  // the last dh − full elements (none when Dh is a multiple of 8)
    for (int64_t i = full; i < dh; ++i) {
      float s = 0.0f;
      for (int64_t j = 0; j < n; ++j) s += p[h * ldp + j] * (float)v[j * dh + i];
      out[h * dh + i] = s;
    }
}

}  // namespace attnlab_decode

// The pieces of the selective-scan kernels (ssm_scan.cpp): the scan's inputs, the element-wise maps
// around it (Δ's bias and softplus, the skip D, the SiLU gate), one run of steps over a block of 16
// channels, and the horizontal sums of the backward pass. Every map rounds as the PyTorch operation
// it stands for (Sleef's exp and log1p, as F.silu and F.softplus run them: exp16 is Sleef's written
// out inline; no FMA: -ffp-contract=off), and each block's rows are prefetched kAhead steps ahead.
#pragma once

#include "simd_compat.h"
#include <cstdint>
#include <vector>

#include "decode_ops.h"  // exp16 (Sleef's exp, as F.silu's), prefetch, tail_mask

namespace attnlab_ssm {

using attnlab_decode::exp16;
using attnlab_decode::prefetch;
using attnlab_decode::tail_mask;

// Sleef's log1p (1 ulp), exported by libtorch_cpu like its exp (decode_ops.h): the 16-lane function,
// or in the AVX2 build (simd_compat.h) its 8-lane AVX2 one on each half, as F.softplus runs it on such
// a CPU. Weak, so a build of torch without it falls back to std::log1p lane by lane.
#if defined(__AVX512F__)
extern "C" __m512 Sleef_log1pf16_u10(__m512) __attribute__((weak));
#else
extern "C" __m256 Sleef_log1pf8_u10avx2(__m256) __attribute__((weak));
#endif

inline __m512 log1p16(__m512 x) {
#if defined(__AVX512F__)
  if (Sleef_log1pf16_u10 != nullptr) return Sleef_log1pf16_u10(x);
#else
  if (Sleef_log1pf8_u10avx2 != nullptr)
    return attnlab_simd::join(Sleef_log1pf8_u10avx2(attnlab_simd::lo(x)), Sleef_log1pf8_u10avx2(attnlab_simd::hi(x)));
#endif
  alignas(64) float t[16];
  _mm512_store_ps(t, x);
  for (float& v : t) v = std::log1p(v);
  return _mm512_load_ps(t);
}

constexpr int64_t kLanes = 16;
// Rows prefetched ahead of the step in use: a (sequence, block) walks its rows at a stride of Di
// floats, one cache line each, which the hardware prefetcher does not follow (causal_conv.cpp).
constexpr int64_t kAhead = 8;

inline __mmask16 lanes(int64_t d0, int64_t di) { return di - d0 >= kLanes ? (__mmask16)0xFFFF : tail_mask(di - d0); }
inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 ones() { return _mm512_set1_ps(1.0f); }
inline __m512 neg(__m512 v) { return _mm512_sub_ps(_mm512_setzero_ps(), v); }

// The scan's inputs (fp32, contiguous): x, dt (B, T, Di); At (N, Di); B, C (B, T, N); optional D (Di,),
// z (B, T, Di) and dt_bias (Di,) (nullptr when absent); softplus: Δ = softplus(dt + dt_bias).
struct Scan {
  const float *x, *dt, *At, *B, *C, *D, *z, *dt_bias;
  bool softplus;
  int64_t T, Di, N;
  int64_t blocks() const { return (Di + kLanes - 1) / kLanes; }
  int64_t row(int64_t b, int64_t t, int64_t d0) const { return (b * T + t) * Di + d0; }

  // the lines of step t's rows that a step reads: x, dt, z at channels d0.., B and C
  void prefetch_step(int64_t b, int64_t t, int64_t d0) const {
    const int64_t r = row(b, t, d0);
    prefetch(x + r);
    prefetch(dt + r);
    if (z) prefetch(z + r);
    prefetch(B + (b * T + t) * N);
    prefetch(C + (b * T + t) * N);
  }
  // dt + dt_bias at row, before the softplus (what its derivative needs)
  __m512 raw_delta(int64_t r, int64_t d0, __mmask16 m) const {
    const __m512 v = load(dt + r, m);
    return dt_bias ? _mm512_add_ps(v, load(dt_bias + d0, m)) : v;
  }
  // Δ from raw_delta: torch's softplus (β 1, threshold 20): v > 20 ? v : log1p(exp(v))
  __m512 delta(__m512 v) const {
    if (!softplus) return v;
    const __mmask16 big = _mm512_cmp_ps_mask(v, _mm512_set1_ps(20.0f), _CMP_GT_OQ);
    return _mm512_mask_blend_ps(big, log1p16(exp16(v)), v);
  }
  // the output from the scan's Σ_n C h: (acc + D x) · SiLU(z), SiLU(z) = z / (1 + exp(−z)) as F.silu
  __m512 output(__m512 acc, int64_t r, int64_t d0, __mmask16 m) const {
    __m512 y = D ? _mm512_add_ps(acc, _mm512_mul_ps(load(D + d0, m), load(x + r, m))) : acc;
    if (z) {
      const __m512 zv = load(z + r, m);
      y = _mm512_mul_ps(y, _mm512_div_ps(zv, _mm512_add_ps(ones(), exp16(neg(zv)))));
    }
    return y;
  }
};

// What a run of steps keeps of each step t (index t − t0), each pointer optional: acc, Σ_n C_t,n h_n
// (one vector); prev and decay, h_{t−1} and a_t (N vectors each); delta, Δ_t (one vector).
struct Kept {
  __m512 *acc = nullptr, *prev = nullptr, *decay = nullptr, *delta = nullptr;
};

// The scan's state count as the loops see it: kN when it is a compile-time constant (the kernels'
// 16, the d_state of every Mamba recipe: the loops unroll and the states stay in registers), else
// the run's N (kN = 0).
template <int64_t kN>
inline int64_t states(const Scan& s) { return kN > 0 ? kN : s.N; }

// N vectors: a fixed array for a compile-time kN (registers, once the loops unroll), else on the heap.
template <int64_t kN>
struct Vectors {
  __m512 v[kN];
  explicit Vectors(int64_t) {}
  __m512* data() { return v; }
};
template <>
struct Vectors<0> {
  std::vector<__m512> v;
  explicit Vectors(int64_t n) : v(n) {}
  __m512* data() { return v.data(); }
};

// Runs steps t0 .. t1 − 1 of sequence b, channels d0 .. d0 + 15, from the states h (N vectors).
// WithY: computes Σ_n C_t,n h_n and writes output() to y (when y is given); keeps what `keep` asks.
// ahead(t) is called kAhead steps before step t (for the lines that t will read or write).
template <int64_t kN, bool WithY, typename Ahead>
inline void steps(const Scan& s, int64_t b, int64_t d0, int64_t t0, int64_t t1, __m512* h, float* y,
                  const Kept& keep, Ahead ahead) {
  const __mmask16 m = lanes(d0, s.Di);
  const int64_t N = states<kN>(s);
  for (int64_t t = t0; t < t1; ++t) {
    if (t + kAhead < t1) ahead(t + kAhead);
    const int64_t r = s.row(b, t, d0), j = t - t0;
    const __m512 dtv = s.delta(s.raw_delta(r, d0, m));
    const __m512 dx = _mm512_mul_ps(dtv, load(s.x + r, m));
    const float* Bt = s.B + (b * s.T + t) * N;
    const float* Ct = s.C + (b * s.T + t) * N;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t n = 0; n < N; ++n) {
      const __m512 a = exp16(_mm512_mul_ps(dtv, load(s.At + n * s.Di + d0, m)));
      if (keep.prev) keep.prev[j * N + n] = h[n];
      if (keep.decay) keep.decay[j * N + n] = a;
      h[n] = _mm512_add_ps(_mm512_mul_ps(a, h[n]), _mm512_mul_ps(dx, _mm512_set1_ps(Bt[n])));
      if (WithY) acc = _mm512_add_ps(acc, _mm512_mul_ps(h[n], _mm512_set1_ps(Ct[n])));
    }
    if (keep.delta) keep.delta[j] = dtv;
    if (WithY && y != nullptr) _mm512_mask_storeu_ps(y + r, m, s.output(acc, r, d0, m));
    if (WithY && keep.acc != nullptr) keep.acc[j] = acc;
  }
}

// r[n] = Σ of the 16 lanes of v[n], n = 0 .. 15: a butterfly of shuffles (46 instructions in place of
// 16 horizontal reductions of 8 each), summing in another order than _mm512_reduce_add_ps.
inline __m512 hsum16(const __m512* v) {
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

// out[n] = Σ of the 16 lanes of v[n] for n < N: 16 at a time through hsum16, the rest one by one.
inline void hsums(const __m512* v, int64_t N, float* out) {
  int64_t n = 0;
  for (; n + 16 <= N; n += 16) _mm512_storeu_ps(out + n, hsum16(v + n));
  for (; n < N; ++n) out[n] = _mm512_reduce_add_ps(v[n]);
}

inline void load_state(const float* src, int64_t b, int64_t d0, int64_t N, int64_t Di, __m512* h) {
  const __mmask16 m = lanes(d0, Di);
  for (int64_t n = 0; n < N; ++n) h[n] = src ? load(src + (b * N + n) * Di + d0, m) : _mm512_setzero_ps();
}

inline void store_state(float* dst, int64_t b, int64_t d0, int64_t N, int64_t Di, const __m512* h) {
  const __mmask16 m = lanes(d0, Di);
  for (int64_t n = 0; n < N; ++n) _mm512_mask_storeu_ps(dst + (b * N + n) * Di + d0, m, h[n]);
}

}  // namespace attnlab_ssm

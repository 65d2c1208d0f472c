// The pieces of the selective-scan kernels (ssm_scan.cpp): the scan's inputs, the element-wise maps
// around it (Δ's bias and softplus, the skip D, the SiLU gate) and one run of steps over a block of
// kLanes channels (16 with AVX512, 8 with AVX2: lanes.h, whose functions the code is written
// with). Every map rounds as the PyTorch operation it stands for (Sleef's exp and log1p, as F.silu and
// F.softplus run them: vexp is Sleef's written out inline, lanes.h; no FMA: -ffp-contract=off). The
// recurrence itself, per state and step, is where the time goes, and takes the cheaper forms: the
// decay exp(Δ A) as 2^(Δ log2(e) · A) through vexp2 (8 operations in place of 15, relative error
// ≤ 1.6e-7 against 6e-8) and its products and sums as FMAs (explicit fmadd: one rounding each), so
// the states agree with the PyTorch loop's to fp32 rounding, not bit for bit (tests/nn/test_ssm.py,
// 1e-5). Each block's rows are prefetched kAhead steps ahead.
#pragma once

#include "simd_compat.h"
#include <cstdint>
#include <vector>

#include "decode_ops.h"  // prefetch
#include "lanes.h"       // Vec, Mask, kLanes and the functions on them

namespace attnlab_ssm {

using namespace attnlab_lanes;
using attnlab_decode::prefetch;

// Rows prefetched ahead of the step in use: a (sequence, block) walks its rows at a stride of Di
// floats, one cache line each, which the hardware prefetcher does not follow (causal_conv.cpp).
constexpr int64_t kAhead = 8;

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
  __attribute__((always_inline)) Vec raw_delta(int64_t r, int64_t d0, const Mask& m) const {
    const Vec v = load(dt + r, m);
    return dt_bias ? add(v, load(dt_bias + d0, m)) : v;
  }
  // Δ from raw_delta: torch's softplus (β 1, threshold 20): v > 20 ? v : log1p(exp(v))
  __attribute__((always_inline)) Vec delta(Vec v) const {
    if (!softplus) return v;
    return where_gt(v, 20.0f, vlog1p(vexp(v)), v);
  }
  // the output from the scan's Σ_n C h: (acc + D x) · SiLU(z), SiLU(z) = z / (1 + exp(−z)) as F.silu
  __attribute__((always_inline)) Vec output(Vec acc, int64_t r, int64_t d0, const Mask& m) const {
    Vec y = D ? add(acc, mul(load(D + d0, m), load(x + r, m))) : acc;
    if (z) {
      const Vec zv = load(z + r, m);
      y = mul(y, div(zv, add(ones(), vexp(neg(zv)))));
    }
    return y;
  }
};

// What a run of steps keeps of each step t (index t − t0), each pointer optional: acc, Σ_n C_t,n h_n
// (one vector); prev and decay, h_{t−1} and a_t (N vectors each); delta, Δ_t (one vector).
struct Kept {
  Vec *acc = nullptr, *prev = nullptr, *decay = nullptr, *delta = nullptr;
};

// The scan's state count as the loops see it: kN when it is a compile-time constant (the kernels'
// 16, the d_state of every Mamba recipe: the loops unroll and the states stay in registers), else
// the run's N (kN = 0).
template <int64_t kN>
inline int64_t states(const Scan& s) { return kN > 0 ? kN : s.N; }

// N vectors: a fixed array for a compile-time kN (registers, once the loops unroll), else on the heap.
template <int64_t kN>
struct Vectors {
  Vec v[kN];
  explicit Vectors(int64_t) {}
  Vec* data() { return v; }
};
template <>
struct Vectors<0> {
  std::vector<Vec> v;
  explicit Vectors(int64_t n) : v(n) {}
  Vec* data() { return v.data(); }
};

// Runs steps t0 .. t1 − 1 of sequence b, channels d0 .. d0 + 15, from the states h (N vectors).
// WithY: computes Σ_n C_t,n h_n and writes output() to y (when y is given); keeps what `keep` asks.
// ahead(t) is called kAhead steps before step t (for the lines that t will read or write).
template <int64_t kN, bool WithY, typename Ahead>
inline void steps(const Scan& s, int64_t b, int64_t d0, int64_t t0, int64_t t1, Vec* h, float* y,
                  const Kept& keep, Ahead ahead) {
  const Mask m = lanes(d0, s.Di);
  const int64_t N = states<kN>(s);
  for (int64_t t = t0; t < t1; ++t) {
    if (t + kAhead < t1) ahead(t + kAhead);
    const int64_t r = s.row(b, t, d0), j = t - t0;
    const Vec dtv = s.delta(s.raw_delta(r, d0, m));
    const Vec dx = mul(dtv, load(s.x + r, m)), dl = mul(dtv, set1(kLog2e));
    const float* Bt = s.B + (b * s.T + t) * N;
    const float* Ct = s.C + (b * s.T + t) * N;
    Vec acc = zero();
    for (int64_t n = 0; n < N; ++n) {
      const Vec a = vexp2(mul(dl, load(s.At + n * s.Di + d0, m)));  // exp(Δ A) = 2^(Δ log2(e) · A)
      if (keep.prev) keep.prev[j * N + n] = h[n];
      if (keep.decay) keep.decay[j * N + n] = a;
      h[n] = fmadd(a, h[n], mul(dx, set1(Bt[n])));
      if (WithY) acc = fmadd(h[n], set1(Ct[n]), acc);
    }
    if (keep.delta) keep.delta[j] = dtv;
    if (WithY && y != nullptr) store(y + r, m, s.output(acc, r, d0, m));
    if (WithY && keep.acc != nullptr) keep.acc[j] = acc;
  }
}

inline void load_state(const float* src, int64_t b, int64_t d0, int64_t N, int64_t Di, Vec* h) {
  const Mask m = lanes(d0, Di);
  for (int64_t n = 0; n < N; ++n) h[n] = src ? load(src + (b * N + n) * Di + d0, m) : zero();
}

inline void store_state(float* dst, int64_t b, int64_t d0, int64_t N, int64_t Di, const Vec* h) {
  const Mask m = lanes(d0, Di);
  for (int64_t n = 0; n < N; ++n) store(dst + (b * N + n) * Di + d0, m, h[n]);
}

}  // namespace attnlab_ssm

// The vector operations of one decoding step (fused_decode.cpp) other than the matrix products,
// each rounding as the PyTorch operation it stands for where that is practical:
//   RMSNorm     Σx² added in the order of PyTorch's CPU sum (ATen native/cpu/SumKernel.cpp), then
//               x · (1 / sqrt(Σx² / n + ε)) · g as nn/norm.py: bit for bit PyTorch's
//   RoPE        x·cos + rotate_half(x)·sin, three roundings as nn/rope.py (no FMA: -ffp-contract=off)
//   SiLU(g)·u   g / (1 + exp(−g)) with Sleef's exp, as F.silu: bit for bit PyTorch's
// (attention: decode_attention.h.) Shapes: x, g (n,); heads (n, Dh); fp32 throughout.
// Source: ggml-cpu's rms_norm, rope_neox and swiglu (same algebra); Zhang & Sennrich 2019 (RMSNorm),
// Su et al. 2021 (RoPE), Shazeer 2020 (SwiGLU).
#pragma once

#include "simd_compat.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "lanes.h"  // vexp, the exp formula of exp16

namespace attnlab_decode {

constexpr int kSumLanes = 8;  // PyTorch's fp32 sum kernel runs 8-lane (AVX2) vectors, on AVX512 CPUs too

inline __mmask16 tail_mask(int64_t n) { return (__mmask16)((1u << n) - 1); }

inline float dot(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  if (i < n) {
    const __mmask16 k = tail_mask(n - i);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// acc[0..4) (w lanes each) = PyTorch's multi_row_sum<4> of x²: `size` rows of 4 units of w floats
// (ATen native/cpu/SumKernel.cpp: a 4-level cascade of accumulators, 2^power rows per level step)
inline void multi_row_sum_sq(const float* x, int64_t size, int w, float out[4][16]) {
  constexpr int levels = 4;
  int64_t log2 = 0;
  while ((int64_t(1) << log2) < size) ++log2;
  const int64_t power = std::max<int64_t>(4, log2 / levels), step = int64_t(1) << power, mask = step - 1;
  float acc[levels][4][16] = {};
  auto add_row = [&](int64_t i) {
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < w; ++l) {
        const float e = x[(i * 4 + k) * w + l];
        acc[0][k][l] += e * e;  // pow(2), then the sum (no FMA: -ffp-contract=off)
      }
  };
  int64_t i = 0;
  while (i + step <= size) {
    for (int64_t j = 0; j < step; ++j, ++i) add_row(i);
    for (int j = 1; j < levels; ++j) {
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < w; ++l) acc[j][k][l] += acc[j - 1][k][l], acc[j - 1][k][l] = 0.0f;
      if ((i & (mask << (j * power))) != 0) break;
    }
  }
  for (; i < size; ++i) add_row(i);
  for (int j = 1; j < levels; ++j)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < w; ++l) acc[0][k][l] += acc[j][k][l];
  std::copy(&acc[0][0][0], &acc[0][0][0] + 4 * 16, &out[0][0]);
}

// sum (w lanes) = PyTorch's row_sum of x² over `units` units of w floats (4 interleaved partial sums)
inline void row_sum_sq(const float* x, int64_t units, int w, float sum[16]) {
  float part[4][16];
  const int64_t rows = units / 4;
  multi_row_sum_sq(x, rows, w, part);
  for (int64_t u = rows * 4; u < units; ++u)
    for (int l = 0; l < w; ++l) part[0][l] += x[u * w + l] * x[u * w + l];
  for (int k = 1; k < 4; ++k)
    for (int l = 0; l < w; ++l) part[0][l] += part[k][l];
  std::copy(part[0], part[0] + 16, sum);
}

// Σ x² over a contiguous fp32 row in the order of PyTorch's CPU sum with `lanes`-wide vectors
// (cascade_sum → vectorized_inner_sum: the vector part, then the tail, then the lanes), so that
// RMSNorm's mean square, hence the int8 grid of the activations that follow, is PyTorch's bit for bit
// (exact ties of that grid are common after a quantized embedding; tests/nn/test_fused_decode.py).
inline float torch_sum_squares(const float* x, int64_t n, int lanes = kSumLanes) {
  float v[16];
  if (n < lanes) {
    row_sum_sq(x, n, 1, v);
    return v[0];
  }
  const int64_t units = n / lanes;
  row_sum_sq(x, units, lanes, v);
  float total = 0.0f;
  for (int64_t k = units * lanes; k < n; ++k) total += x[k] * x[k];
  for (int l = 0; l < lanes; ++l) total += v[l];
  return total;
}

// r = 1 / sqrt(Σx² / n + eps), RMSNorm's scale of a row, nn/norm.py's operations in its order
inline float rms_inverse(const float* x, int64_t n, float eps) {
  return 1.0f / std::sqrt(torch_sum_squares(x, n) / (float)n + eps);
}

// y = RMSNorm(x) · g = g · (x · r), nn/norm.py's operations in its order
inline void rmsnorm(const float* x, const float* g, int64_t n, float eps, float* y) {
  const float r = rms_inverse(x, n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] * (x[i] * r);
}

// heads (n, Dh) rotated in place: x·cos + rotate_half(x)·sin, rotate_half(x1, x2) = (−x2, x1)
inline void rope(float* x, int64_t n, int64_t dh, const float* cos, const float* sin) {
  const int64_t half = dh / 2;
  for (int64_t h = 0; h < n; ++h) {
    float* v = x + h * dh;
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = v[i], x2 = v[i + half];
      v[i] = x1 * cos[i] + -x2 * sin[i];
      v[i + half] = x2 * cos[i + half] + x1 * sin[i + half];
    }
  }
}

// e^x in 16 lanes, bit for bit Sleef's expf16_u10 (max error 1 ulp), the exp of PyTorch's vectorized
// CPU kernels (F.silu's; torch.exp itself runs MKL's where torch is built with MKL), written out inline: called in libtorch (through the PLT) it cost a
// call per vector and clobbered every vector register of the loops around it. Sleef's xexpf:
// q = round(x / ln 2), s = x − q ln 2 in two FMA steps (Cody–Waite), e^s by a degree-7 polynomial
// 1 + s + s² P(s), times 2^q; 0 below −104, ∞ above 100, NaN stays NaN. The constants and the
// operations' order are Sleef 3's (sleefsimdsp.c xexpf, as libtorch_cpu's Sleef_expf16_u10avx512f
// runs it); two steps differ in form, not in result: q is rounded as a float (roundscale, ties to
// even as cvtps2dq) and 2^q applied by one scalef (Sleef's two exact power-of-2 factors round once
// too). tests/nn/test_exp16.py holds it equal to torch.exp and F.silu bit for bit.
// The formula is attnlab_lanes::vexp (lanes.h), written once for either vector width: here on 16
// lanes, or, in the AVX2 build (simd_compat.h), on each 8-lane half with vector compares and blends in
// place of AVX512's mask registers (SIMDe's emulated masks cost more than the exp itself), so the bits
// are the AVX512 build's.
__attribute__((always_inline)) inline __m512 exp16(__m512 x) {
#if defined(__AVX512F__)
  return attnlab_lanes::vexp(x);
#else
  return attnlab_simd::join(attnlab_lanes::vexp(attnlab_simd::lo(x)), attnlab_lanes::vexp(attnlab_simd::hi(x)));
#endif
}

// Asks for the cache line at p (into L1): for walks the hardware prefetcher does not follow (the
// Mamba kernels' rows at a stride of Di floats).
inline void prefetch(const float* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }

// Memory further on, asked for a few lines per iteration of the loop that runs before it is read
// instead of all at once (speed only): a burst of prefetches stalls the core once the misses in flight
// fill its queues, where the same lines spread over the loop's iterations do not (decode_matvec.h
// Tuning::prefetch_spread: the next weight tile over a 16-row tile's blocks; decode_attention.h: the
// next kv head's cache rows over the keys). Up to three ranges, each spread evenly over `steps`
// iterations, into L2 (l2) or L1.
struct Ahead {
  const char* p[3] = {nullptr, nullptr, nullptr};
  int64_t bytes[3] = {0, 0, 0}, per_step[3] = {0, 0, 0};  // per_step: bytes asked for per iteration, whole lines
  bool l2 = true;

  Ahead() = default;
  Ahead(std::initializer_list<std::pair<const void*, int64_t>> ranges, int64_t steps, bool to_l2) : l2(to_l2) {
    steps = std::max<int64_t>(steps, 1);
    int i = 0;
    for (const auto& [at, n] : ranges) {
      if (at == nullptr || n <= 0) continue;
      p[i] = (const char*)at, bytes[i] = n, per_step[i] = (n / 64 + steps) / steps * 64;
      ++i;
    }
  }
  bool empty() const { return p[0] == nullptr; }
  void step(int64_t s) const {
    for (int i = 0; i < 3 && p[i] != nullptr; ++i)
      for (int64_t at = s * per_step[i], end = std::min(bytes[i], at + per_step[i]); at < end; at += 64) {
        if (l2) _mm_prefetch(p[i] + at, _MM_HINT_T1);
        else _mm_prefetch(p[i] + at, _MM_HINT_T0);
      }
  }
};

inline __mmask16 lanes_from(int64_t i, int64_t n) { return n - i >= 16 ? (__mmask16)0xFFFF : tail_mask(n - i); }

// y (n) = SiLU(g) · u with F.silu's operations: g / (1 + exp(−g)), then times u (bit for bit PyTorch's),
// on the build's native vectors (lanes.h: 16 lanes with AVX512, 8 with AVX2; the same bits either way)
inline void swiglu(const float* g, const float* u, int64_t n, float* y) {
  using namespace attnlab_lanes;
  for (int64_t i = 0; i < n; i += kLanes) {
    const Mask m = lanes(i, n);
    const Vec gv = load(g + i, m);
    const Vec silu = div(gv, add(ones(), vexp(neg(gv))));
    store(y + i, m, mul(silu, load(u + i, m)));
  }
}

}  // namespace attnlab_decode

// Mamba's selective scan (nn/ssm.py), forward and backward, in registers: for each sequence b and
// each block of 16 channels d, the N states of the 16 channels are 16-lane vectors h[n] that stay in
// registers over the whole sequence, so the (B, T, Di, N) tensors of the scan are never written.
//
// Shapes (fp32, contiguous): x, dt (B, T, Di); At (N, Di) = Aᵀ; Bm, Cm (B, T, N); h0 (B, N, Di).
// Forward, for t = 0 .. T − 1 (nn/ssm.py, Gu & Dao 2023 Algorithm 2 and eq. (4)):
//   a = exp(Δ_t A)      h = a · h + (Δ_t x_t) · B_t      y_t = Σ_n C_t,n h_n
// with the same roundings as the PyTorch loop (no FMA: -ffp-contract=off, Sleef's exp as torch.exp);
// y's sum over n runs in another order (agreement to fp32 summation order).
// Backward (the adjoint recurrence of nn/ssm.py's _SelectiveScan, run from T − 1 down to 0): the
// states are recomputed from h0 per sequence and channel block, in segments of kSegment steps whose
// first states are kept (memory O(T/kSegment + kSegment) per block, any T), then for each t
//   g_h += C_t g_y,t;  g(ΔA) = g_h h_{t−1} a_t;  ∂A += Δ_t g(ΔA);  ∂Δ_t = Σ_n A g(ΔA) + x_t Σ_n B_t g_h;
//   ∂x_t = Δ_t Σ_n B_t g_h;  ∂B_t = Σ_d g_h Δ_t x_t;  ∂C_t = Σ_d h_t g_y,t;  g_h *= a_t;  ∂h0 = g_h.
// ∂A, ∂B and ∂C sum over blocks or sequences: each (b, block) writes its own partial sums, which the
// caller adds (nn/ssm.py). Threads: at::parallel_for over the (b, block) pairs.
// Source: Gu & Dao 2023, "Mamba", Algorithm 2, eq. (4), and §3.3.2 (the hardware-aware scan: states
// kept in fast memory, recomputed in the backward pass); state-spaces/mamba selective_scan_ref.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <cstdint>
#include <vector>

#include "decode_ops.h"  // exp16 (Sleef's exp, torch.exp's), tail_mask

namespace {

using attnlab_decode::exp16;
using attnlab_decode::tail_mask;

constexpr int64_t kLanes = 16;
constexpr int64_t kSegment = 128;  // steps per recomputed segment of the backward pass

struct Scan {
  const float *x, *dt, *At, *B, *C;
  int64_t T, Di, N;
  int64_t blocks() const { return (Di + kLanes - 1) / kLanes; }
};

inline __mmask16 lanes(int64_t d0, int64_t di) { return di - d0 >= kLanes ? (__mmask16)0xFFFF : tail_mask(di - d0); }
inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }

// Runs steps t0 .. t1 − 1 of sequence b, channels d0 .. d0 + 15, from the states h (N vectors). Writes
// y_t when WithY; with Keep, h_{t−1} and a_t of every step into prev and decay (N vectors per step).
template <bool WithY, bool Keep>
inline void steps(const Scan& s, int64_t b, int64_t d0, int64_t t0, int64_t t1, __m512* h, float* y,
                  __m512* prev, __m512* decay) {
  const __mmask16 m = lanes(d0, s.Di);
  const int64_t N = s.N;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t row = (b * s.T + t) * s.Di + d0;
    const __m512 dtv = load(s.dt + row, m);
    const __m512 dx = _mm512_mul_ps(dtv, load(s.x + row, m));
    const float* Bt = s.B + (b * s.T + t) * N;
    const float* Ct = s.C + (b * s.T + t) * N;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t n = 0; n < N; ++n) {
      const __m512 a = exp16(_mm512_mul_ps(dtv, load(s.At + n * s.Di + d0, m)));
      if (Keep) {
        prev[(t - t0) * N + n] = h[n];
        decay[(t - t0) * N + n] = a;
      }
      h[n] = _mm512_add_ps(_mm512_mul_ps(a, h[n]), _mm512_mul_ps(dx, _mm512_set1_ps(Bt[n])));
      if (WithY) acc = _mm512_add_ps(acc, _mm512_mul_ps(h[n], _mm512_set1_ps(Ct[n])));
    }
    if (WithY) _mm512_mask_storeu_ps(y + row, m, acc);
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

void load_state(const float* src, int64_t b, int64_t d0, int64_t N, int64_t Di, __m512* h) {
  const __mmask16 m = lanes(d0, Di);
  for (int64_t n = 0; n < N; ++n) h[n] = src ? load(src + (b * N + n) * Di + d0, m) : _mm512_setzero_ps();
}

void store_state(float* dst, int64_t b, int64_t d0, int64_t N, int64_t Di, const __m512* h) {
  const __mmask16 m = lanes(d0, Di);
  for (int64_t n = 0; n < N; ++n) _mm512_mask_storeu_ps(dst + (b * N + n) * Di + d0, m, h[n]);
}

Scan make(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& At, const at::Tensor& B,
          const at::Tensor& C) {
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be contiguous (B, T, Di) fp32");
  const int64_t b = x.size(0), t = x.size(1), di = x.size(2), n = At.size(0);
  TORCH_CHECK(dt.sizes() == x.sizes() && dt.is_contiguous() && dt.scalar_type() == at::kFloat, "dt must be like x");
  TORCH_CHECK(At.dim() == 2 && At.size(1) == di && At.is_contiguous() && At.scalar_type() == at::kFloat,
              "At must be contiguous (N, Di) fp32");
  for (const at::Tensor* v : {&B, &C})
    TORCH_CHECK(v->dim() == 3 && v->size(0) == b && v->size(1) == t && v->size(2) == n && v->is_contiguous() &&
                v->scalar_type() == at::kFloat, "B and C must be contiguous (B, T, N) fp32");
  return {x.data_ptr<float>(), dt.data_ptr<float>(), At.data_ptr<float>(), B.data_ptr<float>(), C.data_ptr<float>(),
          t, di, n};
}

const float* state_ptr(const c10::optional<at::Tensor>& h, int64_t b, int64_t n, int64_t di) {
  if (!h.has_value()) return nullptr;
  TORCH_CHECK(h->dim() == 3 && h->size(0) == b && h->size(1) == n && h->size(2) == di && h->is_contiguous() &&
              h->scalar_type() == at::kFloat, "a state must be contiguous (B, N, Di) fp32");
  return h->data_ptr<float>();
}

// -> (y (B, T, Di), h_T (B, N, Di))
std::tuple<at::Tensor, at::Tensor> scan_forward(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& At,
                                                const at::Tensor& B, const at::Tensor& C,
                                                const c10::optional<at::Tensor>& h0) {
  const Scan s = make(x, dt, At, B, C);
  const int64_t nb = x.size(0);
  const float* h0p = state_ptr(h0, nb, s.N, s.Di);
  at::Tensor y = at::empty_like(x), last = at::empty({nb, s.N, s.Di}, x.options());
  float* yp = y.data_ptr<float>();
  float* lp = last.data_ptr<float>();
  at::parallel_for(0, nb * s.blocks(), 1, [&](int64_t i0, int64_t i1) {
    std::vector<__m512> h(s.N);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / s.blocks(), d0 = (i % s.blocks()) * kLanes;
      load_state(h0p, b, d0, s.N, s.Di, h.data());
      steps<true, false>(s, b, d0, 0, s.T, h.data(), yp, nullptr, nullptr);
      store_state(lp, b, d0, s.N, s.Di, h.data());
    }
  });
  return {y, last};
}

// -> (∂x, ∂dt (B, T, Di); ∂At partial sums (B, N, Di); ∂B, ∂C partial sums (blocks, B, T, N);
//     ∂h0 (B, N, Di))
std::vector<at::Tensor> scan_backward(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& At,
                                      const at::Tensor& B, const at::Tensor& C, const c10::optional<at::Tensor>& h0,
                                      const at::Tensor& g_y, const c10::optional<at::Tensor>& g_last) {
  const Scan s = make(x, dt, At, B, C);
  const int64_t nb = x.size(0), T = s.T, N = s.N, Di = s.Di, nblk = s.blocks();
  TORCH_CHECK(g_y.sizes() == x.sizes() && g_y.is_contiguous() && g_y.scalar_type() == at::kFloat, "g_y must be like x");
  const float *h0p = state_ptr(h0, nb, N, Di), *glp = state_ptr(g_last, nb, N, Di), *gyp = g_y.data_ptr<float>();
  at::Tensor gx = at::empty_like(x), gdt = at::empty_like(x), gA = at::empty({nb, N, Di}, x.options());
  at::Tensor gB = at::empty({nblk, nb, T, N}, x.options()), gC = at::empty({nblk, nb, T, N}, x.options());
  at::Tensor gh0 = at::empty({nb, N, Di}, x.options());
  float *gxp = gx.data_ptr<float>(), *gdtp = gdt.data_ptr<float>(), *gAp = gA.data_ptr<float>();
  float *gBp = gB.data_ptr<float>(), *gCp = gC.data_ptr<float>(), *gh0p = gh0.data_ptr<float>();
  const int64_t segments = (T + kSegment - 1) / kSegment;
  at::parallel_for(0, nb * nblk, 1, [&](int64_t i0, int64_t i1) {
    std::vector<__m512> h(N), gh(N), gAacc(N), starts(segments * N), prev(kSegment * N), decay(kSegment * N);
    std::vector<__m512> pB(N), pC(N);  // the lanes of ∂B_t and ∂C_t before their sums over channels
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / nblk, blk = i % nblk, d0 = blk * kLanes;
      const __mmask16 m = lanes(d0, Di);
      load_state(h0p, b, d0, N, Di, h.data());
      for (int64_t k = 0; k < segments; ++k) {  // the first state of every segment
        std::copy(h.begin(), h.end(), starts.begin() + k * N);
        if (k + 1 < segments)
          steps<false, false>(s, b, d0, k * kSegment, (k + 1) * kSegment, h.data(), nullptr, nullptr, nullptr);
      }
      load_state(glp, b, d0, N, Di, gh.data());
      std::fill(gAacc.begin(), gAacc.end(), _mm512_setzero_ps());
      for (int64_t k = segments - 1; k >= 0; --k) {
        const int64_t t0 = k * kSegment, t1 = std::min(T, t0 + kSegment);
        std::copy(starts.begin() + k * N, starts.begin() + (k + 1) * N, h.begin());
        steps<false, true>(s, b, d0, t0, t1, h.data(), nullptr, prev.data(), decay.data());  // h ends as h_{t1−1}
        for (int64_t t = t1 - 1; t >= t0; --t) {
          const int64_t row = (b * T + t) * Di + d0, j = (t - t0) * N;
          const __m512 dtv = load(s.dt + row, m), xv = load(s.x + row, m), gy = load(gyp + row, m);
          const __m512 dx = _mm512_mul_ps(dtv, xv);
          const float *Bt = s.B + (b * T + t) * N, *Ct = s.C + (b * T + t) * N;
          const int64_t out = ((blk * nb + b) * T + t) * N;
          __m512 g_dx = _mm512_setzero_ps(), g_dtA = _mm512_setzero_ps();
          for (int64_t n = 0; n < N; ++n) {
            // h_t = h (t = t1 − 1) or the state after step t, which is prev[t + 1]
            const __m512 ht = t == t1 - 1 ? h[n] : prev[j + N + n];
            pC[n] = _mm512_mul_ps(ht, gy);
            gh[n] = _mm512_add_ps(gh[n], _mm512_mul_ps(_mm512_set1_ps(Ct[n]), gy));
            const __m512 a = decay[j + n];
            const __m512 g_log = _mm512_mul_ps(_mm512_mul_ps(gh[n], prev[j + n]), a);
            gAacc[n] = _mm512_add_ps(gAacc[n], _mm512_mul_ps(g_log, dtv));
            g_dtA = _mm512_add_ps(g_dtA, _mm512_mul_ps(g_log, load(s.At + n * Di + d0, m)));
            g_dx = _mm512_add_ps(g_dx, _mm512_mul_ps(gh[n], _mm512_set1_ps(Bt[n])));
            pB[n] = _mm512_mul_ps(gh[n], dx);  // 0 in the lanes past Di: dx is
            gh[n] = _mm512_mul_ps(gh[n], a);
          }
          hsums(pB.data(), N, gBp + out);
          hsums(pC.data(), N, gCp + out);
          _mm512_mask_storeu_ps(gxp + row, m, _mm512_mul_ps(g_dx, dtv));
          _mm512_mask_storeu_ps(gdtp + row, m, _mm512_add_ps(g_dtA, _mm512_mul_ps(g_dx, xv)));
        }
      }
      store_state(gAp, b, d0, N, Di, gAacc.data());
      store_state(gh0p, b, d0, N, Di, gh.data());
    }
  });
  return {gx, gdt, gA, gB, gC, gh0};
}

}  // namespace

TORCH_LIBRARY(attnlab_ssm, lib) {
  lib.def("scan_forward(Tensor x, Tensor dt, Tensor At, Tensor B, Tensor C, Tensor? h0) -> (Tensor, Tensor)");
  lib.def("scan_backward(Tensor x, Tensor dt, Tensor At, Tensor B, Tensor C, Tensor? h0, Tensor g_y, "
          "Tensor? g_last) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(attnlab_ssm, CPU, lib) {
  lib.impl("scan_forward", &scan_forward);
  lib.impl("scan_backward", &scan_backward);
}

// Mamba's selective scan (nn/ssm.py), forward and backward, in registers: for each sequence b and
// each block of 16 channels d, the N states of the 16 channels are 16-lane vectors h[n] that stay in
// registers over the whole sequence, so the (B, T, Di, N) tensors of the scan are never written.
//
// Shapes (fp32, contiguous): x, dt, z (B, T, Di); At (N, Di) = Aᵀ; B, C (B, T, N); h0 (B, N, Di);
// D, dt_bias (Di,); z, D and dt_bias optional. Forward, for t = 0 .. T − 1 (nn/ssm.py; Gu & Dao 2023
// Algorithm 2 and eq. (4); the reference implementation's selective_scan_fn for the fused maps):
//   Δ = softplus(dt + dt_bias) (or dt)   a = exp(Δ_t A)   h = a · h + (Δ_t x_t) · B_t
//   y_t = (Σ_n C_t,n h_n + D x_t) · SiLU(z_t)
// with the same roundings as the PyTorch ops (ssm_scan.h); y's sum over n runs in another order
// (agreement to fp32 summation order).
// Backward (the adjoint recurrence of nn/ssm.py's _SelectiveScan, run from T − 1 down to 0): the
// states are recomputed from h0 per sequence and channel block, in segments of kSegment steps whose
// first states are kept (memory O(T/kSegment + kSegment) per block, any T), then for each t
//   g_h += C_t g_y,t;  g(ΔA) = g_h h_{t−1} a_t;  ∂A += Δ_t g(ΔA);  ∂Δ_t = Σ_n A g(ΔA) + x_t Σ_n B_t g_h;
//   ∂x_t = Δ_t Σ_n B_t g_h;  ∂B_t = Σ_d g_h Δ_t x_t;  ∂C_t = Σ_d h_t g_y,t;  g_h *= a_t;  ∂h0 = g_h.
// and through the maps: g_y ← g_out · SiLU(z), ∂z = g_out · y · SiLU'(z), ∂D = Σ g_y x, ∂x += D g_y,
// ∂dt = ∂Δ · sigmoid(dt + dt_bias) (softplus'), ∂dt_bias = Σ ∂dt.
// ∂A, ∂B, ∂C, ∂D and ∂dt_bias sum over blocks or sequences: each (b, block) writes its own partial
// sums, which the caller adds (nn/ssm.py). Threads: at::parallel_for over the (b, block) pairs.
// Source: Gu & Dao 2023, "Mamba", Algorithm 2, eq. (4), and §3.3.2 (the hardware-aware scan: states
// kept in fast memory, recomputed in the backward pass); state-spaces/mamba selective_scan_ref.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ssm_scan.h"

namespace {

using namespace attnlab_ssm;

constexpr int64_t kSegment = 128;  // steps per recomputed segment of the backward pass

using Opt = c10::optional<at::Tensor>;

const float* opt_ptr(const Opt& v, at::IntArrayRef shape, const char* what) {
  if (!v.has_value()) return nullptr;
  TORCH_CHECK(v->sizes() == shape && v->is_contiguous() && v->scalar_type() == at::kFloat, what,
              " must be contiguous fp32 of shape ", shape);
  return v->data_ptr<float>();
}

Scan make(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& At, const at::Tensor& B, const at::Tensor& C,
          const Opt& D, const Opt& z, const Opt& dt_bias, bool softplus) {
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
          opt_ptr(D, {di}, "D"), opt_ptr(z, x.sizes(), "z"), opt_ptr(dt_bias, {di}, "dt_bias"), softplus, t, di, n};
}

// -> (y (B, T, Di), h_T (B, N, Di))
std::tuple<at::Tensor, at::Tensor> scan_forward(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& At,
                                                const at::Tensor& B, const at::Tensor& C, const Opt& h0,
                                                const Opt& D, const Opt& z, const Opt& dt_bias, bool softplus) {
  const Scan s = make(x, dt, At, B, C, D, z, dt_bias, softplus);
  const int64_t nb = x.size(0);
  const float* h0p = opt_ptr(h0, {nb, s.N, s.Di}, "h0");
  at::Tensor y = at::empty_like(x), last = at::empty({nb, s.N, s.Di}, x.options());
  float* yp = y.data_ptr<float>();
  float* lp = last.data_ptr<float>();
  at::parallel_for(0, nb * s.blocks(), 1, [&](int64_t i0, int64_t i1) {
    std::vector<__m512> h(s.N);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / s.blocks(), d0 = (i % s.blocks()) * kLanes;
      load_state(h0p, b, d0, s.N, s.Di, h.data());
      steps<true, false>(s, b, d0, 0, s.T, h.data(), yp, nullptr, nullptr, nullptr);
      store_state(lp, b, d0, s.N, s.Di, h.data());
    }
  });
  return {y, last};
}

// -> [∂x, ∂dt (B, T, Di); ∂At partial sums (B, N, Di); ∂B, ∂C partial sums (blocks, B, T, N);
//     ∂h0 (B, N, Di); ∂D partial sums (B, Di); ∂z (B, T, Di); ∂dt_bias partial sums (B, Di)]
// (the last three empty when D, z or dt_bias is absent)
std::vector<at::Tensor> scan_backward(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& At,
                                      const at::Tensor& B, const at::Tensor& C, const Opt& h0, const Opt& D,
                                      const Opt& z, const Opt& dt_bias, bool softplus, const at::Tensor& g_y,
                                      const Opt& g_last) {
  const Scan s = make(x, dt, At, B, C, D, z, dt_bias, softplus);
  const int64_t nb = x.size(0), T = s.T, N = s.N, Di = s.Di, nblk = s.blocks();
  TORCH_CHECK(g_y.sizes() == x.sizes() && g_y.is_contiguous() && g_y.scalar_type() == at::kFloat, "g_y must be like x");
  const float *h0p = opt_ptr(h0, {nb, N, Di}, "h0"), *glp = opt_ptr(g_last, {nb, N, Di}, "g_last");
  const float* gyp = g_y.data_ptr<float>();
  const auto f = x.options();
  at::Tensor gx = at::empty_like(x), gdt = at::empty_like(x), gA = at::empty({nb, N, Di}, f);
  at::Tensor gB = at::empty({nblk, nb, T, N}, f), gC = at::empty({nblk, nb, T, N}, f), gh0 = at::empty({nb, N, Di}, f);
  at::Tensor gD = s.D ? at::empty({nb, Di}, f) : at::empty({0}, f), gz = s.z ? at::empty_like(x) : at::empty({0}, f);
  at::Tensor gbias = s.dt_bias ? at::empty({nb, Di}, f) : at::empty({0}, f);
  float *gxp = gx.data_ptr<float>(), *gdtp = gdt.data_ptr<float>(), *gAp = gA.data_ptr<float>();
  float *gBp = gB.data_ptr<float>(), *gCp = gC.data_ptr<float>(), *gh0p = gh0.data_ptr<float>();
  float *gDp = gD.data_ptr<float>(), *gzp = gz.data_ptr<float>(), *gbp = gbias.data_ptr<float>();
  const int64_t segments = (T + kSegment - 1) / kSegment;
  at::parallel_for(0, nb * nblk, 1, [&](int64_t i0, int64_t i1) {
    std::vector<__m512> h(N), gh(N), gAacc(N), starts(segments * N), prev(kSegment * N), decay(kSegment * N);
    std::vector<__m512> pB(N), pC(N), ys(kSegment);  // ∂B_t, ∂C_t lanes before their sums; Σ_n C h per step
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / nblk, blk = i % nblk, d0 = blk * kLanes;
      const __mmask16 m = lanes(d0, Di);
      load_state(h0p, b, d0, N, Di, h.data());
      for (int64_t k = 0; k < segments; ++k) {  // the first state of every segment
        std::copy(h.begin(), h.end(), starts.begin() + k * N);
        if (k + 1 < segments)
          steps<false, false>(s, b, d0, k * kSegment, (k + 1) * kSegment, h.data(), nullptr, nullptr, nullptr, nullptr);
      }
      load_state(glp, b, d0, N, Di, gh.data());
      std::fill(gAacc.begin(), gAacc.end(), _mm512_setzero_ps());
      __m512 gDacc = _mm512_setzero_ps(), gbacc = _mm512_setzero_ps();
      for (int64_t k = segments - 1; k >= 0; --k) {
        const int64_t t0 = k * kSegment, t1 = std::min(T, t0 + kSegment);
        std::copy(starts.begin() + k * N, starts.begin() + (k + 1) * N, h.begin());
        if (s.z)  // h ends as h_{t1−1}; ys keeps Σ_n C h for the gate's derivative
          steps<true, true>(s, b, d0, t0, t1, h.data(), nullptr, ys.data(), prev.data(), decay.data());
        else
          steps<false, true>(s, b, d0, t0, t1, h.data(), nullptr, nullptr, prev.data(), decay.data());
        for (int64_t t = t1 - 1; t >= t0; --t) {
          const int64_t r = s.row(b, t, d0), j = (t - t0) * N;
          const __m512 raw = s.raw_delta(r, d0, m), dtv = s.delta(raw), xv = load(s.x + r, m);
          const __m512 dx = _mm512_mul_ps(dtv, xv), Dv = s.D ? load(s.D + d0, m) : _mm512_setzero_ps();
          __m512 gy = load(gyp + r, m);
          if (s.z) {  // y = (Σ C h + D x) · SiLU(z): torch's silu_backward, σ · (1 + z (1 − σ))
            const __m512 zv = load(s.z + r, m), den = _mm512_add_ps(ones(), exp16(neg(zv)));
            const __m512 sg = _mm512_div_ps(ones(), den), pre = _mm512_add_ps(ys[t - t0], _mm512_mul_ps(Dv, xv));
            const __m512 dsilu = _mm512_mul_ps(sg, _mm512_add_ps(ones(), _mm512_mul_ps(zv, _mm512_sub_ps(ones(), sg))));
            _mm512_mask_storeu_ps(gzp + r, m, _mm512_mul_ps(_mm512_mul_ps(gy, pre), dsilu));
            gy = _mm512_mul_ps(gy, _mm512_div_ps(zv, den));
          }
          if (s.D) gDacc = _mm512_add_ps(gDacc, _mm512_mul_ps(gy, xv));
          const int64_t out = ((blk * nb + b) * T + t) * N;
          const float *Bt = s.B + (b * T + t) * N, *Ct = s.C + (b * T + t) * N;
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
          const __m512 gxv = _mm512_mul_ps(g_dx, dtv);
          _mm512_mask_storeu_ps(gxp + r, m, s.D ? _mm512_add_ps(gxv, _mm512_mul_ps(Dv, gy)) : gxv);
          __m512 gd = _mm512_add_ps(g_dtA, _mm512_mul_ps(g_dx, xv));  // ∂Δ
          if (s.softplus) {  // torch's softplus_backward: v > 20 ? g : g · e^v / (e^v + 1)
            const __m512 e = exp16(raw);
            const __mmask16 big = _mm512_cmp_ps_mask(raw, _mm512_set1_ps(20.0f), _CMP_GT_OQ);
            gd = _mm512_mask_blend_ps(big, _mm512_div_ps(_mm512_mul_ps(gd, e), _mm512_add_ps(e, ones())), gd);
          }
          if (s.dt_bias) gbacc = _mm512_add_ps(gbacc, gd);
          _mm512_mask_storeu_ps(gdtp + r, m, gd);
        }
      }
      store_state(gAp, b, d0, N, Di, gAacc.data());
      store_state(gh0p, b, d0, N, Di, gh.data());
      if (s.D) _mm512_mask_storeu_ps(gDp + b * Di + d0, m, gDacc);
      if (s.dt_bias) _mm512_mask_storeu_ps(gbp + b * Di + d0, m, gbacc);
    }
  });
  return {gx, gdt, gA, gB, gC, gh0, gD, gz, gbias};
}

}  // namespace

TORCH_LIBRARY(attnlab_ssm, lib) {
  lib.def("scan_forward(Tensor x, Tensor dt, Tensor At, Tensor B, Tensor C, Tensor? h0, Tensor? D, Tensor? z, "
          "Tensor? dt_bias, bool softplus) -> (Tensor, Tensor)");
  lib.def("scan_backward(Tensor x, Tensor dt, Tensor At, Tensor B, Tensor C, Tensor? h0, Tensor? D, Tensor? z, "
          "Tensor? dt_bias, bool softplus, Tensor g_y, Tensor? g_last) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(attnlab_ssm, CPU, lib) {
  lib.impl("scan_forward", &scan_forward);
  lib.impl("scan_backward", &scan_backward);
}

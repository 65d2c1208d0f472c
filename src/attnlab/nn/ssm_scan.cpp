// Mamba's selective scan (nn/ssm.py), forward and backward, in registers: for each sequence b and
// each block of kLanes channels d (16 with AVX512, 8 with AVX2: lanes.h), the N states of the
// block's channels are vectors h[n] that stay in registers over the whole sequence, so the
// (B, T, Di, N) tensors of the scan are never written.
//
// Shapes (fp32, contiguous): x, dt, z (B, T, Di); At (N, Di) = Aᵀ; B, C (B, T, N); h0 (B, N, Di);
// D, dt_bias (Di,); z, D and dt_bias optional. Forward, for t = 0 .. T − 1 (nn/ssm.py; Gu & Dao 2023
// Algorithm 2 and eq. (4); the reference implementation's selective_scan_fn for the fused maps):
//   Δ = softplus(dt + dt_bias) (or dt)   a = exp(Δ_t A)   h = a · h + (Δ_t x_t) · B_t
//   y_t = (Σ_n C_t,n h_n + D x_t) · SiLU(z_t)
// with the maps (softplus, SiLU, D) rounded as the PyTorch ops, the recurrence with FMAs and the decay
// through vexp2 (ssm_scan.h), and y's sum over n in another order: agreement to fp32 rounding.
// Backward (the adjoint recurrence of nn/ssm.py's _SelectiveScan, run from T − 1 down to 0): the
// states are recomputed from h0 per sequence and channel block, in segments of kSegment steps whose
// first states are kept (memory O(T/kSegment + kSegment) per block, any T), then for each t
//   g_h += C_t g_y,t;  g(ΔA) = g_h h_{t−1} a_t;  ∂A += Δ_t g(ΔA);  ∂Δ_t = Σ_n A g(ΔA) + x_t Σ_n B_t g_h;
//   ∂x_t = Δ_t Σ_n B_t g_h;  ∂B_t = Σ_d g_h Δ_t x_t;  ∂C_t = Σ_d h_t g_y,t;  g_h *= a_t;  ∂h0 = g_h.
// and through the maps: g_y ← g_out · SiLU(z), ∂z = g_out · y · SiLU'(z), ∂D = Σ g_y x, ∂x += D g_y,
// ∂dt = ∂Δ · sigmoid(dt + dt_bias) (softplus'), ∂dt_bias = Σ ∂dt.
// ∂A, ∂D and ∂dt_bias sum over sequences: each sequence writes its own partial sums, which the caller
// adds (nn/ssm.py). ∂B_t and ∂C_t sum over the Di channels: the blocks of kLanes channels are taken in
// `groups` groups per sequence (the caller's choice); within a group each step's kLanes-lane products
// are added up over the group's blocks in a per-thread buffer (T · N vectors each) and summed over
// their lanes once, at the group's end (summing the lanes at every step of every block took most of
// the adjoint steps' time); each (group, b) writes its partial sums, which the caller adds.
// Threads: at::parallel_for over the (b, group) pairs.
// Source: Gu & Dao 2023, "Mamba", Algorithm 2, eq. (4), and §3.3.2 (the hardware-aware scan: states
// kept in fast memory, recomputed in the backward pass); state-spaces/mamba selective_scan_ref.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include "simd_compat.h"
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ssm_scan.h"

namespace {

using namespace attnlab_ssm;

constexpr int64_t kSegment = 128;  // steps per recomputed segment of the backward pass
constexpr int64_t kFixedN = 16;    // the state count compiled as a constant (ssm_scan.h states)

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

// One (sequence, channel block) of the forward pass: y of its steps and its final state.
template <int64_t kN>
void forward_block(const Scan& s, int64_t b, int64_t d0, const float* h0, float* y, float* last) {
  Vectors<kN> hs(states<kN>(s));
  Vec* h = hs.data();
  load_state(h0, b, d0, states<kN>(s), s.Di, h);
  steps<kN, true>(s, b, d0, 0, s.T, h, y, Kept{}, [&](int64_t t) {
    s.prefetch_step(b, t, d0);
    prefetch(y + s.row(b, t, d0));
  });
  store_state(last, b, d0, states<kN>(s), s.Di, h);
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
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / s.blocks(), d0 = (i % s.blocks()) * kLanes;
      if (s.N == kFixedN)
        forward_block<kFixedN>(s, b, d0, h0p, yp, lp);
      else
        forward_block<0>(s, b, d0, h0p, yp, lp);
    }
  });
  return {y, last};
}

// The backward pass's inputs beside the scan's (nullptr when absent) and its outputs (B, T, Di) or
// partial sums per sequence or per (group, sequence), as scan_backward returns them.
struct Grads {
  const float *h0, *g_last, *g_y;
  float *gx, *gdt, *gA, *gB, *gC, *gh0, *gD, *gz, *gbias;
  int64_t nb;
};

// Per thread: the first state of each segment, what the recomputation keeps of each of its steps, and
// the ∂B_t, ∂C_t lanes of every step summed over a group's blocks. One per thread, kept between calls
// (thread_local in scan_backward): ~0.4 MB per thread for a Mamba layer of the recipes, which a call
// would otherwise allocate and zero-fill anew.
struct Scratch {
  std::vector<Vec> starts, prev, decay, ys, deltas, sumB, sumC;
  // at least large enough for a run of `segments` segments, N states and T steps (it only grows)
  void reserve(int64_t segments, int64_t N, int64_t T) {
    for (auto [v, n] : {std::pair{&starts, segments * N}, {&prev, kSegment * N}, {&decay, kSegment * N},
                        {&ys, kSegment}, {&deltas, kSegment}, {&sumB, T * N}, {&sumC, T * N}})
      if (static_cast<int64_t>(v->size()) < n) v->resize(n);
  }
};

// One step t of the adjoint recurrence (file comment) for channels d0 .. d0 + 15 of sequence b, block
// blk: updates the state adjoints gh and ∂A's sums gAacc, writes ∂x_t, ∂dt_t (∂z_t), and stores
// (first block of its group) or adds its ∂B_t and ∂C_t lanes into the scratch's sumB, sumC.
// ht(n) is h_t; j indexes step t in the scratch's segment buffers.
template <int64_t kN, typename State>
inline void adjoint_step(const Scan& s, const Grads& g, int64_t b, int64_t blk, int64_t t,
                         int64_t j, State ht, Vec* gh, Vec* gAacc, Vec& gDacc, Vec& gbacc,
                         Scratch& w, bool first) {
  const int64_t N = states<kN>(s), d0 = blk * kLanes, r = s.row(b, t, d0);
  const Mask m = lanes(d0, s.Di);
  const Vec dtv = w.deltas[j], xv = load(s.x + r, m), dx = mul(dtv, xv);
  const Vec Dv = s.D ? load(s.D + d0, m) : zero();
  Vec gy = load(g.g_y + r, m);
  if (s.z) {  // y = (Σ C h + D x) · SiLU(z): torch's silu_backward, σ · (1 + z (1 − σ))
    const Vec zv = load(s.z + r, m), den = add(ones(), vexp(neg(zv)));
    const Vec sg = div(ones(), den), pre = add(w.ys[j], mul(Dv, xv));
    const Vec dsilu = mul(sg, add(ones(), mul(zv, sub(ones(), sg))));
    store(g.gz + r, m, mul(mul(gy, pre), dsilu));
    gy = mul(gy, div(zv, den));
  }
  if (s.D) gDacc = add(gDacc, mul(gy, xv));
  const float *Bt = s.B + (b * s.T + t) * N, *Ct = s.C + (b * s.T + t) * N;
  Vec g_dx = zero(), g_dtA = zero();
  const Vec* prev = w.prev.data() + j * N;
  const Vec* decay = w.decay.data() + j * N;
  Vec* pb = w.sumB.data() + t * N;  // ∂B_t, ∂C_t lanes, summed over the group's blocks
  Vec* pc = w.sumC.data() + t * N;
  for (int64_t n = 0; n < N; ++n) {
    pc[n] = first ? mul(ht(n), gy) : fmadd(ht(n), gy, pc[n]);
    gh[n] = fmadd(set1(Ct[n]), gy, gh[n]);
    const Vec a = decay[n];
    const Vec g_log = mul(mul(gh[n], prev[n]), a);
    gAacc[n] = fmadd(g_log, dtv, gAacc[n]);
    g_dtA = fmadd(g_log, load(s.At + n * s.Di + d0, m), g_dtA);
    g_dx = fmadd(gh[n], set1(Bt[n]), g_dx);
    pb[n] = first ? mul(gh[n], dx) : fmadd(gh[n], dx, pb[n]);  // 0 in the lanes past Di: dx is
    gh[n] = mul(gh[n], a);
  }
  const Vec gxv = mul(g_dx, dtv);
  store(g.gx + r, m, s.D ? add(gxv, mul(Dv, gy)) : gxv);
  Vec gd = add(g_dtA, mul(g_dx, xv));  // ∂Δ
  if (s.softplus) {  // torch's softplus_backward: v > 20 ? g : g · e^v / (e^v + 1)
    const Vec raw = s.raw_delta(r, d0, m), e = vexp(raw);
    gd = where_gt(raw, 20.0f, div(mul(gd, e), add(e, ones())), gd);
  }
  if (s.dt_bias) gbacc = add(gbacc, gd);
  store(g.gdt + r, m, gd);
}

// One (sequence, channel block) of the backward pass: the segments' first states, then segment by
// segment from the last, the states recomputed (with Δ, a and Σ C h of each step) and the adjoint
// steps run from its last step down.
template <int64_t kN>
void backward_block(const Scan& s, const Grads& g, Scratch& w, int64_t b, int64_t blk, bool first) {
  const int64_t N = states<kN>(s), T = s.T, d0 = blk * kLanes, segments = (T + kSegment - 1) / kSegment;
  const Mask m = lanes(d0, s.Di);
  Vectors<kN> hs(N), ghs(N), gAs(N);  // states, their adjoints, ∂A's sums
  Vec *h = hs.data(), *gh = ghs.data(), *gAacc = gAs.data();
  load_state(g.h0, b, d0, N, s.Di, h);
  for (int64_t k = 0; k < segments; ++k) {  // the first state of every segment
    std::copy(h, h + N, w.starts.begin() + k * N);
    if (k + 1 < segments)
      steps<kN, false>(s, b, d0, k * kSegment, (k + 1) * kSegment, h, nullptr, Kept{},
                       [&](int64_t t) { s.prefetch_step(b, t, d0); });
  }
  load_state(g.g_last, b, d0, N, s.Di, gh);
  for (int64_t n = 0; n < N; ++n) gAacc[n] = zero();
  Vec gDacc = zero(), gbacc = zero();
  for (int64_t k = segments - 1; k >= 0; --k) {
    const int64_t t0 = k * kSegment, t1 = std::min(T, t0 + kSegment);
    std::copy(w.starts.begin() + k * N, w.starts.begin() + (k + 1) * N, h);
    const Kept keep{s.z ? w.ys.data() : nullptr, w.prev.data(), w.decay.data(), w.deltas.data()};
    const auto ahead = [&](int64_t t) {  // also the lines the adjoint steps read and write
      const int64_t r = s.row(b, t, d0);
      s.prefetch_step(b, t, d0);
      prefetch(g.g_y + r);
      prefetch(g.gx + r);
      prefetch(g.gdt + r);
      if (s.z) prefetch(g.gz + r);
    };
    if (s.z)  // h ends as h_{t1−1}; ys keeps Σ_n C h for the gate's derivative
      steps<kN, true>(s, b, d0, t0, t1, h, nullptr, keep, ahead);
    else
      steps<kN, false>(s, b, d0, t0, t1, h, nullptr, keep, ahead);
    // h_t is h at the segment's last step, else the state before step t + 1 (prev of step t + 1)
    adjoint_step<kN>(s, g, b, blk, t1 - 1, t1 - 1 - t0, [&](int64_t n) { return h[n]; }, gh, gAacc, gDacc, gbacc,
                     w, first);
    for (int64_t t = t1 - 2; t >= t0; --t) {
      if (t - kAhead >= t0) ahead(t - kAhead);  // the rows of the adjoint steps to come (it runs down)
      const Vec* next = w.prev.data() + (t + 1 - t0) * N;
      adjoint_step<kN>(s, g, b, blk, t, t - t0, [next](int64_t n) { return next[n]; }, gh, gAacc, gDacc,
                       gbacc, w, first);
    }
  }
  store_state(g.gA, b, d0, N, s.Di, gAacc);
  store_state(g.gh0, b, d0, N, s.Di, gh);
  if (s.D) store(g.gD + b * s.Di + d0, m, gDacc);
  if (s.dt_bias) store(g.gbias + b * s.Di + d0, m, gbacc);
}

// groups: how many groups the Di / 16 channel blocks of a sequence are taken in (1 .. blocks).
// -> [∂x, ∂dt (B, T, Di); ∂At partial sums (B, N, Di); ∂B, ∂C partial sums (groups, B, T, N);
//     ∂h0 (B, N, Di); ∂D partial sums (B, Di); ∂z (B, T, Di); ∂dt_bias partial sums (B, Di)]
// (the last three empty when D, z or dt_bias is absent)
std::vector<at::Tensor> scan_backward(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& At,
                                      const at::Tensor& B, const at::Tensor& C, const Opt& h0, const Opt& D,
                                      const Opt& z, const Opt& dt_bias, bool softplus, const at::Tensor& g_y,
                                      const Opt& g_last, int64_t groups) {
  const Scan s = make(x, dt, At, B, C, D, z, dt_bias, softplus);
  const int64_t nb = x.size(0), T = s.T, N = s.N, Di = s.Di, nblk = s.blocks();
  TORCH_CHECK(g_y.sizes() == x.sizes() && g_y.is_contiguous() && g_y.scalar_type() == at::kFloat, "g_y must be like x");
  const auto f = x.options();
  at::Tensor gx = at::empty_like(x), gdt = at::empty_like(x), gA = at::empty({nb, N, Di}, f);
  TORCH_CHECK(groups >= 1 && groups <= nblk, "groups must be in 1 .. ", nblk, " (blocks of ", kLanes, " channels), got ",
              groups);
  at::Tensor gB = at::empty({groups, nb, T, N}, f), gC = at::empty({groups, nb, T, N}, f);
  at::Tensor gh0 = at::empty({nb, N, Di}, f);
  at::Tensor gD = s.D ? at::empty({nb, Di}, f) : at::empty({0}, f), gz = s.z ? at::empty_like(x) : at::empty({0}, f);
  at::Tensor gbias = s.dt_bias ? at::empty({nb, Di}, f) : at::empty({0}, f);
  const Grads g{opt_ptr(h0, {nb, N, Di}, "h0"), opt_ptr(g_last, {nb, N, Di}, "g_last"), g_y.data_ptr<float>(),
                gx.data_ptr<float>(), gdt.data_ptr<float>(), gA.data_ptr<float>(), gB.data_ptr<float>(),
                gC.data_ptr<float>(), gh0.data_ptr<float>(), gD.data_ptr<float>(), gz.data_ptr<float>(),
                gbias.data_ptr<float>(), nb};
  const int64_t segments = (T + kSegment - 1) / kSegment;
  at::parallel_for(0, nb * groups, 1, [&](int64_t i0, int64_t i1) {
    thread_local Scratch w;
    w.reserve(segments, N, T);
    for (int64_t i = i0; i < i1; ++i) {
      // group grp: blocks [grp · nblk / groups, (grp + 1) · nblk / groups), never empty for groups ≤ nblk
      const int64_t b = i / groups, grp = i % groups, blk0 = grp * nblk / groups, blk1 = (grp + 1) * nblk / groups;
      for (int64_t blk = blk0; blk < blk1; ++blk) {
        if (N == kFixedN)
          backward_block<kFixedN>(s, g, w, b, blk, blk == blk0);
        else
          backward_block<0>(s, g, w, b, blk, blk == blk0);
      }
      for (int64_t t = 0; t < T; ++t) {  // the group's ∂B_t, ∂C_t: each step's N vectors summed over their lanes
        const int64_t out = ((grp * nb + b) * T + t) * N;
        hsums(w.sumB.data() + t * N, N, g.gB + out);
        hsums(w.sumC.data() + t * N, N, g.gC + out);
      }
    }
  });
  return {gx, gdt, gA, gB, gC, gh0, gD, gz, gbias};
}

// The channels per block of this build (kLanes: 16 with AVX512, 8 with AVX2), which the caller's
// group count is bounded by.
int64_t lanes_per_block() { return kLanes; }

}  // namespace

TORCH_LIBRARY(attnlab_ssm, lib) {
  lib.def("lanes() -> int", &lanes_per_block);
  lib.def("scan_forward(Tensor x, Tensor dt, Tensor At, Tensor B, Tensor C, Tensor? h0, Tensor? D, Tensor? z, "
          "Tensor? dt_bias, bool softplus) -> (Tensor, Tensor)");
  lib.def("scan_backward(Tensor x, Tensor dt, Tensor At, Tensor B, Tensor C, Tensor? h0, Tensor? D, Tensor? z, "
          "Tensor? dt_bias, bool softplus, Tensor g_y, Tensor? g_last, int groups) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(attnlab_ssm, CPU, lib) {
  lib.impl("scan_forward", &scan_forward);
  lib.impl("scan_backward", &scan_backward);
}

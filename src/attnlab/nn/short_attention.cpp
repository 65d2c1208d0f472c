// Attention of short sequences (T, S ≤ 128) for training, forward and backward, one head of one
// sequence per task (nn/short_attention.py). Everything of a head — its Q, K, V rows, one row of
// scores at a time — sits in L1 and in fp32, whatever the inputs' dtype (fp32 or bf16), so the step
// neither casts q, k, v to fp32 around a fused kernel nor makes the many small batched products,
// softmax and their backward operators of the explicit form.
//
// Shapes: q (B, H, T, Dh), k, v (B, K, S, Dh), K dividing H (query head h reads key/value head
// h / (H / K): grouped-query attention), any strides but a contiguous last dimension; Dh a multiple
// of 16, at most 128; key_len (B,) int64 or none. Query i of sequence b sees the keys
// seen(i) = {j < L_b} (L_b = key_len[b], or S), with `causal` (S = T) also j ≤ i. With
// s_ij = scale · q_i · k_j, ℓ_i = log Σ_{j ∈ seen(i)} e^{s_ij}, p_ij = e^{s_ij − ℓ_i}:
//   forward    o_i = Σ_{j ∈ seen(i)} p_ij v_j          o (B, T, H, Dh) in q's dtype; ℓ (B, H, T) fp32
//   backward   D_i = do_i · o_i,  dp_ij = do_i · v_j,  ds_ij = p_ij (dp_ij − D_i)
//              dq_i = scale Σ_j ds_ij k_j,  dk_j = scale Σ_i ds_ij q_i,  dv_j = Σ_i p_ij do_i
// A query that sees no key gives o_i = 0 (ℓ_i = −∞) and no gradient. The backward pass recomputes p
// from ℓ (FlashAttention's way: no T × S tensor is kept). Rows of scores are computed kLanes keys to a
// vector (16 with AVX512, 8 in the AVX2 build: lanes.h) from Kᵀ (no horizontal sums), only as far as
// a row's last visible key; bf16 is read by widening and written rounded to nearest even (as
// c10::BFloat16). Each score, weight and output element has the same bits in both builds; the
// softmax's denominator and do · o sum their lanes in the width's order. Threads: at::parallel_for over the
// B · H query heads (forward) and the B · K key/value heads (backward: a head's dk, dv sum over its
// H / K queries).
// Source: Vaswani et al. 2017, §3.2.1 (equation 1); Dao et al. 2022, "FlashAttention", §3.1 and
// Algorithm 2 (the backward pass from the saved log-sum-exp).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <cstdint>
#include <algorithm>
#include <cmath>
#include <vector>

#include "lanes.h"

namespace {

namespace L = attnlab_lanes;
using L::Vec;

constexpr int64_t kL = L::kLanes, kMaxT = 128, kMaxD = 128, kMaxV = kMaxT / kL;
// Vectors of a row computed together: two rows' accumulators, a broadcast each and a load stay in the
// registers (32 with AVX512, 16 with AVX2).
constexpr int kBlock = kL == 16 ? 8 : 4;

// A (B, H, T, Dh) tensor's rows, fp32 or bf16, last dimension contiguous.
struct Rows {
  const char* p;
  int64_t sb, sh, st, esize;
  bool bf16;
  const void* row(int64_t b, int64_t h, int64_t t) const { return p + (b * sb + h * sh + t * st) * esize; }
};

Rows rows(const at::Tensor& x) {
  return {static_cast<const char*>(x.data_ptr()), x.stride(0), x.stride(1), x.stride(2),
          static_cast<int64_t>(x.element_size()), x.scalar_type() == at::kBFloat16};
}

inline void load_row(float* dst, const void* src, bool bf16, int64_t n) {
  if (!bf16) {  // a row of Dh ≤ 128 floats: vector moves (a memcpy call per row cost more than the copy)
    const float* s = static_cast<const float*>(src);
    for (int64_t d = 0; d < n; d += kL) L::store_all(dst + d, L::loadu(s + d));
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (int64_t d = 0; d < n; d += kL) L::store_all(dst + d, L::load_bf16(s + d));
}

inline void store_row(void* dst, const float* src, bool bf16, int64_t n) {
  if (!bf16) {
    float* o = static_cast<float*>(dst);
    for (int64_t d = 0; d < n; d += kL) L::store_all(o + d, L::loadu(src + d));
    return;
  }
  uint16_t* o = static_cast<uint16_t*>(dst);
  for (int64_t d = 0; d < n; d += kL) L::store_bf16(o + d, L::loadu(src + d));
}

// Two query rows at a time (rows a and b = a + 1): every vector of K, V, Kᵀ, Vᵀ, dk or dv loaded
// serves both rows, halving the loads per multiply-add (the loops are load-bound with one row).
// An odd T's last block repeats row a as row b with zero weights (its results are not stored).
// Each function below runs NV ≤ kBlock vectors of its output at a time; each element sums its terms
// in the same order whatever the blocking.

// out_r[0, kL·NV) = Σ_d x_r[d] · Mt[d, ·] for the rows x_a, x_b against a transposed (D, Tp) matrix
template <int NV>
inline void row_times2(const float* xa, const float* xb, const float* mt, int64_t D, int64_t Tp, Vec* oa, Vec* ob) {
  Vec a[NV], b[NV];
  for (int v = 0; v < NV; ++v) a[v] = b[v] = L::zero();
  for (int64_t d = 0; d < D; ++d) {
    const Vec xad = L::set1(xa[d]), xbd = L::set1(xb[d]);
    const float* m = mt + d * Tp;
    for (int v = 0; v < NV; ++v) {
      const Vec mv = L::loadu(m + v * kL);
      a[v] = L::fmadd(xad, mv, a[v]);
      b[v] = L::fmadd(xbd, mv, b[v]);
    }
  }
  for (int v = 0; v < NV; ++v) oa[v] = a[v], ob[v] = b[v];
}

// acc_r[0, kL·NV) = Σ_{j<n} w_r[j] · M[j, ·] for the weight rows w_a, w_b (M's rows `stride` floats apart)
template <int NV>
inline void weighted_rows2(const float* wa, const float* wb, const float* m, int64_t n, int64_t stride, float* acc_a,
                           float* acc_b) {
  Vec a[NV], b[NV];
  for (int u = 0; u < NV; ++u) a[u] = b[u] = L::zero();
  for (int64_t j = 0; j < n; ++j) {
    const Vec waj = L::set1(wa[j]), wbj = L::set1(wb[j]);
    for (int u = 0; u < NV; ++u) {
      const Vec mv = L::loadu(m + j * stride + u * kL);
      a[u] = L::fmadd(waj, mv, a[u]);
      b[u] = L::fmadd(wbj, mv, b[u]);
    }
  }
  for (int u = 0; u < NV; ++u) L::store_all(acc_a + u * kL, a[u]), L::store_all(acc_b + u * kL, b[u]);
}

// M[j, ·] += w_a[j] · x_a + w_b[j] · x_b for j < n (M's rows `stride` floats apart); x_a, x_b in registers
template <int NV>
inline void add_outer2(float* m, const float* wa, const float* wb, const float* xa, const float* xb, int64_t n,
                       int64_t stride) {
  Vec ya[NV], yb[NV];
  for (int u = 0; u < NV; ++u) ya[u] = L::loadu(xa + u * kL), yb[u] = L::loadu(xb + u * kL);
  for (int64_t j = 0; j < n; ++j) {
    const Vec waj = L::set1(wa[j]), wbj = L::set1(wb[j]);
    float* r = m + j * stride;
    for (int u = 0; u < NV; ++u)
      L::store_all(r + u * kL, L::fmadd(wbj, yb[u], L::fmadd(waj, ya[u], L::loadu(r + u * kL))));
  }
}

// F<n>(args) for n = 1 .. kBlock
#define ATTNLAB_BY_COUNT(n, F, ...)       \
  switch (n) {                            \
    case 1: F<1>(__VA_ARGS__); break;     \
    case 2: F<2>(__VA_ARGS__); break;     \
    case 3: F<3>(__VA_ARGS__); break;     \
    case 4: F<4>(__VA_ARGS__); break;     \
    case 5: F<5>(__VA_ARGS__); break;     \
    case 6: F<6>(__VA_ARGS__); break;     \
    case 7: F<7>(__VA_ARGS__); break;     \
    default: F<8>(__VA_ARGS__); break;    \
  }

inline int block_at(int v0, int nv) { return std::min(kBlock, nv - v0); }

inline void row_times2(int nv, const float* xa, const float* xb, const float* mt, int64_t D, int64_t Tp, Vec* oa,
                       Vec* ob) {
  for (int v0 = 0; v0 < nv; v0 += kBlock)
    ATTNLAB_BY_COUNT(block_at(v0, nv), row_times2, xa, xb, mt + v0 * kL, D, Tp, oa + v0, ob + v0)
}

inline void weighted_rows2(const float* wa, const float* wb, const float* m, int64_t n, int64_t D, float* acc_a,
                           float* acc_b) {
  const int nv = static_cast<int>(D / kL);
  for (int v0 = 0; v0 < nv; v0 += kBlock)
    ATTNLAB_BY_COUNT(block_at(v0, nv), weighted_rows2, wa, wb, m + v0 * kL, n, D, acc_a + v0 * kL, acc_b + v0 * kL)
}

inline void add_outer2(float* m, const float* wa, const float* wb, const float* xa, const float* xb, int64_t n,
                       int64_t D) {
  const int nv = static_cast<int>(D / kL);
  for (int v0 = 0; v0 < nv; v0 += kBlock)
    ATTNLAB_BY_COUNT(block_at(v0, nv), add_outer2, m + v0 * kL, wa, wb, xa + v0 * kL, xb + v0 * kL, n, D)
}

// One head's matrices in fp32: a row-major copy of T rows and a transposed, zero-padded (D, Tp) copy.
struct Head {
  int64_t T, D, Tp;
  explicit Head(int64_t T_, int64_t D_) : T(T_), D(D_), Tp((T_ + kL - 1) / kL * kL) {}
  void load(float* rowmajor, float* transposed, const Rows& x, int64_t b, int64_t h) const {
    for (int64_t t = 0; t < T; ++t) load_row(rowmajor + t * D, x.row(b, h, t), x.bf16, D);
    if (!transposed) return;
    std::fill(transposed, transposed + D * Tp, 0.0f);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) transposed[d * Tp + t] = rowmajor[t * D + d];
  }
};

// Which keys a query row sees: the first `len` keys of its sequence, and with `causal` none after
// its own position (keys 0 .. min(i + 1, len) − 1).
struct Visible {
  bool causal;
  int64_t keys(int64_t i, int64_t len) const { return causal ? std::min(i + 1, len) : len; }
};

// The lanes of vector u (keys kL·u .. kL·u + kL − 1) among a row's first n keys
inline L::Mask first_keys(int64_t n, int u) { return L::first(n - u * kL); }

inline int vectors_for(int64_t n) { return static_cast<int>(std::max<int64_t>((n + kL - 1) / kL, 1)); }

struct Lengths {  // each sequence's number of real keys (a right-padded batch), or all S
  const int64_t* p;
  int64_t all;
  int64_t of(int64_t b) const { return p ? std::min(std::max<int64_t>(p[b], 0), all) : all; }
};

Lengths lengths(const c10::optional<at::Tensor>& key_len, int64_t B, int64_t S) {
  if (!key_len.has_value()) return {nullptr, S};
  TORCH_CHECK(key_len->scalar_type() == at::kLong && key_len->is_contiguous() && key_len->numel() == B,
              "short attention: key_len must be a contiguous (B,) int64 tensor");
  return {key_len->data_ptr<int64_t>(), S};
}

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  for (const at::Tensor* x : {&q, &k, &v}) {
    TORCH_CHECK(x->device().is_cpu() && x->dim() == 4 && x->scalar_type() == q.scalar_type(),
                "short attention: q, k, v must be CPU (B, heads, T, Dh) tensors of one dtype");
    TORCH_CHECK(x->stride(3) == 1, "short attention: the last dimension must be contiguous");
  }
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(3) == q.size(3) && k.size(1) >= 1 &&
              q.size(1) % k.size(1) == 0, "short attention: k, v (B, K, S, Dh) with K dividing q's H heads");
  TORCH_CHECK(!causal || k.size(2) == q.size(2), "short attention: causal attention needs as many keys as queries");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16, "short attention: fp32 or bf16");
  TORCH_CHECK(q.size(2) >= 1 && q.size(2) <= kMaxT && k.size(2) >= 1 && k.size(2) <= kMaxT,
              "short attention: 1 <= T, S <= ", kMaxT);
  TORCH_CHECK(q.size(3) % 16 == 0 && q.size(3) <= kMaxD, "short attention: Dh a multiple of 16, at most ", kMaxD);
}

std::vector<at::Tensor> short_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                const c10::optional<at::Tensor>& key_len, bool causal, double scale_) {
  check(q, k, v, causal);
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3), G = H / k.size(1);
  const float scale = static_cast<float>(scale_);
  const Lengths len = lengths(key_len, B, Tk);
  const Visible vis{causal};
  at::Tensor o = at::empty({B, Tq, H, D}, q.options());
  at::Tensor lse = at::empty({B, H, Tq}, q.options().dtype(at::kFloat));
  const Rows Q = rows(q), K = rows(k), V = rows(v);
  char* op = static_cast<char*>(o.data_ptr());
  float* lp = lse.data_ptr<float>();
  const int64_t esize = o.element_size();
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    const Head qh(Tq, D), kh(Tk, D);
    const int64_t Tp = kh.Tp;
    std::vector<float> buf(Tq * D + 2 * Tk * D + D * Tp + 2 * Tp + 2 * D);
    float *qs = buf.data(), *ks = qs + Tq * D, *vs = ks + Tk * D, *kt = vs + Tk * D, *p = kt + D * Tp,
          *orow = p + 2 * Tp;
    Vec s[2][kMaxV];
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H, lb = len.of(b);
      qh.load(qs, nullptr, Q, b, h);
      kh.load(ks, kt, K, b, h / G);  // query head h reads key/value head h / G (grouped-query attention)
      kh.load(vs, nullptr, V, b, h / G);
      for (int64_t i = 0; i < Tq; i += 2) {
        const int64_t ib = std::min(i + 1, Tq - 1);  // row b (= row a again at an odd Tq's end)
        const int64_t n = std::max(vis.keys(i, lb), vis.keys(ib, lb));
        const int nv = vectors_for(n);
        row_times2(nv, qs + i * D, qs + ib * D, kt, D, Tp, s[0], s[1]);
        for (int r = 0; r < 2; ++r) {
          const int64_t row = i + r, seen = vis.keys(row, lb);
          float* pr = p + r * Tp;
          if (seen == 0) {  // a query that sees no key: zeros (as nn/attention.py), ℓ = −∞
            std::fill(pr, pr + nv * kL, 0.0f);
            if (row < Tq) lp[bh * Tq + row] = -__builtin_inff();
            continue;
          }
          const Vec minus_inf = L::set1(-__builtin_inff());
          Vec mx = minus_inf;
          for (int u = 0; u < nv; ++u) {
            s[r][u] = L::select(first_keys(seen, u), L::mul(s[r][u], L::set1(scale)), minus_inf);
            mx = L::max(mx, s[r][u]);
          }
          const float m = L::hmax(mx);
          Vec sum = L::zero();
          for (int u = 0; u < nv; ++u) {
            const Vec e = L::vexp(L::sub(s[r][u], L::set1(m)));  // hidden keys: e^−∞ = 0
            L::store_all(pr + u * kL, e);
            sum = L::add(sum, e);
          }
          const float l = L::hsum(sum);
          const Vec inv = L::set1(1.0f / l);
          for (int u = 0; u < nv; ++u) L::store_all(pr + u * kL, L::mul(L::loadu(pr + u * kL), inv));
          if (row < Tq) lp[bh * Tq + row] = m + std::log(l);
        }
        weighted_rows2(p, p + Tp, vs, n, D, orow, orow + D);
        store_row(op + ((b * Tq + i) * H + h) * D * esize, orow, Q.bf16, D);
        if (i + 1 < Tq) store_row(op + ((b * Tq + i + 1) * H + h) * D * esize, orow + D, Q.bf16, D);
      }
    }
  });
  return {o, lse};
}

std::vector<at::Tensor> short_attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 const c10::optional<at::Tensor>& key_len, bool causal,
                                                 const at::Tensor& o, const at::Tensor& g_o, const at::Tensor& lse,
                                                 double scale_) {
  check(q, k, v, causal);
  for (const at::Tensor* x : {&o, &g_o})
    TORCH_CHECK(x->sizes() == q.sizes() && x->scalar_type() == q.scalar_type() && x->stride(3) == 1,
                "short attention: o and its gradient must be (B, H, T, Dh) like q, last dimension contiguous");
  TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.is_contiguous() && lse.numel() == q.size(0) * q.size(1) * q.size(2),
              "short attention: lse must be contiguous (B, H, T) fp32");
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3), KH = k.size(1),
                G = H / KH;
  const float scale = static_cast<float>(scale_);
  const Lengths len = lengths(key_len, B, Tk);
  const Visible vis{causal};
  at::Tensor gq = at::empty({B, Tq, H, D}, q.options()), gk = at::empty({B, Tk, KH, D}, q.options()),
             gv = at::empty_like(gk);
  const Rows Q = rows(q), K = rows(k), V = rows(v), O = rows(o), Gr = rows(g_o);
  char *gqp = static_cast<char*>(gq.data_ptr()), *gkp = static_cast<char*>(gk.data_ptr()),
       *gvp = static_cast<char*>(gv.data_ptr());
  const float* lp = lse.data_ptr<float>();
  const int64_t esize = gq.element_size();
  // One task per key/value head: its dk, dv sum over the G query heads that read it.
  at::parallel_for(0, B * KH, 1, [&](int64_t begin, int64_t end) {
    const Head qh(Tq, D), kh(Tk, D);
    const int64_t Tp = kh.Tp;
    std::vector<float> buf(3 * Tq * D + 4 * Tk * D + 2 * D * Tp + 4 * Tp + 2 * D + Tq);
    float *qs = buf.data(), *gos = qs + Tq * D, *os = gos + Tq * D, *ks = os + Tq * D, *vs = ks + Tk * D,
          *dk = vs + Tk * D, *dv = dk + Tk * D, *kt = dv + Tk * D, *vt = kt + D * Tp, *p = vt + D * Tp,
          *ds = p + 2 * Tp, *dq = ds + 2 * Tp, *di = dq + 2 * D;
    Vec s[2][kMaxV], dp[2][kMaxV];
    for (int64_t bk = begin; bk < end; ++bk) {
      const int64_t b = bk / KH, khead = bk % KH, lb = len.of(b);
      kh.load(ks, kt, K, b, khead);
      kh.load(vs, vt, V, b, khead);
      std::fill(dk, dk + Tk * D, 0.0f);
      std::fill(dv, dv + Tk * D, 0.0f);
      for (int64_t h = khead * G; h < (khead + 1) * G; ++h) {
        const int64_t bh = b * H + h;
        qh.load(qs, nullptr, Q, b, h);
        qh.load(gos, nullptr, Gr, b, h);
        qh.load(os, nullptr, O, b, h);
        for (int64_t i = 0; i < Tq; ++i) {  // D_i = do_i · o_i
          Vec acc = L::zero();
          for (int64_t d = 0; d < D; d += kL) acc = L::fmadd(L::loadu(gos + i * D + d), L::loadu(os + i * D + d), acc);
          di[i] = L::hsum(acc);
        }
        for (int64_t i = 0; i < Tq; i += 2) {
          const int64_t ib = std::min(i + 1, Tq - 1);
          const int64_t n = std::max(vis.keys(i, lb), vis.keys(ib, lb));
          const int nv = vectors_for(n);
          row_times2(nv, qs + i * D, qs + ib * D, kt, D, Tp, s[0], s[1]);
          row_times2(nv, gos + i * D, gos + ib * D, vt, D, Tp, dp[0], dp[1]);
          for (int r = 0; r < 2; ++r) {
            const int64_t row = i + r, seen = row < Tq ? vis.keys(row, lb) : 0;
            float *pr = p + r * Tp, *dsr = ds + r * Tp;
            if (seen == 0) {  // the repeated row, or a query that sees no key: zero weights, nothing added
              std::fill(pr, pr + nv * kL, 0.0f);
              std::fill(dsr, dsr + nv * kL, 0.0f);
              continue;
            }
            const Vec l = L::set1(lp[bh * Tq + row]), d_r = L::set1(di[row]), sc = L::set1(scale);
            for (int u = 0; u < nv; ++u) {
              const Vec e = L::keep(first_keys(seen, u), L::vexp(L::sub(L::mul(s[r][u], sc), l)));
              L::store_all(pr + u * kL, e);
              L::store_all(dsr + u * kL, L::mul(L::mul(e, L::sub(dp[r][u], d_r)), sc));
            }
          }
          weighted_rows2(ds, ds + Tp, ks, n, D, dq, dq + D);                         // dq_i = scale Σ_j ds_ij k_j
          store_row(gqp + ((b * Tq + i) * H + h) * D * esize, dq, Q.bf16, D);
          if (i + 1 < Tq) store_row(gqp + ((b * Tq + i + 1) * H + h) * D * esize, dq + D, Q.bf16, D);
          add_outer2(dv, p, p + Tp, gos + i * D, gos + ib * D, n, D);                // dv_j += p_ij do_i
          add_outer2(dk, ds, ds + Tp, qs + i * D, qs + ib * D, n, D);                // dk_j += scale ds_ij q_i
        }
      }
      for (int64_t j = 0; j < Tk; ++j) {
        store_row(gkp + ((b * Tk + j) * KH + khead) * D * esize, dk + j * D, Q.bf16, D);
        store_row(gvp + ((b * Tk + j) * KH + khead) * D * esize, dv + j * D, Q.bf16, D);
      }
    }
  });
  return {gq, gk, gv};
}

}  // namespace

TORCH_LIBRARY(attnlab_attention, lib) {
  lib.def("short_attention_forward(Tensor q, Tensor k, Tensor v, Tensor? key_len, bool causal, float scale) -> Tensor[]");
  lib.def("short_attention_backward(Tensor q, Tensor k, Tensor v, Tensor? key_len, bool causal, Tensor o, Tensor g_o, "
          "Tensor lse, float scale) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(attnlab_attention, CPU, lib) {
  lib.impl("short_attention_forward", &short_attention_forward);
  lib.impl("short_attention_backward", &short_attention_backward);
}

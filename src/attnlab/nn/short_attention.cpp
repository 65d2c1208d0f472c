// Causal self-attention of short sequences (T ≤ 128) for training, forward and backward, one head of
// one sequence per task (nn/short_attention.py). Everything of a head — its Q, K, V rows, one row of
// scores at a time — sits in L1 and in fp32, whatever the inputs' dtype (fp32 or bf16), so the step
// neither casts q, k, v to fp32 around a fused kernel nor makes the many small batched products,
// softmax and their backward operators of the explicit form.
//
// Shapes: q, k, v (B, H, T, Dh) with any strides but a contiguous last dimension; Dh a multiple of
// 16, at most 128. With s_ij = scale · q_i · k_j (j ≤ i), ℓ_i = log Σ_{j≤i} e^{s_ij}, p_ij = e^{s_ij − ℓ_i}:
//   forward    o_i = Σ_{j≤i} p_ij v_j                  o (B, T, H, Dh) in q's dtype; ℓ (B, H, T) fp32
//   backward   D_i = do_i · o_i,  dp_ij = do_i · v_j,  ds_ij = p_ij (dp_ij − D_i)
//              dq_i = scale Σ_j ds_ij k_j,  dk_j = scale Σ_i ds_ij q_i,  dv_j = Σ_i p_ij do_i
// The backward pass recomputes p from ℓ (FlashAttention's way: no T × T tensor is kept). Rows of
// scores are computed 16 keys to a vector from Kᵀ (no horizontal sums); bf16 is read by widening and
// written rounded to nearest even (as c10::BFloat16). Threads: at::parallel_for over the B · H heads.
// Source: Vaswani et al. 2017, §3.2.1 (equation 1); Dao et al. 2022, "FlashAttention", §3.1 and
// Algorithm 2 (the backward pass from the saved log-sum-exp).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <cstdint>
#include <cstring>
#include <vector>

#include "decode_ops.h"  // exp16

namespace {

using attnlab_decode::exp16;

constexpr int64_t kL = 16, kMaxT = 128, kMaxD = 128, kMaxV = kMaxT / kL;

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
  if (!bf16) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (int64_t d = 0; d < n; d += kL) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + d)));
    _mm512_storeu_ps(dst + d, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
  }
}

// fp32 → bf16, round to nearest even, NaN kept a (quiet) NaN: c10::BFloat16's rule, 16 at a time
inline __m256i to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

inline void store_row(void* dst, const float* src, bool bf16, int64_t n) {
  if (!bf16) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  uint16_t* o = static_cast<uint16_t*>(dst);
  for (int64_t d = 0; d < n; d += kL)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + d), to_bf16(_mm512_loadu_ps(src + d)));
}

// out[0, 16·NV) = Σ_d x[d] · Mt[d, ·]: a row of x against the D rows of a transposed (D, Tp) matrix.
// Even and odd d in separate accumulators (two chains: a short row's few vectors would otherwise wait
// on the FMA latency), added at the end.
template <int NV>
inline void row_times(const float* x, const float* mt, int64_t D, int64_t Tp, __m512* out) {
  __m512 a0[NV], a1[NV];
  for (int v = 0; v < NV; ++v) a0[v] = a1[v] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 2) {
    const __m512 x0 = _mm512_set1_ps(x[d]), x1 = _mm512_set1_ps(x[d + 1]);
    const float *m0 = mt + d * Tp, *m1 = m0 + Tp;
    for (int v = 0; v < NV; ++v) {
      a0[v] = _mm512_fmadd_ps(x0, _mm512_loadu_ps(m0 + v * kL), a0[v]);
      a1[v] = _mm512_fmadd_ps(x1, _mm512_loadu_ps(m1 + v * kL), a1[v]);
    }
  }
  for (int v = 0; v < NV; ++v) out[v] = _mm512_add_ps(a0[v], a1[v]);
}

inline void row_times_n(int nv, const float* x, const float* mt, int64_t D, int64_t Tp, __m512* out) {
  switch (nv) {
    case 1: return row_times<1>(x, mt, D, Tp, out);
    case 2: return row_times<2>(x, mt, D, Tp, out);
    case 3: return row_times<3>(x, mt, D, Tp, out);
    case 4: return row_times<4>(x, mt, D, Tp, out);
    case 5: return row_times<5>(x, mt, D, Tp, out);
    case 6: return row_times<6>(x, mt, D, Tp, out);
    case 7: return row_times<7>(x, mt, D, Tp, out);
    default: return row_times<8>(x, mt, D, Tp, out);
  }
}

// acc[0, 16·DV) = Σ_{j<n} w[j] · M[j, ·] (M row-major (n, 16·DV)): even and odd j in two chains
template <int DV>
inline void weighted_rows(const float* w, const float* m, int64_t n, float* acc) {
  constexpr int64_t D = DV * kL;
  __m512 a0[DV], a1[DV];
  for (int u = 0; u < DV; ++u) a0[u] = a1[u] = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 1 < n; j += 2) {
    const __m512 w0 = _mm512_set1_ps(w[j]), w1 = _mm512_set1_ps(w[j + 1]);
    for (int u = 0; u < DV; ++u) {
      a0[u] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(m + j * D + u * kL), a0[u]);
      a1[u] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(m + (j + 1) * D + u * kL), a1[u]);
    }
  }
  if (j < n)
    for (int u = 0; u < DV; ++u) a0[u] = _mm512_fmadd_ps(_mm512_set1_ps(w[j]), _mm512_loadu_ps(m + j * D + u * kL), a0[u]);
  for (int u = 0; u < DV; ++u) _mm512_storeu_ps(acc + u * kL, _mm512_add_ps(a0[u], a1[u]));
}

inline void weighted_rows(const float* w, const float* m, int64_t n, int64_t D, float* acc) {
  switch (D / kL) {
    case 1: return weighted_rows<1>(w, m, n, acc);
    case 2: return weighted_rows<2>(w, m, n, acc);
    case 3: return weighted_rows<3>(w, m, n, acc);
    case 4: return weighted_rows<4>(w, m, n, acc);
    case 5: return weighted_rows<5>(w, m, n, acc);
    case 6: return weighted_rows<6>(w, m, n, acc);
    case 7: return weighted_rows<7>(w, m, n, acc);
    default: return weighted_rows<8>(w, m, n, acc);
  }
}

// M[j, ·] += w[j] · x for j < n (M row-major (n, 16·DV)); x stays in registers
template <int DV>
inline void add_outer(float* m, const float* w, const float* x, int64_t n) {
  constexpr int64_t D = DV * kL;
  __m512 xs[DV];
  for (int u = 0; u < DV; ++u) xs[u] = _mm512_loadu_ps(x + u * kL);
  for (int64_t j = 0; j < n; ++j) {
    const __m512 wj = _mm512_set1_ps(w[j]);
    float* r = m + j * D;
    for (int u = 0; u < DV; ++u) _mm512_storeu_ps(r + u * kL, _mm512_fmadd_ps(wj, xs[u], _mm512_loadu_ps(r + u * kL)));
  }
}

inline void add_outer(float* m, const float* w, const float* x, int64_t n, int64_t D) {
  switch (D / kL) {
    case 1: return add_outer<1>(m, w, x, n);
    case 2: return add_outer<2>(m, w, x, n);
    case 3: return add_outer<3>(m, w, x, n);
    case 4: return add_outer<4>(m, w, x, n);
    case 5: return add_outer<5>(m, w, x, n);
    case 6: return add_outer<6>(m, w, x, n);
    case 7: return add_outer<7>(m, w, x, n);
    default: return add_outer<8>(m, w, x, n);
  }
}

// One head's matrices in fp32: a row-major copy and a transposed, zero-padded (D, Tp) copy.
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

// The scores of query row i (keys j < 16·nv; lanes j > i masked out): scale · q_i · Kᵀ
inline int scores(const float* q, const float* kt, int64_t i, int64_t D, int64_t Tp, float scale, __m512* s) {
  const int nv = static_cast<int>(i / kL + 1);
  row_times_n(nv, q, kt, D, Tp, s);
  for (int v = 0; v < nv; ++v) s[v] = _mm512_mul_ps(s[v], _mm512_set1_ps(scale));
  return nv;
}

inline __mmask16 causal_lanes(int64_t i) {  // the last vector's keys j ≤ i
  return static_cast<__mmask16>((1u << (i % kL + 1)) - 1);
}

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  for (const at::Tensor* x : {&q, &k, &v}) {
    TORCH_CHECK(x->device().is_cpu() && x->dim() == 4 && x->sizes() == q.sizes() && x->scalar_type() == q.scalar_type(),
                "short attention: q, k, v must be CPU (B, H, T, Dh) tensors of one shape and dtype");
    TORCH_CHECK(x->stride(3) == 1, "short attention: the last dimension must be contiguous");
  }
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16, "short attention: fp32 or bf16");
  TORCH_CHECK(q.size(2) >= 1 && q.size(2) <= kMaxT, "short attention: 1 <= T <= ", kMaxT);
  TORCH_CHECK(q.size(3) % kL == 0 && q.size(3) <= kMaxD, "short attention: Dh a multiple of 16, at most ", kMaxD);
}

std::vector<at::Tensor> short_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                double scale_) {
  check(q, k, v);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const float scale = static_cast<float>(scale_);
  at::Tensor o = at::empty({B, T, H, D}, q.options());
  at::Tensor lse = at::empty({B, H, T}, q.options().dtype(at::kFloat));
  const Rows Q = rows(q), K = rows(k), V = rows(v);
  char* op = static_cast<char*>(o.data_ptr());
  float* lp = lse.data_ptr<float>();
  const int64_t esize = o.element_size();
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    Head head(T, D);
    const int64_t Tp = head.Tp;
    std::vector<float> buf(T * D * 3 + D * Tp + Tp + D);
    float *qs = buf.data(), *ks = qs + T * D, *vs = ks + T * D, *kt = vs + T * D, *p = kt + D * Tp, *orow = p + Tp;
    __m512 s[kMaxV];
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      head.load(qs, nullptr, Q, b, h);
      head.load(ks, kt, K, b, h);
      head.load(vs, nullptr, V, b, h);
      for (int64_t i = 0; i < T; ++i) {
        const int nv = scores(qs + i * D, kt, i, D, Tp, scale, s);
        const __mmask16 last = causal_lanes(i);
        s[nv - 1] = _mm512_mask_blend_ps(last, _mm512_set1_ps(-__builtin_inff()), s[nv - 1]);
        __m512 mx = s[0];
        for (int u = 1; u < nv; ++u) mx = _mm512_max_ps(mx, s[u]);
        const float m = _mm512_reduce_max_ps(mx);
        __m512 sum = _mm512_setzero_ps();
        for (int u = 0; u < nv; ++u) {
          const __m512 e = exp16(_mm512_sub_ps(s[u], _mm512_set1_ps(m)));  // masked lanes: e^−∞ = 0
          _mm512_storeu_ps(p + u * kL, e);
          sum = _mm512_add_ps(sum, e);
        }
        const float l = _mm512_reduce_add_ps(sum);
        const __m512 inv = _mm512_set1_ps(1.0f / l);
        for (int u = 0; u < nv; ++u) _mm512_storeu_ps(p + u * kL, _mm512_mul_ps(_mm512_loadu_ps(p + u * kL), inv));
        lp[bh * T + i] = m + std::log(l);
        weighted_rows(p, vs, i + 1, D, orow);
        store_row(op + ((b * T + i) * H + h) * D * esize, orow, Q.bf16, D);
      }
    }
  });
  return {o, lse};
}

std::vector<at::Tensor> short_attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 const at::Tensor& o, const at::Tensor& g_o, const at::Tensor& lse,
                                                 double scale_) {
  check(q, k, v);
  for (const at::Tensor* x : {&o, &g_o})
    TORCH_CHECK(x->sizes() == q.sizes() && x->scalar_type() == q.scalar_type() && x->stride(3) == 1,
                "short attention: o and its gradient must be (B, H, T, Dh) like q, last dimension contiguous");
  TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.is_contiguous() && lse.numel() == q.size(0) * q.size(1) * q.size(2),
              "short attention: lse must be contiguous (B, H, T) fp32");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const float scale = static_cast<float>(scale_);
  at::Tensor gq = at::empty({B, T, H, D}, q.options()), gk = at::empty_like(gq), gv = at::empty_like(gq);
  const Rows Q = rows(q), K = rows(k), V = rows(v), O = rows(o), G = rows(g_o);
  char *gqp = static_cast<char*>(gq.data_ptr()), *gkp = static_cast<char*>(gk.data_ptr()),
       *gvp = static_cast<char*>(gv.data_ptr());
  const float* lp = lse.data_ptr<float>();
  const int64_t esize = gq.element_size();
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    Head head(T, D);
    const int64_t Tp = head.Tp;
    std::vector<float> buf(T * D * 7 + 2 * D * Tp + 2 * Tp + D + T);
    float *qs = buf.data(), *ks = qs + T * D, *vs = ks + T * D, *gos = vs + T * D, *dk = gos + T * D,
          *dv = dk + T * D, *os = dv + T * D, *kt = os + T * D, *vt = kt + D * Tp, *p = vt + D * Tp,
          *ds = p + Tp, *dq = ds + Tp, *di = dq + D;
    __m512 s[kMaxV], dp[kMaxV];
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      head.load(qs, nullptr, Q, b, h);
      head.load(ks, kt, K, b, h);
      head.load(vs, vt, V, b, h);
      head.load(gos, nullptr, G, b, h);
      head.load(os, nullptr, O, b, h);
      for (int64_t i = 0; i < T; ++i) {  // D_i = do_i · o_i
        __m512 acc = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d += kL)
          acc = _mm512_fmadd_ps(_mm512_loadu_ps(gos + i * D + d), _mm512_loadu_ps(os + i * D + d), acc);
        di[i] = _mm512_reduce_add_ps(acc);
      }
      std::fill(dk, dk + T * D, 0.0f);
      std::fill(dv, dv + T * D, 0.0f);
      for (int64_t i = 0; i < T; ++i) {
        const int nv = scores(qs + i * D, kt, i, D, Tp, scale, s);
        row_times_n(nv, gos + i * D, vt, D, Tp, dp);
        const __mmask16 last = causal_lanes(i);
        const __m512 l = _mm512_set1_ps(lp[bh * T + i]), d_i = _mm512_set1_ps(di[i]);
        for (int u = 0; u < nv; ++u) {
          __m512 e = exp16(_mm512_sub_ps(s[u], l));
          if (u == nv - 1) e = _mm512_maskz_mov_ps(last, e);
          _mm512_storeu_ps(p + u * kL, e);
          _mm512_storeu_ps(ds + u * kL, _mm512_mul_ps(_mm512_mul_ps(e, _mm512_sub_ps(dp[u], d_i)),
                                                      _mm512_set1_ps(scale)));
        }
        weighted_rows(ds, ks, i + 1, D, dq);                      // dq_i = scale Σ_j ds_ij k_j
        store_row(gqp + ((b * T + i) * H + h) * D * esize, dq, Q.bf16, D);
        add_outer(dv, p, gos + i * D, i + 1, D);                  // dv_j += p_ij do_i
        add_outer(dk, ds, qs + i * D, i + 1, D);                  // dk_j += scale ds_ij q_i
      }
      for (int64_t j = 0; j < T; ++j) {
        store_row(gkp + ((b * T + j) * H + h) * D * esize, dk + j * D, Q.bf16, D);
        store_row(gvp + ((b * T + j) * H + h) * D * esize, dv + j * D, Q.bf16, D);
      }
    }
  });
  return {gq, gk, gv};
}

}  // namespace

TORCH_LIBRARY(attnlab_attention, lib) {
  lib.def("short_attention_forward(Tensor q, Tensor k, Tensor v, float scale) -> Tensor[]");
  lib.def("short_attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor g_o, Tensor lse, float scale) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(attnlab_attention, CPU, lib) {
  lib.impl("short_attention_forward", &short_attention_forward);
  lib.impl("short_attention_backward", &short_attention_backward);
}

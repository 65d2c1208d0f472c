// Mamba's causal depthwise convolution followed by SiLU (nn/causal_conv.py), forward and backward, in
// the (B, T, Di) layout of the block: kLanes channels per vector (lanes.h: 16 with AVX512, 8 with
// AVX2), the last K − 1 inputs in registers, so neither the transposes around F.conv1d nor its
// pre-activation output are ever written.
//
// Shapes (fp32, contiguous): x (B, T, Di); w (K, Di) = the conv1d weight (Di, 1, K) transposed;
// bias (Di,) or none. With x_t = 0 for t < 0:
//   p_t = bias + Σ_{k<K} w_k · x_{t−K+1+k}       y_t = SiLU(p_t) = p_t / (1 + exp(−p_t))   (as F.silu)
// Backward (p_t recomputed): with s = 1 / (1 + exp(−p)), g_p = g_y · s · (1 + p · (1 − s)) and
//   ∂x_t = Σ_k w_k g_p,{t+K−1−k}     ∂w_k = Σ_{b,t} g_p,t x_{t−K+1+k}     ∂bias = Σ_{b,t} g_p,t
// ∂w and ∂bias are written per sequence (partial sums the caller adds). Threads: at::parallel_for
// over (sequence, block of kLanes channels).
// Source: Gu & Dao 2023, §3.4 and Figure 3 (the convolution before the SSM); Dao, causal-conv1d
// (the fused kernel the reference implementation calls).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include "simd_compat.h"
#include <cstdint>

#include "decode_ops.h"  // prefetch
#include "lanes.h"       // Vec, Mask, kLanes (16 with AVX512, 8 with AVX2) and the functions on them

namespace {

using namespace attnlab_lanes;

constexpr int64_t kMaxK = 8;
// Rows prefetched ahead of the one in use. A (sequence, block) walks its T rows at a stride of Di
// floats, one cache line each, which the hardware prefetcher does not follow: without it every row is
// a miss of its own once the tensors have left the cache (as in training, where each layer's come
// back from the forward pass), and a step reads at a few GB/s (bench/mamba_block.py).
constexpr int64_t kAhead = 8;

using attnlab_decode::prefetch;

struct Conv {
  const float *x, *w, *bias;
  int64_t T, Di, K;
  int64_t blocks() const { return (Di + kLanes - 1) / kLanes; }
  // p_t of sequence b, channels d0 .. d0 + kLanes − 1 (x read from memory: the last K rows are in cache)
  Vec pre(int64_t b, int64_t t, int64_t d0, const Mask& m) const {
    Vec p = bias ? load(bias + d0, m) : zero();
    for (int64_t k = 0; k < K; ++k) {
      const int64_t s = t - K + 1 + k;
      if (s < 0) continue;
      const Vec xs = load(x + (b * T + s) * Di + d0, m);
      p = add(p, mul(load(w + k * Di + d0, m), xs));
    }
    return p;
  }
};

Conv make(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be contiguous (B, T, Di) fp32");
  TORCH_CHECK(w.dim() == 2 && w.size(1) == x.size(2) && w.size(0) >= 1 && w.size(0) <= kMaxK && w.is_contiguous() &&
              w.scalar_type() == at::kFloat, "w must be contiguous (K, Di) fp32 with 1 <= K <= ", kMaxK);
  TORCH_CHECK(!bias.has_value() || (bias->dim() == 1 && bias->size(0) == x.size(2) && bias->is_contiguous() &&
                                    bias->scalar_type() == at::kFloat), "bias must be contiguous (Di,) fp32");
  return {x.data_ptr<float>(), w.data_ptr<float>(), bias.has_value() ? bias->data_ptr<float>() : nullptr,
          x.size(1), x.size(2), w.size(0)};
}

inline Vec silu(Vec p) {  // p / (1 + exp(−p)), F.silu's operations
  const Vec one = set1(1.0f);
  return div(p, add(one, vexp(sub(zero(), p))));
}

at::Tensor conv_silu_forward(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  const Conv c = make(x, w, bias);
  at::Tensor y = at::empty_like(x);
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, x.size(0) * c.blocks(), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / c.blocks(), d0 = (i % c.blocks()) * kLanes;
      const Mask m = lanes(d0, c.Di);
      for (int64_t t = 0; t < c.T; ++t) {
        if (t + kAhead < c.T) {
          prefetch(c.x + (b * c.T + t + kAhead) * c.Di + d0);
          prefetch(yp + (b * c.T + t + kAhead) * c.Di + d0);
        }
        store(yp + (b * c.T + t) * c.Di + d0, m, silu(c.pre(b, t, d0, m)));
      }
    }
  });
  return y;
}

// -> (∂x (B, T, Di), ∂w partial sums (B, K, Di), ∂bias partial sums (B, Di))
std::vector<at::Tensor> conv_silu_backward(const at::Tensor& x, const at::Tensor& w,
                                           const c10::optional<at::Tensor>& bias, const at::Tensor& g_y) {
  const Conv c = make(x, w, bias);
  TORCH_CHECK(g_y.sizes() == x.sizes() && g_y.is_contiguous() && g_y.scalar_type() == at::kFloat, "g_y must be like x");
  const int64_t nb = x.size(0), T = c.T, Di = c.Di, K = c.K;
  at::Tensor gx = at::empty_like(x), gw = at::empty({nb, K, Di}, x.options()), gb = at::empty({nb, Di}, x.options());
  const float* gyp = g_y.data_ptr<float>();
  float *gxp = gx.data_ptr<float>(), *gwp = gw.data_ptr<float>(), *gbp = gb.data_ptr<float>();
  const Vec one = set1(1.0f);
  at::parallel_for(0, nb * c.blocks(), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / c.blocks(), d0 = (i % c.blocks()) * kLanes;
      const Mask m = lanes(d0, Di);
      Vec wk[kMaxK], acc_w[kMaxK], later[kMaxK];  // later[j] = g_p,{t+1+j}
      for (int64_t k = 0; k < K; ++k) {
        wk[k] = load(c.w + k * Di + d0, m);
        acc_w[k] = later[k] = zero();
      }
      Vec acc_b = zero();
      for (int64_t t = T - 1; t >= 0; --t) {
        const int64_t ahead = (b * T + t - K + 1 - kAhead) * Di + d0;  // the row read kAhead steps later
        if (t - K + 1 - kAhead >= 0) prefetch(c.x + ahead);
        if (t - kAhead >= 0) {
          prefetch(gyp + (b * T + t - kAhead) * Di + d0);
          prefetch(gxp + (b * T + t - kAhead) * Di + d0);
        }
        const Vec p = c.pre(b, t, d0, m);
        const Vec s = div(one, add(one, vexp(sub(zero(), p))));
        const Vec ds = mul(s, add(one, mul(p, sub(one, s))));
        const Vec gp = mul(load(gyp + (b * T + t) * Di + d0, m), ds);
        acc_b = add(acc_b, gp);
        for (int64_t k = 0; k < K; ++k) {
          const int64_t src = t - K + 1 + k;
          if (src >= 0)
            acc_w[k] = add(acc_w[k], mul(gp, load(c.x + (b * T + src) * Di + d0, m)));
        }
        // ∂x_t = w_{K−1} g_p,t + Σ_{j<K−1} w_{K−2−j} g_p,{t+1+j}
        Vec g = mul(wk[K - 1], gp);
        for (int64_t j = 0; j + 1 < K; ++j) g = add(g, mul(wk[K - 2 - j], later[j]));
        store(gxp + (b * T + t) * Di + d0, m, g);
        for (int64_t j = K - 2; j > 0; --j) later[j] = later[j - 1];
        if (K > 1) later[0] = gp;
      }
      for (int64_t k = 0; k < K; ++k) store(gwp + (b * K + k) * Di + d0, m, acc_w[k]);
      store(gbp + b * Di + d0, m, acc_b);
    }
  });
  return {gx, gw, gb};
}

}  // namespace

TORCH_LIBRARY(attnlab_conv, lib) {
  lib.def("conv_silu_forward(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  lib.def("conv_silu_backward(Tensor x, Tensor w, Tensor? bias, Tensor g_y) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(attnlab_conv, CPU, lib) {
  lib.impl("conv_silu_forward", &conv_silu_forward);
  lib.impl("conv_silu_backward", &conv_silu_backward);
}

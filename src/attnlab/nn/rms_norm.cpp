// RMSNorm (nn/norm.py), forward and backward, one pass over each row: the mean square, its reciprocal
// root and the scaled output in the forward; the row's dot product and both gradients in the backward,
// where the composition of PyTorch's ops runs ~10 passes and as many operator calls. The forward is
// the composition's bit for bit: the row's scale by decode_ops.h rms_inverse (Σ x² in the order of
// PyTorch's sum, as the fused decoding step's norm), then the products in nn/norm.py's order.
//
// Shapes (fp32, contiguous): x (..., D), R rows of D, w (D,) the gain; y and ∂x x's shape, rstd (R,).
// With r = 1 / sqrt(mean_j x_j² + eps):
//   y = w ⊙ (x · r)                                      (the order nn/norm.py's composition rounds in)
//   ∂x = r · (g ⊙ w) − x · r³ · Σ_j g_j w_j x_j / D       ∂w = Σ_rows g ⊙ x · r
// ∂w is written per block of kRows rows (partial sums the caller adds in order): the blocks depend on
// R only, so the bits do not depend on the thread count. Threads: at::parallel_for over rows (forward)
// and row blocks (backward).
// Source: Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", equation (4).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include "simd_compat.h"
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <tuple>

#include "decode_ops.h"  // rms_inverse: the fused decoding step's scale, Σ x² in PyTorch's order
#include "lanes.h"       // Vec, Mask, kLanes (16 with AVX512, 8 with AVX2) and the functions on them

namespace {

using namespace attnlab_lanes;

constexpr int64_t kRows = 64;  // rows per block of the backward's partial ∂w

void check(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous (..., D) fp32");
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(-1) && w.size(0) > 0 && w.scalar_type() == at::kFloat &&
              w.is_contiguous(), "w must be contiguous (D,) fp32");
}

std::tuple<at::Tensor, at::Tensor> rms_forward(const at::Tensor& x, const at::Tensor& w, double eps) {
  check(x, w);
  const int64_t D = x.size(-1), R = x.numel() / D;
  at::Tensor y = at::empty_like(x), rstd = at::empty({R}, x.options());
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float *yp = y.data_ptr<float>(), *rp = rstd.data_ptr<float>();
  at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * D;
      const float inv = attnlab_decode::rms_inverse(xr, D, static_cast<float>(eps));
      rp[r] = inv;
      const Vec iv = set1(inv);
      for (int64_t j = 0; j < D; j += kLanes) {
        const Mask m = lanes(j, D);
        store(yp + r * D + j, m, mul(load(wp + j, m), mul(load(xr + j, m), iv)));
      }
    }
  });
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor> rms_backward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& w,
                                                const at::Tensor& rstd) {
  check(x, w);
  TORCH_CHECK(g.sizes() == x.sizes() && g.scalar_type() == at::kFloat && g.is_contiguous(),
              "g must be contiguous fp32 of x's shape");
  const int64_t D = x.size(-1), R = x.numel() / D, P = (R + kRows - 1) / kRows;
  TORCH_CHECK(rstd.dim() == 1 && rstd.size(0) == R && rstd.is_contiguous(), "rstd must be (R,) fp32");
  at::Tensor gx = at::empty_like(x), gw = at::zeros({P, D}, x.options());
  const float *gp = g.data_ptr<float>(), *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>(),
              *rp = rstd.data_ptr<float>();
  float *gxp = gx.data_ptr<float>(), *gwp = gw.data_ptr<float>();
  at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      float* gwb = gwp + p * D;
      for (int64_t r = p * kRows; r < std::min(R, (p + 1) * kRows); ++r) {
        const float *gr = gp + r * D, *xr = xp + r * D;
        const float inv = rp[r];
        Vec acc = zero();  // Σ_j g_j w_j x_j
        for (int64_t j = 0; j < D; j += kLanes) {
          const Mask m = lanes(j, D);
          const Vec xv = load(xr + j, m), gv = load(gr + j, m);
          acc = fmadd(mul(gv, load(wp + j, m)), xv, acc);
          store(gwb + j, m, fmadd(gv, mul(xv, set1(inv)), load(gwb + j, m)));
        }
        const Vec iv = set1(inv), c = set1(inv * inv * inv * hsum(acc) / static_cast<float>(D));
        for (int64_t j = 0; j < D; j += kLanes) {
          const Mask m = lanes(j, D);
          const Vec xv = load(xr + j, m), gw_j = mul(load(gr + j, m), load(wp + j, m));
          store(gxp + r * D + j, m, sub(mul(iv, gw_j), mul(xv, c)));
        }
      }
    }
  });
  return {gx, gw};
}

}  // namespace

TORCH_LIBRARY(attnlab_norm, m) {
  m.def("rms_forward(Tensor x, Tensor w, float eps) -> (Tensor, Tensor)");
  m.def("rms_backward(Tensor g, Tensor x, Tensor w, Tensor rstd) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attnlab_norm, CPU, m) {
  m.impl("rms_forward", rms_forward);
  m.impl("rms_backward", rms_backward);
}

// y = x · Wᵀ for a block-quantized W (Q8_0, Q4_0, Q4_1; see nn/quant.py) on x86-64 CPUs with
// AVX512-VNNI, the way llama.cpp's CPU backend multiplies a q8_0 / q4_x matrix by a vector.
//
// Shapes: x (R, I) fp32, W (O, I) as qs / d / m (nn/quant.py), y (R, O) fp32; NB = I / 32 blocks.
// Each x row is quantized per 32-block to int8 with an fp32 scale dx = max|x| / 127 (round to
// nearest even), so every block's products are summed exactly in int32 (VNNI vpdpbusd: 64 u8 × s8
// products per instruction) and scaled once:
//   Q8_0  y = Σ_b dw_b dx_b Σ_i qw_i qx_i
//         (x is stored as qx + 128 in u8, W signed: Σ (qx+128) qw − 128 Σ qw, the 128 Σ qw from a
//          second vpdpbusd per weight vector, shared by all x rows)
//   Q4_0  y = Σ_b dw_b dx_b (Σ_i q_i qx_i − 8 S_b),   S_b = Σ_i qx_i   (W unsigned 0..15, x signed)
//   Q4_1  y = Σ_b dw_b dx_b Σ_i q_i qx_i + Σ_b m_b dx_b S_b
// The result is, up to fp32 summation order, F.linear(dequantize(x_q8), dequantize(W)).
// Two 32-blocks fill one 512-bit vector; a tile of 4 weight rows × up to 4 x rows shares loads.
// Rows of W are split over at::parallel_for (torch's intra-op threads).
// Source: ggml-cpu quants.c ggml_vec_dot_q8_0_q8_0 / q4_0_q8_0 / q4_1_q8_1 (same block algebra).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <cstdint>

#include "quant_kernel.h"

namespace {

using namespace attnlab_q8;

template <int SCHEME>
void run(const uint8_t* qs, const at::Half* d, const at::Half* m, int64_t out, int64_t nb,
         const Acts& a, float* y) {
  const int64_t row_bytes = SCHEME == Q8_0 ? nb * QK : nb * QK / 2;
  const int64_t tiles = (out + MR - 1) / MR;
  // grain: enough rows that a thread's share of a decode product is worth waking it for
  at::parallel_for(0, tiles, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t o = t * MR;
      if (o + MR <= out) rows_tile<SCHEME, MR>(qs, d, m, row_bytes, nb, a, o, y, out);
      else for (int64_t i = o; i < out; ++i) rows_tile<SCHEME, 1>(qs, d, m, row_bytes, nb, a, i, y, out);
    }
  });
}

at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d,
                        const c10::optional<at::Tensor>& m, int64_t scheme) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be (R, I) float32");
  TORCH_CHECK(d.dim() == 2 && d.scalar_type() == at::kHalf, "d must be (O, NB) float16");
  const int64_t rows = x.size(0), in = x.size(1), out = d.size(0), nb = d.size(1);
  TORCH_CHECK(in == nb * QK && nb % 2 == 0, "in_features must be 32 · NB with NB even, got ", in);
  TORCH_CHECK(scheme >= 0 && scheme <= 2, "scheme must be 0 (q8_0), 1 (q4_0) or 2 (q4_1)");
  TORCH_CHECK(qs.is_contiguous() && d.is_contiguous() && qs.numel() == out * (scheme == Q8_0 ? in : in / 2),
              "qs does not match d");
  TORCH_CHECK(scheme != Q4_1 || (m.has_value() && m->is_contiguous() && m->sizes() == d.sizes()),
              "q4_1 needs m of d's shape");
  at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty({rows, out}, x.options());
  if (rows == 0) return y;
  Acts a;
  quantize_rows(a, xc.data_ptr<float>(), rows, in, (int)scheme);
  const uint8_t* q = (const uint8_t*)qs.data_ptr();
  const at::Half* dp = d.data_ptr<at::Half>();
  const at::Half* mp = scheme == Q4_1 ? m->data_ptr<at::Half>() : nullptr;
  if (scheme == Q8_0) run<Q8_0>(q, dp, mp, out, nb, a, y.data_ptr<float>());
  else if (scheme == Q4_0) run<Q4_0>(q, dp, mp, out, nb, a, y.data_ptr<float>());
  else run<Q4_1>(q, dp, mp, out, nb, a, y.data_ptr<float>());
  return y;
}

// 16 fp32 -> 16 bf16, round to nearest even (finite inputs), AVX512F only
inline __m256i to_bf16(__m512 v) {
  __m512i b = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  b = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(b, 16));
}

// W (O, I) as bf16: the dequantized weight (q · d, (q − 8) · d, q · d + m in fp32, then rounded),
// for products with many rows (prefill), which a bf16 GEMM (oneDNN, AMX where present) does faster.
at::Tensor dequantize_bf16(const at::Tensor& qs, const at::Tensor& d, const c10::optional<at::Tensor>& m,
                           int64_t scheme) {
  TORCH_CHECK(d.dim() == 2 && d.scalar_type() == at::kHalf && d.is_contiguous(), "d must be (O, NB) float16");
  const int64_t out = d.size(0), nb = d.size(1), in = nb * QK;
  TORCH_CHECK(qs.is_contiguous() && qs.numel() == out * (scheme == Q8_0 ? in : in / 2), "qs does not match d");
  TORCH_CHECK(scheme != Q4_1 || (m.has_value() && m->is_contiguous() && m->sizes() == d.sizes()),
              "q4_1 needs m of d's shape");
  at::Tensor w = at::empty({out, in}, d.options().dtype(at::kBFloat16));
  const uint8_t* q = (const uint8_t*)qs.data_ptr();
  const at::Half* dp = d.data_ptr<at::Half>();
  const at::Half* mp = scheme == Q4_1 ? m->data_ptr<at::Half>() : nullptr;
  uint16_t* wp = (uint16_t*)w.data_ptr();
  at::parallel_for(0, out, 16, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t b = 0; b < nb; ++b) {
        const __m512 dv = _mm512_set1_ps((float)dp[o * nb + b]);
        __m512 lo, hi;
        if (scheme == Q8_0) {
          const uint8_t* p = q + o * in + b * QK;
          lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
          hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p + 16))));
          lo = _mm512_mul_ps(lo, dv), hi = _mm512_mul_ps(hi, dv);
        } else {
          __m128i v = _mm_loadu_si128((const __m128i*)(q + o * in / 2 + b * 16));
          lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, _mm_set1_epi8(0x0F))));
          hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F))));
          if (scheme == Q4_0) {
            lo = _mm512_mul_ps(dv, _mm512_sub_ps(lo, _mm512_set1_ps(8.0f)));
            hi = _mm512_mul_ps(dv, _mm512_sub_ps(hi, _mm512_set1_ps(8.0f)));
          } else {
            const __m512 mv = _mm512_set1_ps((float)mp[o * nb + b]);
            lo = _mm512_add_ps(_mm512_mul_ps(dv, lo), mv), hi = _mm512_add_ps(_mm512_mul_ps(dv, hi), mv);
          }
        }
        _mm256_storeu_si256((__m256i*)(wp + o * in + b * QK), to_bf16(lo));
        _mm256_storeu_si256((__m256i*)(wp + o * in + b * QK + 16), to_bf16(hi));
      }
  });
  return w;
}

}  // namespace

TORCH_LIBRARY(attnlab_quant, lib) {
  lib.def("linear(Tensor x, Tensor qs, Tensor d, Tensor? m, int scheme) -> Tensor");
  lib.def("dequantize_bf16(Tensor qs, Tensor d, Tensor? m, int scheme) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnlab_quant, CPU, lib) {
  lib.impl("linear", &quant_linear);
  lib.impl("dequantize_bf16", &dequantize_bf16);
}

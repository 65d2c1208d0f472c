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
#include <vector>

namespace {

constexpr int QK = 32;
constexpr int MR = 4;  // weight rows per tile

enum Scheme { Q8_0 = 0, Q4_0 = 1, Q4_1 = 2 };

struct Acts {
  int64_t rows, nb;
  std::vector<uint8_t> q;     // (R, I) int8 (Q4) or int8 + 128 (Q8_0)
  std::vector<float> dvec;    // (R, NB/2, 16): dx of block 2p in lanes 0..7, of 2p+1 in 8..15
  std::vector<int32_t> corr;  // (R, NB/2, 16): Q4_0's −8 S_b in lanes 0 and 8, else 0
  std::vector<float> c;       // (R, NB/2, 16): Q4_1's dx_b S_b in lanes 0 and 8, else 0
};

Acts quantize_rows(const float* x, int64_t rows, int64_t in, int scheme) {
  Acts a;
  a.rows = rows;
  a.nb = in / QK;
  const int64_t np = a.nb / 2;
  a.q.resize(rows * in);
  a.dvec.resize(rows * np * 16);
  a.corr.assign(rows * np * 16, 0);
  a.c.assign(rows * np * 16, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < a.nb; ++b) {
      const float* xb = x + r * in + b * QK;
      __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
      float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      float d = amax / 127.0f;
      float id = d != 0.0f ? 1.0f / d : 0.0f;
      __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
      __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
      int32_t s = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      __m128i b0 = _mm512_cvtepi32_epi8(q0), b1 = _mm512_cvtepi32_epi8(q1);
      if (scheme == Q8_0) {
        b0 = _mm_xor_si128(b0, _mm_set1_epi8((char)0x80));
        b1 = _mm_xor_si128(b1, _mm_set1_epi8((char)0x80));
      }
      uint8_t* qb = a.q.data() + r * in + b * QK;
      _mm_storeu_si128((__m128i*)qb, b0);
      _mm_storeu_si128((__m128i*)(qb + 16), b1);
      const int64_t p = b / 2, half = b % 2;
      for (int k = 0; k < 8; ++k) a.dvec[(r * np + p) * 16 + half * 8 + k] = d;
      a.corr[(r * np + p) * 16 + half * 8] = -8 * s;
      a.c[(r * np + p) * 16 + half * 8] = d * (float)s;
    }
  }
  return a;
}

// 2 fp16 scales -> 16 floats (8 copies of each)
inline __m512 scale_pair(const at::Half* p) {
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  __m128 two = _mm_cvtph_ps(_mm_cvtsi32_si128(*(const int32_t*)p));
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(two));
}

// 32 bytes of two Q4 blocks -> 64 values 0..15 in element order
inline __m512i unpack_q4(const uint8_t* p) {
  __m512i z = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)p));
  z = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(1, 1, 0, 0));  // 128-bit lanes [blk0, blk0, blk1, blk1]
  z = _mm512_mask_srli_epi16(z, (__mmask32)0xFF00FF00u, z, 4);  // high nibbles in lanes 1 and 3
  return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
}

template <int SCHEME, int M, int N>
void tile(const uint8_t* qs, const at::Half* d, const at::Half* m, int64_t row_bytes, int64_t nb,
          const Acts& a, int64_t o, int64_t r0, float* y, int64_t out) {
  const int64_t np = nb / 2, in = nb * QK;
  __m512 acc[M][N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) acc[i][j] = _mm512_setzero_ps();
  const __m512i c128 = _mm512_set1_epi8((char)0x80);
  for (int64_t p = 0; p < np; ++p) {
    __m512i w[M], init[M];
    __m512 dw[M], mw[M];
    for (int i = 0; i < M; ++i) {
      const uint8_t* row = qs + (o + i) * row_bytes;
      if (SCHEME == Q8_0) {
        w[i] = _mm512_loadu_si512(row + p * 64);
        init[i] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                   _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, w[i]));
      } else {
        w[i] = unpack_q4(row + p * 32);
      }
      dw[i] = scale_pair(d + (o + i) * nb + 2 * p);
      if (SCHEME == Q4_1) mw[i] = scale_pair(m + (o + i) * nb + 2 * p);
    }
    for (int j = 0; j < N; ++j) {
      const int64_t r = r0 + j;
      __m512i xv = _mm512_loadu_si512(a.q.data() + r * in + p * 64);
      __m512 dx = _mm512_loadu_ps(a.dvec.data() + (r * np + p) * 16);
      __m512i ci = SCHEME == Q4_0 ? _mm512_loadu_si512(a.corr.data() + (r * np + p) * 16)
                                  : _mm512_setzero_si512();
      __m512 cx = SCHEME == Q4_1 ? _mm512_loadu_ps(a.c.data() + (r * np + p) * 16) : _mm512_setzero_ps();
      for (int i = 0; i < M; ++i) {
        if (SCHEME == Q4_1) acc[i][j] = _mm512_fmadd_ps(mw[i], cx, acc[i][j]);
        __m512i s = SCHEME == Q8_0 ? _mm512_dpbusd_epi32(init[i], xv, w[i])
                                   : _mm512_dpbusd_epi32(ci, w[i], xv);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[i], dx), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      y[(r0 + j) * out + o + i] = _mm512_reduce_add_ps(acc[i][j]);
    }
}

template <int SCHEME, int M>
void rows_tile(const uint8_t* qs, const at::Half* d, const at::Half* m, int64_t row_bytes, int64_t nb,
               const Acts& a, int64_t o, float* y, int64_t out) {
  int64_t r = 0;
  for (; r + 4 <= a.rows; r += 4) tile<SCHEME, M, 4>(qs, d, m, row_bytes, nb, a, o, r, y, out);
  switch (a.rows - r) {
    case 3: tile<SCHEME, M, 3>(qs, d, m, row_bytes, nb, a, o, r, y, out); break;
    case 2: tile<SCHEME, M, 2>(qs, d, m, row_bytes, nb, a, o, r, y, out); break;
    case 1: tile<SCHEME, M, 1>(qs, d, m, row_bytes, nb, a, o, r, y, out); break;
    default: break;
  }
}

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
  Acts a = quantize_rows(xc.data_ptr<float>(), rows, in, (int)scheme);
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

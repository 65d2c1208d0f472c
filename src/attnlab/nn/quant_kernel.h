// The int8 block arithmetic shared by the quantized matmul (quant_kernel.cpp) and the fused decode
// step (fused_decode.cpp): activation rows quantized per 32-block, and a tile of M weight rows × N
// activation rows summed per block in int32 with AVX512-VNNI (vpdpbusd), scaled once per block.
//
// Shapes: x (R, I) fp32; W (O, I) as qs / d / m (nn/quant.py: Q8_0 qs int8 (O, I), Q4_0 / Q4_1 qs
// uint8 (O, I/2), d and m fp16 (O, NB)); y (R, O) fp32; NB = I / 32 (even: two Q8_0 blocks per vector).
// The algebra per scheme is in quant_kernel.cpp's header comment. Q8_0 takes two blocks (64 bytes) per
// vector; Q4 takes four (64 bytes of nibbles: low nibbles against the activations' elements 0..15,
// high against 16..31, both summed into one int32 lane group per block), so a 512-bit vector of Q4
// weights costs one load, three bit operations and two vpdpbusd, and one int→float scaling per 4
// blocks: on Zen 4, whose 512-bit operations run at half rate, the operation count is what bounds it.
// Source: ggml-cpu quants.c ggml_vec_dot_q8_0_q8_0 / q4_0_q8_0 / q4_1_q8_1 (same block algebra).
#pragma once

#include <ATen/ATen.h>
#include "simd_compat.h"
#include <cstdint>
#include <vector>

namespace attnlab_q8 {

constexpr int QK = 32;
constexpr int MR = 4;  // weight rows per tile

enum Scheme { Q8_0 = 0, Q4_0 = 1, Q4_1 = 2 };

struct Acts {
  int64_t rows, nb, ng;       // ng = ceil(NB / 4): Q4's groups of 4 blocks
  std::vector<uint8_t> q;     // Q8_0: (R, I) int8 + 128 in element order
  std::vector<float> dvec;    // Q8_0: (R, NB/2, 16): dx of block 2p in lanes 0..7, of 2p+1 in 8..15
  std::vector<int8_t> q4;     // Q4: (R, G, 128): per group of 4 blocks, elements 0..15 of each block (64
                              // bytes, block k at 16k, as a Q4 block's low nibbles), then elements 16..31
  std::vector<float> dx4;     // Q4: (R, G, 16): dx of block 4g + k in lanes 4k..4k+3
  std::vector<int32_t> corr4; // Q4_0: (R, G, 16): −8 S_b of block 4g + k in lane 4k, else 0
  std::vector<float> cb;      // Q4_1: (R, NB): dx_b S_b
  std::vector<int8_t> xs;     // the tiled layout's form (quant_tiles.h), any scheme: (R, I) signed qx
  std::vector<float> dxb;     //   (R, NB) dx of each block
  std::vector<int32_t> sb;    //   (R, NB) S_b = Σ_i qx_i of each block
};

// Quantize `rows` rows of x (R, I) into `a` (its vectors reused: no allocation once they are large
// enough). row_form (the row layout's tiles, below): scheme Q8_0 fills q (qx + 128, u8) and dvec,
// Q4_0 / Q4_1 the Q4 group layout; tile_form: xs / dxb / sb (the tiled layout's, quant_tiles.h). Both
// forms hold the same qx and dx.
inline void quantize_rows(Acts& a, const float* x, int64_t rows, int64_t in, int scheme, bool row_form = true,
                          bool tile_form = false) {
  a.rows = rows;
  a.nb = in / QK;
  a.ng = (a.nb + 3) / 4;
  const int64_t np = a.nb / 2, ng = a.ng;
  if (tile_form) {
    a.xs.resize(rows * in);
    a.dxb.resize(rows * a.nb);
    a.sb.resize(rows * a.nb);
  }
  if (!row_form) {
  } else if (scheme == Q8_0) {
    a.q.resize(rows * in);
    a.dvec.resize(rows * np * 16);
  } else {
    a.q4.assign(rows * ng * 128, 0);
    a.dx4.assign(rows * ng * 16, 0.0f);
    a.corr4.assign(rows * ng * 16, 0);
    a.cb.resize(rows * a.nb);
  }
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
      if (tile_form) {
        _mm_storeu_si128((__m128i*)(a.xs.data() + r * in + b * QK), b0);
        _mm_storeu_si128((__m128i*)(a.xs.data() + r * in + b * QK + 16), b1);
        a.dxb[r * a.nb + b] = d;
        a.sb[r * a.nb + b] = s;
      }
      if (!row_form) continue;
      if (scheme == Q8_0) {
        uint8_t* qb = a.q.data() + r * in + b * QK;
        _mm_storeu_si128((__m128i*)qb, _mm_xor_si128(b0, _mm_set1_epi8((char)0x80)));
        _mm_storeu_si128((__m128i*)(qb + 16), _mm_xor_si128(b1, _mm_set1_epi8((char)0x80)));
        const int64_t p = b / 2, half = b % 2;
        for (int k = 0; k < 8; ++k) a.dvec[(r * np + p) * 16 + half * 8 + k] = d;
        continue;
      }
      const int64_t g = b / 4, k = b % 4, at = r * ng + g;
      _mm_storeu_si128((__m128i*)(a.q4.data() + at * 128 + 16 * k), b0);
      _mm_storeu_si128((__m128i*)(a.q4.data() + at * 128 + 64 + 16 * k), b1);
      for (int l = 0; l < 4; ++l) a.dx4[at * 16 + 4 * k + l] = d;
      a.corr4[at * 16 + 4 * k] = -8 * s;
      a.cb[r * a.nb + b] = d * (float)s;
    }
  }
}

// 16 fp16 scales from p (fewer at the end of a row: `left`, the rest 0) -> 16 floats
inline __m512 scales16(const at::Half* p, int64_t left) {
  const __mmask16 k = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, (const void*)p));
}

// lanes 0..7 = element 2q, lanes 8..15 = element 2q + 1 of a scales16 vector: the scales of block pair q
inline __m512i pair_index(int64_t q) {
  const __m512i base = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_add_epi32(base, _mm512_set1_epi32((int)(2 * q)));
}

// lanes 4k..4k+3 = element 4q + k of a scales16 vector: the scales of the blocks of Q4 group q (of 4)
inline __m512i quad_index(int64_t q) {
  const __m512i base = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return _mm512_add_epi32(base, _mm512_set1_epi32((int)(4 * q)));
}

// Q8_0: y[r][o + i] for M weight rows from o and N x rows from r0; two blocks (64 bytes) per vector.
template <int M, int N>
inline void tile_q8(const uint8_t* qs, const at::Half* d, int64_t row_bytes, int64_t nb, const Acts& a, int64_t o,
                    int64_t r0, float* y, int64_t out) {
  const int64_t np = nb / 2, in = nb * QK;
  __m512 acc[M][N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) acc[i][j] = _mm512_setzero_ps();
  const __m512i c128 = _mm512_set1_epi8((char)0x80);
  __m512 d16[M];  // the scales of 16 blocks (8 pairs) of each row, converted once
  for (int64_t p = 0; p < np; ++p) {
    __m512i w[M], init[M];
    __m512 dw[M];
    if (p % 8 == 0)
      for (int i = 0; i < M; ++i) d16[i] = scales16(d + (o + i) * nb + 2 * p, nb - 2 * p);
    const __m512i pair = pair_index(p % 8);
    for (int i = 0; i < M; ++i) {
      w[i] = _mm512_loadu_si512(qs + (o + i) * row_bytes + p * 64);
      init[i] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, w[i]));
      dw[i] = _mm512_permutexvar_ps(pair, d16[i]);
    }
    for (int j = 0; j < N; ++j) {
      const int64_t r = r0 + j;
      const __m512i xv = _mm512_loadu_si512(a.q.data() + r * in + p * 64);
      const __m512 dx = _mm512_loadu_ps(a.dvec.data() + (r * np + p) * 16);
      for (int i = 0; i < M; ++i) {
        const __m512i sum = _mm512_dpbusd_epi32(init[i], xv, w[i]);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw[i], dx), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) y[(r0 + j) * out + o + i] = _mm512_reduce_add_ps(acc[i][j]);
}

// Q4_0 / Q4_1: groups of 4 blocks (64 bytes of qs) per vector: the low nibbles against elements 0..15
// and the high against 16..31 (Acts' Q4 layout), both into one int32 sum per block (4 lanes each),
// scaled once per 4 blocks; Q4_1's Σ_b m_b dx_b S_b as one dot over the row's blocks.
template <int SCHEME, int M, int N>
inline void tile_q4(const uint8_t* qs, const at::Half* d, const at::Half* m, int64_t row_bytes, int64_t nb,
                    const Acts& a, int64_t o, int64_t r0, float* y, int64_t out) {
  const int64_t ng = (nb + 3) / 4;
  __m512 acc[M][N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) acc[i][j] = _mm512_setzero_ps();
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 d16[M];  // the scales of 16 blocks (4 groups) of each row, converted once
  for (int64_t g = 0; g < ng; ++g) {
    const int64_t left = nb - 4 * g;  // blocks in this group: 4, fewer at the end of a row
    const __mmask64 bytes = left >= 4 ? ~0ULL : (1ULL << (16 * left)) - 1;
    if (g % 4 == 0)
      for (int i = 0; i < M; ++i) d16[i] = scales16(d + (o + i) * nb + 4 * g, left);
    const __m512i quad = quad_index(g % 4);
    __m512i lo[M], hi[M];
    __m512 dw[M];
    for (int i = 0; i < M; ++i) {
      const __m512i v = _mm512_maskz_loadu_epi8(bytes, qs + (o + i) * row_bytes + 64 * g);
      lo[i] = _mm512_and_si512(v, nibble);
      hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
      dw[i] = _mm512_permutexvar_ps(quad, d16[i]);
    }
    for (int j = 0; j < N; ++j) {
      const int64_t at = (r0 + j) * ng + g;
      const __m512i xl = _mm512_loadu_si512(a.q4.data() + at * 128), xh = _mm512_loadu_si512(a.q4.data() + at * 128 + 64);
      const __m512 dx = _mm512_loadu_ps(a.dx4.data() + at * 16);
      const __m512i init = SCHEME == Q4_0 ? _mm512_loadu_si512(a.corr4.data() + at * 16) : _mm512_setzero_si512();
      for (int i = 0; i < M; ++i) {
        const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(init, lo[i], xl), hi[i], xh);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw[i], dx), acc[i][j]);
      }
    }
  }
  if (SCHEME == Q4_1)
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        __m512 mins = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b += 16) {
          const __mmask16 k = nb - b >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nb - b)) - 1);
          mins = _mm512_fmadd_ps(scales16(m + (o + i) * nb + b, nb - b),
                                 _mm512_maskz_loadu_ps(k, a.cb.data() + (r0 + j) * nb + b), mins);
        }
        acc[i][j] = _mm512_add_ps(acc[i][j], mins);
      }
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) y[(r0 + j) * out + o + i] = _mm512_reduce_add_ps(acc[i][j]);
}

template <int SCHEME, int M, int N>
inline void tile(const uint8_t* qs, const at::Half* d, const at::Half* m, int64_t row_bytes, int64_t nb,
                 const Acts& a, int64_t o, int64_t r0, float* y, int64_t out) {
  if (SCHEME == Q8_0) tile_q8<M, N>(qs, d, row_bytes, nb, a, o, r0, y, out);
  else tile_q4<SCHEME, M, N>(qs, d, m, row_bytes, nb, a, o, r0, y, out);
}

template <int SCHEME, int M>
inline void rows_tile(const uint8_t* qs, const at::Half* d, const at::Half* m, int64_t row_bytes, int64_t nb,
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

}  // namespace attnlab_q8

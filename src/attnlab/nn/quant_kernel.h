// The int8 block arithmetic shared by the quantized matmul (quant_kernel.cpp) and the fused decode
// step (fused_decode.cpp): activation rows quantized per 32-block, and a tile of M weight rows × N
// activation rows summed per block in int32 with AVX512-VNNI (vpdpbusd), scaled once per block.
//
// Shapes: x (R, I) fp32; W (O, I) as qs / d / m (nn/quant.py: Q8_0 qs int8 (O, I), Q4_0 / Q4_1 qs
// uint8 (O, I/2), d and m fp16 (O, NB)); y (R, O) fp32; NB = I / 32 (even: two blocks per vector).
// The algebra per scheme is in quant_kernel.cpp's header comment.
// Source: ggml-cpu quants.c ggml_vec_dot_q8_0_q8_0 / q4_0_q8_0 / q4_1_q8_1 (same block algebra).
#pragma once

#include <ATen/ATen.h>
#include <immintrin.h>
#include <cstdint>
#include <vector>

namespace attnlab_q8 {

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

// Quantize `rows` rows of x (R, I) into `a` (its vectors reused: no allocation once they are large
// enough). scheme Q8_0 stores qx + 128 (u8), Q4_0 / Q4_1 qx (s8) and the block sums.
inline void quantize_rows(Acts& a, const float* x, int64_t rows, int64_t in, int scheme) {
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
inline void tile(const uint8_t* qs, const at::Half* d, const at::Half* m, int64_t row_bytes, int64_t nb,
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

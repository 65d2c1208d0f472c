// The 16-row tile of the quantized products (issue 23): 16 weight rows × one 32-block are read in place
// and transposed in registers, so that each of a vector's 16 int32 lanes is the block sum of one
// OUTPUT row; an activation row's 4-byte groups are broadcast into vpdpbusd. Per activation row and
// block: 8 vpdpbusd, one int→float conversion, one multiply and one FMA for 16 outputs, and one
// vector store at the end (the 4-row tile of quant_kernel.h, kept for the last O % 16 rows, pays the
// conversion and scaling per (weight row, activation row) and a horizontal sum per output).
//
// Shapes: as quant_kernel.h; dT (O / 16, NB, 16) fp16: the scales d of the tile's 16 rows per block
// (transposed once when the weight is prepared, decode_matvec.h make_linear), mT the same for Q4_1's m.
// Activations: Acts' xs (R, I) signed int8, dxb (R, NB), sb (R, NB) (S_b = Σ_i qx_i). The weights are
// made unsigned for vpdpbusd (u8 × s8), with a per-block correction:
//   Q8_0  (qw XOR 0x80) = qw + 128:  Σ (qw + 128) qx − 128 S_b
//   Q4_0  q in 0..15:                 Σ q qx − 8 S_b
//   Q4_1  q in 0..15:                 dw dx Σ q qx + m dx S_b
// Each output's sum runs over the blocks in order, whatever the number of activation rows N, so a row
// of a batch gets the bits it gets alone. Source: docs of issue 23 (the prototype microbenchmark).
#pragma once

#include <ATen/ATen.h>
#include <immintrin.h>
#include <cstdint>

#include "quant_kernel.h"

namespace attnlab_q8 {

constexpr int TR = 16;  // weight rows per transposed tile

// rows r0 (low 256 bits) and r1 (high) of a Q8_0 block: 32 bytes each
inline __m512i load_q8_rows(const uint8_t* p, int64_t row_bytes, int r0, int r1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(p + r0 * row_bytes))),
                            _mm256_loadu_si256((const __m256i*)(p + r1 * row_bytes)), 1);
}

// Q8_0 block at p (row 0 of the tile): v[k] = dword k (elements 4k..4k+3) of the 16 rows, row i in lane
// i, made unsigned (XOR 0x80); 24 shuffles
inline void transpose_q8(const uint8_t* p, int64_t row_bytes, __m512i v[8]) {
  __m512i z[8], t[8], u[8];
  for (int r = 0; r < 4; ++r)
    z[r] = load_q8_rows(p, row_bytes, r, r + 4), z[4 + r] = load_q8_rows(p, row_bytes, 8 + r, 12 + r);
  for (int h = 0; h < 2; ++h) {  // rows 0..7, then 8..15
    __m512i* zh = z + 4 * h;
    t[4 * h + 0] = _mm512_unpacklo_epi32(zh[0], zh[1]), t[4 * h + 1] = _mm512_unpackhi_epi32(zh[0], zh[1]);
    t[4 * h + 2] = _mm512_unpacklo_epi32(zh[2], zh[3]), t[4 * h + 3] = _mm512_unpackhi_epi32(zh[2], zh[3]);
    u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);
    u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);
    u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
  }
  // u[a] (and u[4 + a] for rows 8..15): 128-bit lanes = dword a of rows 0-3, dword 4+a of rows 0-3,
  // dword a of rows 4-7, dword 4+a of rows 4-7
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  for (int a = 0; a < 4; ++a) {
    v[a] = _mm512_xor_si512(flip, _mm512_shuffle_i32x4(u[a], u[4 + a], 0x88));
    v[4 + a] = _mm512_xor_si512(flip, _mm512_shuffle_i32x4(u[a], u[4 + a], 0xDD));
  }
}

// Q4 block at p (row 0 of the tile, 16 bytes a row): lo[k] / hi[k] = elements 4k..4k+3 / 16+4k..16+4k+3
// of the 16 rows (0..15 each), row i in lane i; 8 shuffles
inline void transpose_q4(const uint8_t* p, int64_t row_bytes, __m512i lo[4], __m512i hi[4]) {
  __m512i z[4];
  for (int q = 0; q < 4; ++q) {  // 128-bit lane L = row 4L + q
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)(p + q * row_bytes)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i*)(p + (q + 4) * row_bytes)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i*)(p + (q + 8) * row_bytes)), 2);
    z[q] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i*)(p + (q + 12) * row_bytes)), 3);
  }
  const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
  const __m512i v[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                        _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int k = 0; k < 4; ++k)
    lo[k] = _mm512_and_si512(v[k], nibble), hi[k] = _mm512_and_si512(_mm512_srli_epi16(v[k], 4), nibble);
}

// y[r][o .. o+16) for the 16 weight rows from o and N activation rows from r0; dT / mT: this tile's
// (NB, 16) scales
template <int SCHEME, int N>
inline void tile16(const uint8_t* base, int64_t row_stride, int64_t block_stride, const at::Half* dT,
                   const at::Half* mT, int64_t nb, const Acts& a, int64_t o, int64_t r0, float* y, int64_t out) {
  const int64_t in = nb * QK;
  __m512 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i w[8];  // Q8_0: dwords 0..7; Q4: lo 0..3, hi 0..3 (elements 0..15, then 16..31)
    if (SCHEME == Q8_0) transpose_q8(base + b * block_stride, row_stride, w);
    else transpose_q4(base + b * block_stride, row_stride, w, w + 4);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(dT + b * TR)));
    __m512 mw = _mm512_setzero_ps();
    if (SCHEME == Q4_1) mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(mT + b * TR)));
    for (int j = 0; j < N; ++j) {
      const int64_t r = r0 + j;
      const int32_t* xr = (const int32_t*)(a.xs.data() + r * in + b * QK);
      const int32_t s = a.sb[r * nb + b];
      const float dx = a.dxb[r * nb + b];
      __m512i sum = SCHEME == Q8_0 ? _mm512_set1_epi32(-128 * s)
                    : SCHEME == Q4_0 ? _mm512_set1_epi32(-8 * s) : _mm512_setzero_si512();
      for (int k = 0; k < 8; ++k) sum = _mm512_dpbusd_epi32(sum, w[k], _mm512_set1_epi32(xr[k]));
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[j]);
      if (SCHEME == Q4_1) acc[j] = _mm512_fmadd_ps(mw, _mm512_set1_ps(dx * (float)s), acc[j]);
    }
  }
  for (int j = 0; j < N; ++j) _mm512_storeu_ps(y + (r0 + j) * out + o, acc[j]);
}

// the 16 weight rows from o against all a.rows activation rows, 8 at a time
template <int SCHEME>
inline void rows_tile16(const uint8_t* qs, int64_t rs, int64_t bs, const at::Half* dT, const at::Half* mT, int64_t nb,
                        const Acts& a, int64_t o, float* y, int64_t out) {
  int64_t r = 0;
  for (; r + 8 <= a.rows; r += 8) tile16<SCHEME, 8>(qs, rs, bs, dT, mT, nb, a, o, r, y, out);
  switch (a.rows - r) {
    case 7: tile16<SCHEME, 7>(qs, rs, bs, dT, mT, nb, a, o, r, y, out); break;
    case 6: tile16<SCHEME, 6>(qs, rs, bs, dT, mT, nb, a, o, r, y, out); break;
    case 5: tile16<SCHEME, 5>(qs, rs, bs, dT, mT, nb, a, o, r, y, out); break;
    case 4: tile16<SCHEME, 4>(qs, rs, bs, dT, mT, nb, a, o, r, y, out); break;
    case 3: tile16<SCHEME, 3>(qs, rs, bs, dT, mT, nb, a, o, r, y, out); break;
    case 2: tile16<SCHEME, 2>(qs, rs, bs, dT, mT, nb, a, o, r, y, out); break;
    case 1: tile16<SCHEME, 1>(qs, rs, bs, dT, mT, nb, a, o, r, y, out); break;
    default: break;
  }
}

}  // namespace attnlab_q8

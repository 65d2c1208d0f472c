// The T-row tile of the quantized products (issue 23; T = 16 or 8): the weight is stored once, when it
// is prepared, in the kernel's tiled layout (nn/quant.py to_tiles: per tile and 32-block, K vectors of
// T·4 bytes, dword k of the block's T rows side by side; Q8_0 as q + 128 unsigned; scales (NB, T)), so
// one load gives a vector whose lane i belongs to OUTPUT row i and an activation row's 4-byte groups are
// broadcast into vpdpbusd. Per activation row and block: 8 vpdpbusd, one int→float
// conversion, one multiply and one FMA for T outputs, one store at the end: nothing per (weight row,
// activation row) pair but the products themselves (the 4-row tile of quant_kernel.h pays the
// conversion and scaling per pair and a horizontal sum per output; it keeps the last O % T rows and
// the weights in ggml's row layout).
//
// Shapes: as quant_kernel.h; w the tile's bytes (NB, K, T, 4), K = 8 (Q8_0) or 4 (Q4); dT / mT the
// tile's (NB, T) fp16 scales d and (Q4_1) m. Activations: Acts' xs (R, I) signed int8, dxb (R, NB),
// sb (R, NB) (S_b = Σ_i qx_i). The weights are unsigned for vpdpbusd (u8 × s8), with a per-block term:
//   Q8_0  (q + 128):   Σ (q + 128) qx − 128 S_b
//   Q4_0  q in 0..15:  Σ q qx − 8 S_b            (vector k: low nibbles = elements 4k..4k+3, high
//   Q4_1  q in 0..15:  dw dx Σ q qx + m dx S_b    nibbles = elements 16+4k..; against dwords k, 4+k)
// Each output's sum runs over the blocks in order, per lane, whatever the number of activation rows N
// and whatever T (8 lanes of 256 bits or 16 of 512 compute the same per lane): a row of a batch gets
// the bits it gets alone, and T changes speed only. The AVX2 build (no vpdpbusd) runs its 8-row tiles
// through tile_avx2: vpmaddubsw / vpmaddwd, the same int32 sums. Source: llama.cpp's repacked CPU weights
// (ggml-cpu repack.cpp, block_q4_0x8: the same idea of rows interleaved per block).
#pragma once

#include <ATen/ATen.h>
#include "simd_compat.h"
#include <algorithm>
#include <cstdint>

#include "decode_ops.h"  // Ahead
#include "quant_kernel.h"

namespace attnlab_q8 {

using attnlab_decode::Ahead;

template <int T>
struct Lanes;

template <>
struct Lanes<16> {  // 512-bit vectors
  using I = __m512i;
  using F = __m512;
  static I load(const uint8_t* p) { return _mm512_loadu_si512((const void*)p); }
  static I set1(int32_t v) { return _mm512_set1_epi32(v); }
  static I bytes(char v) { return _mm512_set1_epi8(v); }
  static I zero() { return _mm512_setzero_si512(); }
  static I band(I a, I b) { return _mm512_and_si512(a, b); }
  static I shr4(I a) { return _mm512_srli_epi16(a, 4); }
  static I dot(I acc, I u, I s) { return _mm512_dpbusd_epi32(acc, u, s); }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static F fzero() { return _mm512_setzero_ps(); }
  static F fset1(float v) { return _mm512_set1_ps(v); }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F halves(const at::Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
};

template <>
struct Lanes<8> {  // 256-bit vectors (AVX512-VL encodings of the same instructions)
  using I = __m256i;
  using F = __m256;
  static I load(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
  static I set1(int32_t v) { return _mm256_set1_epi32(v); }
  static I bytes(char v) { return _mm256_set1_epi8(v); }
  static I zero() { return _mm256_setzero_si256(); }
  static I band(I a, I b) { return _mm256_and_si256(a, b); }
  static I shr4(I a) { return _mm256_srli_epi16(a, 4); }
  static I dot(I acc, I u, I s) { return _mm256_dpbusd_epi32(acc, u, s); }
  static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  static F fzero() { return _mm256_setzero_ps(); }
  static F fset1(float v) { return _mm256_set1_ps(v); }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F halves(const at::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
};

// tile_t for the AVX2 build's 8-row tiles: the same int32 sums and float steps, in an order that keeps
// the pass in AVX2's 16 registers. The loop over a block's vectors k is outside the loop over the N
// activation rows, so one weight vector at a time is live (8 weight vectors and N accumulators, with
// Q8_0's signed copies, spilled: perf on Zen 3). Q4: the 8 vpmaddubsw of a row and block are added in
// int16 before one vpmaddwd (each int16 lane sums 16 products of a nibble ≤ 15 and |x| ≤ 127, at most
// 30480: exact), where each had its own vpmaddwd and int32 add. Q8_0: |q| · sign(x, q) per vector, as
// Lanes<8>::dot_signed (a pair of products reaches 32512: no room to add two in int16).
// The int32 sum of each (row, block) is the same integer, so every result is tile_t's, bit for bit.
template <int SCHEME, int N>
inline void tile_avx2(const uint8_t* w, const at::Half* dT, const at::Half* mT, int64_t nb, const Acts& a,
                      int64_t o, int64_t r0, float* y, int64_t ldy, const Ahead* ahead) {
  constexpr int T = 8, K = SCHEME == Q8_0 ? 8 : 4;
  constexpr int64_t STEP = K * T * 4;
  const int64_t in = nb * QK;
  const __m256i nibble = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
  __m256 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    if (ahead != nullptr) ahead->step(b);
    const uint8_t* p = w + b * STEP;
    const int32_t* xb = (const int32_t*)(a.xs.data() + r0 * in + b * QK);  // row j's dwords at xb + j·in/4
    __m256i sum[N];
    if constexpr (SCHEME == Q8_0) {
      for (int j = 0; j < N; ++j) sum[j] = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {
        const __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(p + k * T * 4)), flip);
        const __m256i aq = _mm256_abs_epi8(q);
        for (int j = 0; j < N; ++j) {
          const __m256i x = _mm256_sign_epi8(_mm256_set1_epi32(xb[j * in / 4 + k]), q);
          sum[j] = _mm256_add_epi32(sum[j], _mm256_madd_epi16(_mm256_maddubs_epi16(aq, x), ones));
        }
      }
    } else {  // the block's 8 nibble vectors stay in registers; each row's sum is one chain
      __m256i lo[4], hi[4];
      for (int k = 0; k < 4; ++k) {
        const __m256i q = _mm256_loadu_si256((const __m256i*)(p + k * T * 4));
        lo[k] = _mm256_and_si256(q, nibble), hi[k] = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
      }
      for (int j = 0; j < N; ++j) {
        const int32_t* xr = xb + j * in / 4;
        __m256i s16 = _mm256_maddubs_epi16(lo[0], _mm256_set1_epi32(xr[0]));
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[0], _mm256_set1_epi32(xr[4])));
        for (int k = 1; k < 4; ++k) {
          s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo[k], _mm256_set1_epi32(xr[k])));
          s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[k], _mm256_set1_epi32(xr[4 + k])));
        }
        sum[j] = _mm256_madd_epi16(s16, ones);
        if constexpr (SCHEME == Q4_0) sum[j] = _mm256_add_epi32(sum[j], _mm256_set1_epi32(-8 * a.sb[(r0 + j) * nb + b]));
      }
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(dT + b * T)));
    const __m256 mw = SCHEME == Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(mT + b * T))) : dw;
    for (int j = 0; j < N; ++j) {
      const int64_t r = r0 + j;
      const float dx = a.dxb[r * nb + b];
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[j]), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc[j]);
      if constexpr (SCHEME == Q4_1) acc[j] = _mm256_fmadd_ps(mw, _mm256_set1_ps(dx * (float)a.sb[r * nb + b]), acc[j]);
    }
  }
  for (int j = 0; j < N; ++j) _mm256_storeu_ps(y + (r0 + j) * ldy + o, acc[j]);
}

// y[r][o .. o+T) for the tile's T weight rows (bytes w, scales dT / mT) and N activation rows from r0
template <int SCHEME, int T, int N>
inline void tile_t(const uint8_t* w, const at::Half* dT, const at::Half* mT, int64_t nb, const Acts& a, int64_t o,
                   int64_t r0, float* y, int64_t ldy, const Ahead* ahead) {
  using L = Lanes<T>;
  constexpr int K = SCHEME == Q8_0 ? 8 : 4;
  constexpr int64_t STEP = K * T * 4;  // bytes of one block of the tile
  const int64_t in = nb * QK;
  typename L::F acc[N];  // in registers: every loop over the N rows is unrolled (a rolled loop kept acc on the stack)
#pragma GCC unroll 8
  for (int j = 0; j < N; ++j) acc[j] = L::fzero();
  const typename L::I nibble = L::bytes(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    if (ahead != nullptr) ahead->step(b);
    const uint8_t* p = w + b * STEP;
    typename L::I v[8];  // paired with the activation block's dwords 0..7
    if (SCHEME == Q8_0) {
      for (int k = 0; k < 8; ++k) v[k] = L::load(p + k * T * 4);
    } else {
      for (int k = 0; k < 4; ++k) {
        const typename L::I q = L::load(p + k * T * 4);
        v[k] = L::band(q, nibble), v[4 + k] = L::band(L::shr4(q), nibble);
      }
    }
    const typename L::F dw = L::halves(dT + b * T);
    const typename L::F mw = SCHEME == Q4_1 ? L::halves(mT + b * T) : L::fzero();
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) {
      const int64_t r = r0 + j;
      const int32_t* xr = (const int32_t*)(a.xs.data() + r * in + b * QK);
      const int32_t s = a.sb[r * nb + b];
      const float dx = a.dxb[r * nb + b];
      typename L::I sum = SCHEME == Q8_0 ? L::set1(-128 * s) : SCHEME == Q4_0 ? L::set1(-8 * s) : L::zero();
      // two dependency chains of 4 (int32 sums: the same result in any order), half the latency
      typename L::I odd = L::dot(L::zero(), v[1], L::set1(xr[1]));
      sum = L::dot(sum, v[0], L::set1(xr[0]));
      for (int k = 2; k < 8; k += 2) sum = L::dot(sum, v[k], L::set1(xr[k])), odd = L::dot(odd, v[k + 1], L::set1(xr[k + 1]));
      sum = L::add(sum, odd);
      acc[j] = L::fma(L::cvt(sum), L::mul(dw, L::fset1(dx)), acc[j]);
      if (SCHEME == Q4_1) acc[j] = L::fma(mw, L::fset1(dx * (float)s), acc[j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < N; ++j) L::store(y + (r0 + j) * ldy + o, acc[j]);
}

// one pass of N activation rows over a T-row tile: tile_avx2 for the AVX2 build's 8-row tiles, else tile_t
#if defined(__AVX512F__)
constexpr bool kAvx2Tiles = false;
#else
constexpr bool kAvx2Tiles = true;
#endif
template <int SCHEME, int T, int N>
inline void tile_pass(const uint8_t* w, const at::Half* dT, const at::Half* mT, int64_t nb, const Acts& a, int64_t o,
                      int64_t r0, float* y, int64_t ldy, const Ahead* ahead) {
  if constexpr (kAvx2Tiles && T == 8) tile_avx2<SCHEME, N>(w, dT, mT, nb, a, o, r0, y, ldy, ahead);
  else tile_t<SCHEME, T, N>(w, dT, mT, nb, a, o, r0, y, ldy, ahead);
}

// the tile's T weight rows from o against all a.rows activation rows, 8 at a time (`ahead`, if any,
// asked for during the first 8)
template <int SCHEME, int T>
inline void rows_tiled(const uint8_t* w, const at::Half* dT, const at::Half* mT, int64_t nb, const Acts& a,
                       int64_t o, float* y, int64_t ldy, const Ahead* ahead = nullptr) {
  int64_t r = 0;
  for (; r + 8 <= a.rows; r += 8) tile_pass<SCHEME, T, 8>(w, dT, mT, nb, a, o, r, y, ldy, r == 0 ? ahead : nullptr);
  const Ahead* rest = r == 0 ? ahead : nullptr;
  switch (a.rows - r) {
    case 7: tile_pass<SCHEME, T, 7>(w, dT, mT, nb, a, o, r, y, ldy, rest); break;
    case 6: tile_pass<SCHEME, T, 6>(w, dT, mT, nb, a, o, r, y, ldy, rest); break;
    case 5: tile_pass<SCHEME, T, 5>(w, dT, mT, nb, a, o, r, y, ldy, rest); break;
    case 4: tile_pass<SCHEME, T, 4>(w, dT, mT, nb, a, o, r, y, ldy, rest); break;
    case 3: tile_pass<SCHEME, T, 3>(w, dT, mT, nb, a, o, r, y, ldy, rest); break;
    case 2: tile_pass<SCHEME, T, 2>(w, dT, mT, nb, a, o, r, y, ldy, rest); break;
    case 1: tile_pass<SCHEME, T, 1>(w, dT, mT, nb, a, o, r, y, ldy, rest); break;
    default: break;
  }
}

// Block b of row `row` of a weight (O, I) of `scheme` in layout `tile` (0: ggml's rows), in ggml's
// byte order (Q8_0 q int8; Q4 nibble pairs): a pointer into qs, or into buf (32 bytes) when the row
// lies in a tile; *scale: the index of its d (and m) in the (O, NB) scale tensors.
inline const uint8_t* row_block(const uint8_t* qs, int scheme, int64_t out, int64_t nb, int64_t tile, int64_t row,
                                int64_t b, uint8_t* buf, int64_t* scale) {
  const int64_t bpb = scheme == Q8_0 ? QK : QK / 2, row_bytes = nb * bpb;
  if (tile == 0 || row >= out / tile * tile) {
    *scale = row * nb + b;
    return qs + row * row_bytes + b * bpb;
  }
  const int64_t t = row / tile, i = row % tile, k = bpb / 4;
  const int* p = (const int*)(qs + t * tile * row_bytes + b * k * tile * 4 + i * 4);  // dword 0; dword j at j·tile·4
  const int step = (int)tile * 4;
  if (scheme == Q8_0) {
    const __m256i v = _mm256_i32gather_epi32(p, _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                                   _mm256_set1_epi32(step)), 1);
    _mm256_storeu_si256((__m256i*)buf, _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)));
  } else {
    const __m128i v = _mm_i32gather_epi32(p, _mm_mullo_epi32(_mm_setr_epi32(0, 1, 2, 3), _mm_set1_epi32(step)), 1);
    _mm_storeu_si128((__m128i*)buf, v);
  }
  *scale = t * tile * nb + b * tile + i;
  return buf;
}

}  // namespace attnlab_q8

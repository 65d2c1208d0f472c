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
// the bits it gets alone, and T changes speed only. Source: llama.cpp's repacked CPU weights
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
  static I dot_nibbles(I acc, I u, I s) { return dot(acc, u, s); }  // Lanes<8>'s
  static constexpr bool kSigned = false;  // Lanes<8>'s
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
  // dot for weights below 16 (Q4's nibbles): in the AVX2 build, where vpdpbusd is 9 operations
  // (simd_compat.h), vpmaddubsw + vpmaddwd: a pair of products is at most 2 · 15 · 128 in magnitude,
  // so the int16 step is exact (no saturation) and the int32 sums are vpdpbusd's, bit for bit.
  static I dot_nibbles(I acc, I u, I s) {
#if defined(__AVX512F__)
    return dot(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
  }
  // Q8_0 in the AVX2 build (kSigned): the weight's q (stored q + 128: flip) and |q| (abs8) once per
  // block, then per activation row vpmaddubsw(|q|, sign(x, q)) + vpmaddwd, llama.cpp's AVX2 form:
  // |q| ≤ 128 and |x| ≤ 127 (activations are rounded to ±127), so a pair of products fits int16 and
  // Σ q x is exact, the same int32 as vpdpbusd's Σ (q + 128) x − 128 S_b.
#if defined(__AVX512F__)
  static constexpr bool kSigned = false;
#else
  static constexpr bool kSigned = true;
#endif
  static I flip(I v) { return _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)); }
  static I abs8(I q) { return _mm256_abs_epi8(q); }
  static I dot_signed(I acc, I abs_q, I q, I x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(abs_q, _mm256_sign_epi8(x, q)),
                                                   _mm256_set1_epi16(1)));
  }
  static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  static F fzero() { return _mm256_setzero_ps(); }
  static F fset1(float v) { return _mm256_set1_ps(v); }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F halves(const at::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
};

// y[r][o .. o+T) for the tile's T weight rows (bytes w, scales dT / mT) and N activation rows from r0
template <int SCHEME, int T, int N>
inline void tile_t(const uint8_t* w, const at::Half* dT, const at::Half* mT, int64_t nb, const Acts& a, int64_t o,
                   int64_t r0, float* y, int64_t ldy, const Ahead* ahead) {
  using L = Lanes<T>;
  constexpr int K = SCHEME == Q8_0 ? 8 : 4;
  constexpr bool signed_q8 = SCHEME == Q8_0 && L::kSigned;
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
    typename L::I q[8];  // signed (Q8_0, L::kSigned): the weights' q, and v their |q|
    if (SCHEME == Q8_0) {
      for (int k = 0; k < 8; ++k) v[k] = L::load(p + k * T * 4);
      if constexpr (signed_q8)
        for (int k = 0; k < 8; ++k) q[k] = L::flip(v[k]), v[k] = L::abs8(q[k]);
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
      typename L::I sum = signed_q8 ? L::zero() : SCHEME == Q8_0 ? L::set1(-128 * s)
                          : SCHEME == Q4_0 ? L::set1(-8 * s) : L::zero();
      // two dependency chains of 4 (int32 sums: the same result in any order), half the latency
      const auto dot = [&](typename L::I acc, int k) {
        if constexpr (signed_q8) return L::dot_signed(acc, v[k], q[k], L::set1(xr[k]));
        return SCHEME == Q8_0 ? L::dot(acc, v[k], L::set1(xr[k])) : L::dot_nibbles(acc, v[k], L::set1(xr[k]));
      };
      typename L::I odd = dot(L::zero(), 1);
      sum = dot(sum, 0);
      for (int k = 2; k < 8; k += 2) sum = dot(sum, k), odd = dot(odd, k + 1);
      sum = L::add(sum, odd);
      acc[j] = L::fma(L::cvt(sum), L::mul(dw, L::fset1(dx)), acc[j]);
      if (SCHEME == Q4_1) acc[j] = L::fma(mw, L::fset1(dx * (float)s), acc[j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < N; ++j) L::store(y + (r0 + j) * ldy + o, acc[j]);
}

// the tile's T weight rows from o against all a.rows activation rows, 8 at a time (`ahead`, if any,
// asked for during the first 8)
template <int SCHEME, int T>
inline void rows_tiled(const uint8_t* w, const at::Half* dT, const at::Half* mT, int64_t nb, const Acts& a,
                       int64_t o, float* y, int64_t ldy, const Ahead* ahead = nullptr) {
  int64_t r = 0;
  for (; r + 8 <= a.rows; r += 8) tile_t<SCHEME, T, 8>(w, dT, mT, nb, a, o, r, y, ldy, r == 0 ? ahead : nullptr);
  const Ahead* rest = r == 0 ? ahead : nullptr;
  switch (a.rows - r) {
    case 7: tile_t<SCHEME, T, 7>(w, dT, mT, nb, a, o, r, y, ldy, rest); break;
    case 6: tile_t<SCHEME, T, 6>(w, dT, mT, nb, a, o, r, y, ldy, rest); break;
    case 5: tile_t<SCHEME, T, 5>(w, dT, mT, nb, a, o, r, y, ldy, rest); break;
    case 4: tile_t<SCHEME, T, 4>(w, dT, mT, nb, a, o, r, y, ldy, rest); break;
    case 3: tile_t<SCHEME, T, 3>(w, dT, mT, nb, a, o, r, y, ldy, rest); break;
    case 2: tile_t<SCHEME, T, 2>(w, dT, mT, nb, a, o, r, y, ldy, rest); break;
    case 1: tile_t<SCHEME, T, 1>(w, dT, mT, nb, a, o, r, y, ldy, rest); break;
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

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
// W comes in ggml's row layout (read in tiles of 4 weight rows × up to 4 x rows; two 32-blocks fill one
// 512-bit vector) or in the kernel's T-row tiles made once when the weight is prepared (`tile`,
// nn/quant.py to_tiles; quant_tiles.h).
// The products are decode_matvec.h's (the fused step's own): rows of W split over at::parallel_for
// (torch's intra-op threads), prefetched per the machine's Tuning; linear_f32 is its fp32 form.
// Source: ggml-cpu quants.c ggml_vec_dot_q8_0_q8_0 / q4_0_q8_0 / q4_1_q8_1 (same block algebra).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include "simd_compat.h"
#include <cstdint>
#include <type_traits>

#include "decode_matvec.h"
#include "quant_kernel.h"

namespace {

using namespace attnlab_q8;

// y (R, O) = x (R, I) · Wᵀ through the decode products (decode_matvec.h), W given as `tensors`
at::Tensor product(const at::Tensor& x, int64_t kind, const std::vector<at::Tensor>& tensors, int64_t tile) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_cpu(), "x must be (R, I) float32 on the CPU");
  attnlab_decode::Group g;
  g.add(attnlab_decode::make_linear(kind, tensors, c10::nullopt, tile));
  TORCH_CHECK(x.size(1) == g.in, "x has ", x.size(1), " features, the weight ", g.in);
  at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty({x.size(0), g.out}, x.options());
  if (x.size(0) == 0) return y;
  Acts a8, a4;
  attnlab_decode::matvec(g, xc.data_ptr<float>(), x.size(0), y.data_ptr<float>(), a8, a4);
  return y;
}

at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d,
                        const c10::optional<at::Tensor>& m, int64_t scheme, int64_t tile) {
  TORCH_CHECK(scheme >= 0 && scheme <= 2, "scheme must be 0 (q8_0), 1 (q4_0) or 2 (q4_1)");
  TORCH_CHECK(scheme != Q4_1 || m.has_value(), "q4_1 needs m of d's shape");
  std::vector<at::Tensor> tensors{qs, d};
  if (scheme == Q4_1) tensors.push_back(*m);
  return product(x, scheme, tensors, tile);
}

at::Tensor linear_f32(const at::Tensor& x, const at::Tensor& w) { return product(x, attnlab_decode::F32, {w}, 0); }

// The per-machine Tuning (decode_matvec.h), as [parallel_bytes, prefetch_q, prefetch_f32, one_region,
// prefetch_l2, prefetch_spread, prefetch_kv, huge_pages] (nn/quant_kernel.py TUNING_FIELDS): set once by nn/cpu_tuning.py;
// speed only, never a result
void set_tuning(std::vector<int64_t> v) {
  auto flag = [](int64_t x) { return x == 0 || x == 1; };
  TORCH_CHECK(v.size() == 8 && v[0] > 0 && v[1] >= 0 && v[2] >= 0 && flag(v[3]) && flag(v[4]) && flag(v[5]) &&
                  v[6] >= 0 && v[6] <= 2 && flag(v[7]),
              "tuning: [parallel_bytes > 0, prefetch_q >= 0, prefetch_f32 >= 0, one_region 0/1, prefetch_l2 0/1, "
              "prefetch_spread 0/1, prefetch_kv 0/1/2, huge_pages 0/1]");
  attnlab_decode::tuning() = attnlab_decode::Tuning{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
}

std::vector<int64_t> get_tuning() {
  const attnlab_decode::Tuning& t = attnlab_decode::tuning();
  return {t.parallel_bytes, t.prefetch_q, t.prefetch_f32, t.one_region, t.prefetch_l2, t.prefetch_spread,
          t.prefetch_kv, t.huge_pages};
}

// 16 fp32 -> 16 bf16, round to nearest even (finite inputs), AVX512F only
inline __m256i to_bf16(__m512 v) {
  __m512i b = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  b = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(b, 16));
}

// One block's 32 weights in ggml's byte order (Q8_0: 32 int8 in v; Q4: 16 nibble pairs in the low
// half of v) -> 32 bf16 at dst: q · d, (q − 8) · d, q · d + m in fp32 (nn/quant.py's order), rounded.
template <typename Out>  // uint16_t: bf16 bits (rounded to nearest even), float: fp32
inline void block_to(int scheme, __m256i v, float d, float m, Out* dst) {
  const __m512 dv = _mm512_set1_ps(d);
  __m512 lo, hi;
  if (scheme == Q8_0) {
    lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(v))), dv);
    hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(v, 1))), dv);
  } else {
    const __m128i q = _mm256_castsi256_si128(v), nibble = _mm_set1_epi8(0x0F);
    lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, nibble)));
    hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), nibble)));
    if (scheme == Q4_0) {
      lo = _mm512_mul_ps(dv, _mm512_sub_ps(lo, _mm512_set1_ps(8.0f)));
      hi = _mm512_mul_ps(dv, _mm512_sub_ps(hi, _mm512_set1_ps(8.0f)));
    } else {
      const __m512 mv = _mm512_set1_ps(m);
      lo = _mm512_add_ps(_mm512_mul_ps(dv, lo), mv), hi = _mm512_add_ps(_mm512_mul_ps(dv, hi), mv);
    }
  }
  if constexpr (std::is_same_v<Out, float>) {
    _mm512_storeu_ps(dst, lo);
    _mm512_storeu_ps(dst + 16, hi);
  } else {
    _mm256_storeu_si256((__m256i*)dst, to_bf16(lo));
    _mm256_storeu_si256((__m256i*)(dst + 16), to_bf16(hi));
  }
}

// Rows 8g .. 8g + 7 of one block of a T-row tile (blk: the block's dwords (K, T), from lane 8g): each
// row's block bytes in ggml's order in r[i] (Q8_0: 8 dwords, still q + 128; Q4: 4 dwords in the low
// half), an 8 × 8 (Q4: 4 × 8) dword transpose in registers: loads of whole vectors, no gather.
inline void tile_rows8(const int* blk, int64_t tile, int scheme, __m256i r[8]) {
  const int k_dwords = scheme == Q8_0 ? 8 : 4;
  __m256i v[8], u[8];
  for (int k = 0; k < k_dwords; ++k) v[k] = _mm256_loadu_si256((const __m256i*)(blk + k * tile));
  for (int h = 0; h < k_dwords; h += 4) {  // dwords h .. h+3 of rows (0|4), (1|5), (2|6), (3|7) per 128-bit half
    const __m256i t0 = _mm256_unpacklo_epi32(v[h], v[h + 1]), t1 = _mm256_unpackhi_epi32(v[h], v[h + 1]);
    const __m256i t2 = _mm256_unpacklo_epi32(v[h + 2], v[h + 3]), t3 = _mm256_unpackhi_epi32(v[h + 2], v[h + 3]);
    u[h] = _mm256_unpacklo_epi64(t0, t2), u[h + 1] = _mm256_unpackhi_epi64(t0, t2);
    u[h + 2] = _mm256_unpacklo_epi64(t1, t3), u[h + 3] = _mm256_unpackhi_epi64(t1, t3);
  }
  for (int i = 0; i < 4; ++i) {
    if (k_dwords == 8) {
      r[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20), r[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
    } else {
      r[i] = _mm256_castsi128_si256(_mm256_castsi256_si128(u[i]));
      r[i + 4] = _mm256_castsi128_si256(_mm256_extracti128_si256(u[i], 1));
    }
  }
}

// W (O, I) dequantized (q · d, (q − 8) · d, q · d + m in fp32), as bf16 (rounded) or fp32 (Out), for
// products with many rows (prefill), which a GEMM does faster (bf16: oneDNN, AMX where present, on
// CPUs with native bf16 products; fp32 elsewhere: nn/quant_kernel.py); W in either layout (`tile`),
// the result in rows. Work units: whole T-row tiles (each block's rows
// 8 at a time, tile_rows8), then the O % T rest rows (all rows when tile == 0) one by one.
template <typename Out>
at::Tensor dequantize_to(const at::Tensor& qs, const at::Tensor& d, const c10::optional<at::Tensor>& m,
                         int64_t scheme, int64_t tile) {
  attnlab_decode::check_tile(scheme, tile);
  TORCH_CHECK(d.dim() == 2 && d.scalar_type() == at::kHalf && d.is_contiguous(), "d must be (O, NB) float16");
  const int64_t out = d.size(0), nb = d.size(1), in = nb * QK;
  TORCH_CHECK(qs.is_contiguous() && qs.numel() == out * (scheme == Q8_0 ? in : in / 2), "qs does not match d");
  TORCH_CHECK(scheme != Q4_1 || (m.has_value() && m->is_contiguous() && m->sizes() == d.sizes()),
              "q4_1 needs m of d's shape");
  at::Tensor w = at::empty({out, in}, d.options().dtype(std::is_same_v<Out, float> ? at::kFloat : at::kBFloat16));
  const uint8_t* q = (const uint8_t*)qs.data_ptr();
  const at::Half* dp = d.data_ptr<at::Half>();
  const at::Half* mp = scheme == Q4_1 ? m->data_ptr<at::Half>() : nullptr;
  Out* wp = (Out*)w.data_ptr();
  const int64_t bpb = scheme == Q8_0 ? QK : QK / 2, row_bytes = nb * bpb;
  const int64_t tiles = tile > 0 ? out / tile : 0, first_rest = tiles * tile;  // tile 0: rows only
  const __m256i flip = _mm256_set1_epi8((char)0x80);  // tiles hold Q8_0's q + 128
  const int64_t units = tiles + (out - first_rest), grain = std::max<int64_t>(1, 16 / std::max<int64_t>(tile, 1));
  at::parallel_for(0, units, grain, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      if (u < tiles) {  // tile u: rows u·T .. u·T + T − 1
        const uint8_t* base = q + u * tile * row_bytes;
        const at::Half* dT = dp + u * tile * nb;
        const at::Half* mT = mp == nullptr ? nullptr : mp + u * tile * nb;
        for (int64_t b = 0; b < nb; ++b) {
          const int* blk = (const int*)(base + b * bpb * tile);
          for (int64_t g = 0; g < tile; g += 8) {
            __m256i r[8];
            tile_rows8(blk + g, tile, (int)scheme, r);
            for (int i = 0; i < 8; ++i) {
              const int64_t sc = b * tile + g + i;
              block_to((int)scheme, scheme == Q8_0 ? _mm256_xor_si256(r[i], flip) : r[i], (float)dT[sc],
                            mT == nullptr ? 0.0f : (float)mT[sc], wp + (u * tile + g + i) * in + b * QK);
            }
          }
        }
        continue;
      }
      const int64_t o = first_rest + (u - tiles);  // a rest row, ggml's rows
      for (int64_t b = 0; b < nb; ++b) {
        const __m256i v = scheme == Q8_0 ? _mm256_loadu_si256((const __m256i*)(q + o * row_bytes + b * bpb))
                                         : _mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)(q + o * row_bytes + b * bpb)));
        block_to((int)scheme, v, (float)dp[o * nb + b], mp == nullptr ? 0.0f : (float)mp[o * nb + b],
                      wp + o * in + b * QK);
      }
    }
  });
  return w;
}

at::Tensor dequantize_bf16(const at::Tensor& qs, const at::Tensor& d, const c10::optional<at::Tensor>& m,
                           int64_t scheme, int64_t tile) {
  return dequantize_to<uint16_t>(qs, d, m, scheme, tile);
}

at::Tensor dequantize_f32(const at::Tensor& qs, const at::Tensor& d, const c10::optional<at::Tensor>& m,
                          int64_t scheme, int64_t tile) {
  return dequantize_to<float>(qs, d, m, scheme, tile);
}

}  // namespace

TORCH_LIBRARY(attnlab_quant, lib) {
  lib.def("linear(Tensor x, Tensor qs, Tensor d, Tensor? m, int scheme, int tile) -> Tensor");
  lib.def("linear_f32(Tensor x, Tensor w) -> Tensor");
  lib.def("dequantize_bf16(Tensor qs, Tensor d, Tensor? m, int scheme, int tile) -> Tensor");
  lib.def("dequantize_f32(Tensor qs, Tensor d, Tensor? m, int scheme, int tile) -> Tensor");
  lib.def("set_tuning", &set_tuning);
  lib.def("get_tuning", &get_tuning);
}

TORCH_LIBRARY_IMPL(attnlab_quant, CPU, lib) {
  lib.impl("linear", &quant_linear);
  lib.impl("linear_f32", &linear_f32);
  lib.impl("dequantize_bf16", &dequantize_bf16);
  lib.impl("dequantize_f32", &dequantize_f32);
}

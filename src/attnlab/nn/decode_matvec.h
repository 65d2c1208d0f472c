// Matrix products of one decoding step (R new tokens, one per sequence): y = x Wᵀ + b for dense fp32
// and block-quantized (Q8_0, Q4_0, Q4_1) weights, several matrices of one input in one pass over
// the threads (q|k|v, gate|up), their outputs concatenated.
//
// Shapes: x (R, I) fp32; each part's W (O_p, I): fp32 (O_p, I) contiguous, or qs / d / m as in
// nn/quant.py; b (O_p,) fp32 or none; y (R, Σ O_p) fp32, part p's columns at its offset.
// fp32: each output is one dot product of I terms, 16 lanes of fp32 FMA then a horizontal sum (the
// order of the additions differs from F.linear's: results agree up to fp32 summation order); a tile
// of 4 weight rows × up to 4 x rows shares the loads.
// Quantized: x is quantized once per 32-block (quant_kernel.h), then each block's 32 int8 products
// are summed exactly in int32, as in torch.ops.attnlab_quant.linear (same tile code, same result).
// A quantized weight comes in one of two layouts (nn/quant.py QuantWeight.tile): ggml's rows, read in
// tiles of MR and 1 rows (quant_kernel.h), or the kernel's T-row tiles (T = 16 or 8, quant_tiles.h),
// the last O % T rows in tiles of MR and 1; each output row's arithmetic depends on the layout and its
// row only. fp32: tiles of MR rows.
// Rows are split over at::parallel_for in tiles; a product smaller than parallel_bytes per
// thread runs on the calling thread (waking a thread costs more than it saves). Before a tile, the
// weights of the tile about prefetch_bytes further on are prefetched (quantized: qs; fp32: w): on the
// Intel host of issue 17, 1.3-2× faster Q8_0 / Q4_1 decoding than the hardware prefetcher alone, no
// gain for fp32. These distances are a per-machine choice (Tuning, set from nn/cpu_tuning.py, never
// timed inside a call); they change speed only, never a result.
// Source: ggml-cpu ggml_vec_dot_f32 / ggml_vec_dot_q8_0_q8_0 (the same split of rows over threads).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include "simd_compat.h"
#include <algorithm>
#include <cstdint>
#include <vector>

#include "decode_team.h"
#include "lanes.h"  // f32_tile's vectors
#include "quant_kernel.h"
#include "quant_tiles.h"

namespace attnlab_decode {

using namespace attnlab_q8;

constexpr int F32 = 3;  // kinds 0..2 are the Scheme ids (q8_0, q4_0, q4_1)

struct Tuning {                     // how products are run here (speed only: every result is the same)
  int64_t parallel_bytes = 1 << 15;  // a thread's least share of a product's weight bytes
  int64_t prefetch_q = 3072;         // how far ahead (weight bytes) quantized tiles are prefetched; 0: none
  int64_t prefetch_f32 = 0;          // the same for fp32 tiles
  int64_t one_region = 1;            // 1: one parallel region per step (decode_team.h); 0: one per product
  int64_t prefetch_l2 = 0;           // 1: prefetch into L2 only (PREFETCHT1: more misses in flight), 0: into L1
  int64_t prefetch_spread = 0;       // 1: a 16/8-row tile asks for the next one's lines a few per block while it
                                     // runs (decode_ops.h Ahead); 0: all of them before it starts
  int64_t prefetch_kv = 1;           // attention's next kv head's cache rows: 0 not prefetched, 1 all before this
                                     // head's pass, 2 a few per key of it (fused_decode.cpp)
  int64_t huge_pages = 1;            // 1: the fused plan moves its weights onto 2 MiB pages (huge_pages.h), 0: not
};

inline Tuning& tuning() {  // one instance in the extension (an inline function's static)
  static Tuning t;
  return t;
}

struct Linear {  // one (O, I) weight and its bias; the tensors are held so the pointers stay valid
  int kind = F32;
  int64_t out = 0, in = 0, offset = 0;  // offset: first row of this part in its group's output
  int64_t tile = 0;                     // the quantized layout: 0 = ggml's rows, T = T-row tiles (nn/quant.py)
  at::Tensor w, qs, d, m, bias;
  const float* wp = nullptr;
  const uint8_t* qsp = nullptr;
  const at::Half* dp = nullptr;
  const at::Half* mp = nullptr;
  const float* bp = nullptr;

  int64_t bytes() const {
    return kind == F32 ? out * in * 4 : qs.numel() * qs.element_size() + (in / QK) * out * (kind == Q4_1 ? 4 : 2);
  }
};

inline at::Tensor checked_vector(const at::Tensor& t, int64_t n, const char* what) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == n && t.scalar_type() == at::kFloat && t.is_contiguous() && t.is_cpu(),
              what, " must be a contiguous (", n, ",) float32 CPU tensor");
  return t;
}

inline void check_tile(int64_t kind, int64_t tile) {
  TORCH_CHECK(tile == 0 || ((tile == 8 || tile == 16) && kind != F32),
              "tile must be 0 (rows), or 8 / 16 for a quantized weight (nn/quant.py TILES)");
}

// A weight (O, I) read in place: kind 0..2 = q8_0 / q4_0 / q4_1 with tensors [qs, d] or [qs, d, m]
// (nn/quant.py) in layout `tile`, kind 3 = fp32 with [w] (tile 0); bias (O,) fp32 or none.
inline Linear make_linear(int64_t kind, const std::vector<at::Tensor>& tensors, const c10::optional<at::Tensor>& bias,
                          int64_t tile) {
  check_tile(kind, tile);
  Linear l;
  l.kind = (int)kind;
  l.tile = tile;
  if (kind == F32) {
    TORCH_CHECK(tensors.size() == 1, "an fp32 weight is [w]");
    l.w = tensors[0];
    TORCH_CHECK(l.w.dim() == 2 && l.w.scalar_type() == at::kFloat && l.w.is_contiguous() && l.w.is_cpu(),
                "w must be a contiguous (O, I) float32 CPU tensor");
    l.out = l.w.size(0), l.in = l.w.size(1), l.wp = l.w.data_ptr<float>();
  } else {
    TORCH_CHECK(kind >= 0 && kind <= 2 && tensors.size() == (kind == Q4_1 ? 3u : 2u),
                "kind must be 0..3; a quantized weight is [qs, d] (q4_1: [qs, d, m])");
    l.qs = tensors[0], l.d = tensors[1];
    TORCH_CHECK(l.d.dim() == 2 && l.d.scalar_type() == at::kHalf && l.d.is_contiguous() && l.d.size(1) % 2 == 0 &&
                l.d.is_cpu(), "d must be a contiguous (O, NB) float16 CPU tensor with NB even");
    l.out = l.d.size(0), l.in = l.d.size(1) * QK;
    TORCH_CHECK(l.qs.is_contiguous() && l.qs.element_size() == 1 && l.qs.is_cpu() &&
                l.qs.numel() == l.out * (kind == Q8_0 ? l.in : l.in / 2), "qs does not match d");
    l.qsp = (const uint8_t*)l.qs.data_ptr(), l.dp = l.d.data_ptr<at::Half>();
    if (kind == Q4_1) {
      l.m = tensors[2];
      TORCH_CHECK(l.m.is_contiguous() && l.m.sizes() == l.d.sizes() && l.m.scalar_type() == at::kHalf,
                  "m must match d");
      l.mp = l.m.data_ptr<at::Half>();
    }
  }
  if (bias.has_value()) {
    l.bias = checked_vector(*bias, l.out, "bias");
    l.bp = l.bias.data_ptr<float>();
  }
  return l;
}

struct Tile {  // rows o .. o + rows − 1 of part `part`
  int part;
  int64_t o, rows;
  const char* w = nullptr;  // its weight bytes (qs, or fp32 rows), and how many
  int64_t bytes = 0;
  const char* scales = nullptr;  // its fp16 scales d and m (or none), and how many bytes of each
  const char* mins = nullptr;
  int64_t scale_bytes = 0;       // (both layouts keep a tile's bytes and its scales contiguous)
};

struct Group {  // parts of one input, outputs concatenated
  std::vector<Linear> parts;
  std::vector<Tile> tiles;
  int64_t in = 0, out = 0, bytes = 0;
  bool q8 = false, q4 = false;  // which activation quantizations the parts need, and in which forms:
  bool q8_rows = false, q8_tiles = false, q4_rows = false, q4_tiles = false;  // row layout's / tiles'

  void add(Linear l) {
    TORCH_CHECK(parts.empty() || l.in == in, "the parts of a group must share in_features");
    in = l.in;
    l.offset = out;
    out += l.out;
    const bool tiled = l.tile > 0 && l.out >= l.tile, rowwise = l.tile == 0 || l.out % l.tile != 0;
    q8 |= l.kind == Q8_0, q8_rows |= l.kind == Q8_0 && rowwise, q8_tiles |= l.kind == Q8_0 && tiled;
    const bool k4 = l.kind == Q4_0 || l.kind == Q4_1;
    q4 |= k4, q4_rows |= k4 && rowwise, q4_tiles |= k4 && tiled;
    const int p = (int)parts.size();
    const int64_t row_bytes = l.kind == F32 ? l.in * 4 : l.kind == Q8_0 ? l.in : l.in / 2;
    const char* base = l.kind == F32 ? (const char*)l.wp : (const char*)l.qsp;
    const int64_t nb = l.in / QK;
    for (int64_t o = 0; o < l.out;) {  // tiled layout: tiles of T rows, then (and in the row layout) MR and 1
      const int64_t rows = l.tile > 0 && o + l.tile <= l.out ? l.tile : o + MR <= l.out ? MR : 1;
      Tile t{p, o, rows, base + o * row_bytes, rows * row_bytes};
      if (l.kind != F32) {
        t.scales = (const char*)(l.dp + o * nb), t.scale_bytes = rows * nb * 2;
        if (l.kind == Q4_1) t.mins = (const char*)(l.mp + o * nb);
      }
      tiles.push_back(t);
      o += rows;
    }
    bytes += l.bytes();
    parts.push_back(std::move(l));
  }
};

// y[r][o .. o+M) = W[o .. o+M) x[r] for N rows r0 .. r0+N of x (ldx floats apart) and fp32 W (O, I)
// row-major; each output is the sum of one kLanes-lane accumulator (lanes.h: 16 with AVX512, 8 with
// AVX2) over k in order, then across its lanes: the same whatever M and N (so a row of a batch gets the
// bits it gets alone, and every form below the same bits); the last partial vector of a row masked.
// PREFETCH > 0: the weights that many bytes ahead are prefetched as the tile goes.
template <int M, int N, int64_t PREFETCH = 0>
inline void f32_tile(const float* w, int64_t in, const float* x, int64_t ldx, int64_t o, int64_t r0, float* y,
                     int64_t ldy) {
  using namespace attnlab_lanes;
  Vec acc[M][N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) acc[i][j] = zero();
  int64_t k = 0;
  for (; k + kLanes <= in; k += kLanes) {
    Vec wv[M];
    for (int i = 0; i < M; ++i) wv[i] = loadu(w + (o + i) * in + k);
    if constexpr (PREFETCH > 0)  // the weights PREFETCH bytes on, one request per 64-byte line
      if (k % 16 == 0)
        for (int i = 0; i < M; ++i) _mm_prefetch((const char*)(w + (o + i) * in + k) + PREFETCH, _MM_HINT_T0);
    for (int j = 0; j < N; ++j) {
      const Vec xv = loadu(x + (r0 + j) * ldx + k);
      for (int i = 0; i < M; ++i) acc[i][j] = fmadd(wv[i], xv, acc[i][j]);
    }
  }
  if (k < in) {
    const Mask mask = lanes(k, in);
    Vec wv[M];
    for (int i = 0; i < M; ++i) wv[i] = load(w + (o + i) * in + k, mask);
    for (int j = 0; j < N; ++j) {
      const Vec xv = load(x + (r0 + j) * ldx + k, mask);
      for (int i = 0; i < M; ++i) acc[i][j] = fmadd(wv[i], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) y[(r0 + j) * ldy + o + i] = hsum(acc[i][j]);
}

// M weight rows from o against all `rows` rows of x, kF32Rows at a time: 4 with AVX512's 32 registers,
// 3 with AVX2's 16 (a 4 × 3 tile's 12 accumulators and 4 weight vectors fill them; 4 × 4 spilled)
constexpr int kF32Rows = attnlab_lanes::kLanes == 16 ? 4 : 3;

// AVX2, 4 to 8 rows of x of at most kF32OneRowIn floats (their bytes stay in L1 beside the weights):
// one weight row at a time against all of them (f32_tile<1, R>), its weights prefetched kF32Prefetch
// bytes ahead, so each weight is read from memory once while the products of every row run. The
// 4 × 3 tiles read a tile's weights from memory in their first pass and from L1 in the others, and
// no memory was read while those ran. On AMD EPYC Zen 3 (bench/inference.py's batched fp32 decoding,
// README) B = 8 went from ~4x to ~5x B = 1's tokens/s; in a timing of the product alone on SmolLM2's
// shapes (2 threads, weights from memory, same bits): I = 576 (q|k|v, o, gate|up, the head), R = 4
// and 8, 1.26-1.55x; I = 1536 (down), R = 8, 0.87-0.93x (x no longer in L1: kept on the tiles); R = 16
// (two passes over x) 0.93-0.99x; without the prefetch 1.19-1.30x. The AVX512 build (32 registers,
// 4 × 4 tiles) keeps its tiles: not measured there.
constexpr int64_t kF32OneRowIn = 768;
constexpr int64_t kF32Prefetch = 2048;
constexpr bool kF32OneRow = attnlab_lanes::kLanes == 8;

inline bool f32_one_row(int64_t in, int64_t rows) {
  return kF32OneRow && rows >= 4 && rows <= 8 && in <= kF32OneRowIn;
}

template <int M>
inline void f32_rows(const float* w, int64_t in, const float* x, int64_t rows, int64_t o, float* y, int64_t ldy) {
  if (f32_one_row(in, rows)) {
    for (int i = 0; i < M; ++i) {
      switch (rows) {
        case 8: f32_tile<1, 8, kF32Prefetch>(w, in, x, in, o + i, 0, y, ldy); break;
        case 7: f32_tile<1, 7, kF32Prefetch>(w, in, x, in, o + i, 0, y, ldy); break;
        case 6: f32_tile<1, 6, kF32Prefetch>(w, in, x, in, o + i, 0, y, ldy); break;
        case 5: f32_tile<1, 5, kF32Prefetch>(w, in, x, in, o + i, 0, y, ldy); break;
        default: f32_tile<1, 4, kF32Prefetch>(w, in, x, in, o + i, 0, y, ldy); break;
      }
    }
    return;
  }
  int64_t r = 0;
  for (; r + kF32Rows <= rows; r += kF32Rows) f32_tile<M, kF32Rows>(w, in, x, in, o, r, y, ldy);
  switch (rows - r) {
    case 3: if constexpr (kF32Rows > 3) f32_tile<M, 3>(w, in, x, in, o, r, y, ldy); break;
    case 2: f32_tile<M, 2>(w, in, x, in, o, r, y, ldy); break;
    case 1: f32_tile<M, 1>(w, in, x, in, o, r, y, ldy); break;
    default: break;
  }
}

inline bool kernel_tile(const Linear& l, const Tile& t) { return l.kind != F32 && l.tile > 0 && t.rows == l.tile; }

template <int SCHEME>
inline void quant_rows(const Linear& l, const Acts& a, const Tile& t, float* y, int64_t ldy, const Ahead* ahead) {
  const int64_t nb = l.in / QK, row_bytes = SCHEME == Q8_0 ? l.in : l.in / 2;
  if (kernel_tile(l, t)) {
    const uint8_t* w = l.qsp + t.o * row_bytes;
    const at::Half* mT = l.mp == nullptr ? nullptr : l.mp + t.o * nb;
    if (l.tile == 16) rows_tiled<SCHEME, 16>(w, l.dp + t.o * nb, mT, nb, a, t.o, y, ldy, ahead);
    else rows_tiled<SCHEME, 8>(w, l.dp + t.o * nb, mT, nb, a, t.o, y, ldy, ahead);
  } else if (t.rows == MR) rows_tile<SCHEME, MR>(l.qsp, l.dp, l.mp, row_bytes, nb, a, t.o, y, ldy);
  else rows_tile<SCHEME, 1>(l.qsp, l.dp, l.mp, row_bytes, nb, a, t.o, y, ldy);
}

// Tiles a thread takes at least (a share of parallel_bytes of weights; fewer when each serves more rows).
inline int64_t product_grain(const Group& g, int64_t rows) {
  return std::max<int64_t>(1, (int64_t)g.tiles.size() * tuning().parallel_bytes / std::max<int64_t>(g.bytes, 1) /
                                  std::max<int64_t>(rows, 1));
}

// Quantize x (R, g.in) into a8 / a4 as the group's parts need (Q4_0 and Q4_1 read the same form).
inline void quantize_input(const Group& g, const float* x, int64_t rows, Acts& a8, Acts& a4) {
  if (g.q8) quantize_rows(a8, x, rows, g.in, Q8_0, g.q8_rows, g.q8_tiles);
  if (g.q4) quantize_rows(a4, x, rows, g.in, Q4_0, g.q4_rows, g.q4_tiles);
}

// Tiles t0 .. t1 of y (R, g.out) = [x W_p^T + b_p for each part p], x (R, g.in) and its int8 forms a8 / a4.
// Each output element is computed by one thread in an order that depends on neither R nor the threads.
inline void product_tiles(const Group& g, const float* x, const Acts& a8, const Acts& a4, int64_t rows, float* y,
                          int64_t t0, int64_t t1) {
  const Tuning& tune = tuning();
  for (int64_t i = t0; i < t1; ++i) {
    const Tile& t = g.tiles[i];
    const Linear& l = g.parts[t.part];
    const int64_t distance = l.kind == F32 ? tune.prefetch_f32 : tune.prefetch_q;
    Ahead spread;  // the tile ahead's lines, asked for while this tile runs (prefetch_spread)
    if (distance > 0) {
      const int64_t ahead = std::max<int64_t>(1, (distance + t.bytes / 2) / t.bytes);
      if (i + ahead < t1) {
        const Tile& next = g.tiles[i + ahead];
        if (tune.prefetch_spread && kernel_tile(l, t)) {
          spread = Ahead({{next.w, next.bytes}, {next.scales, next.scale_bytes}, {next.mins, next.scale_bytes}},
                         l.in / QK, tune.prefetch_l2);
        } else if (tune.prefetch_l2) {
          for (int64_t b = 0; b < next.bytes; b += 64) _mm_prefetch(next.w + b, _MM_HINT_T1);
        } else {
          for (int64_t b = 0; b < next.bytes; b += 64) _mm_prefetch(next.w + b, _MM_HINT_T0);
        }
        for (int64_t b = 0; spread.empty() && b < next.scale_bytes; b += 64) {
          _mm_prefetch(next.scales + b, _MM_HINT_T0);
          if (next.mins != nullptr) _mm_prefetch(next.mins + b, _MM_HINT_T0);
        }
      }
    }
    float* yp = y + l.offset;
    switch (l.kind) {
      case Q8_0: quant_rows<Q8_0>(l, a8, t, yp, g.out, spread.empty() ? nullptr : &spread); break;
      case Q4_0: quant_rows<Q4_0>(l, a4, t, yp, g.out, spread.empty() ? nullptr : &spread); break;
      case Q4_1: quant_rows<Q4_1>(l, a4, t, yp, g.out, spread.empty() ? nullptr : &spread); break;
      default:
        if (t.rows == MR) f32_rows<MR>(l.wp, l.in, x, rows, t.o, yp, g.out);
        else f32_rows<1>(l.wp, l.in, x, rows, t.o, yp, g.out);
    }
    if (l.bp != nullptr)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = t.o; o < t.o + t.rows; ++o) yp[r * g.out + o] += l.bp[o];
  }
}

// y (R, g.out) for x (R, g.in), the rows split over at::parallel_for (the standalone ops' form).
inline void matvec(const Group& g, const float* x, int64_t rows, float* y, Acts& a8, Acts& a4) {
  quantize_input(g, x, rows, a8, a4);
  at::parallel_for(0, (int64_t)g.tiles.size(), product_grain(g, rows),
                   [&](int64_t t0, int64_t t1) { product_tiles(g, x, a8, a4, rows, y, t0, t1); });
}

// This team member's share of y (R, g.out) for x (R, g.in): it quantizes x into its own a8 / a4 and
// computes its tiles (the step's form, decode_team.h); the caller syncs before y is read.
inline void matvec(const Group& g, const float* x, int64_t rows, float* y, Acts& a8, Acts& a4, const Team& team) {
  if (team.per_op) return matvec(g, x, rows, y, a8, a4);
  const auto [t0, t1] = team.share((int64_t)g.tiles.size(), product_grain(g, rows));
  if (t0 == t1) return;
  quantize_input(g, x, rows, a8, a4);
  product_tiles(g, x, a8, a4, rows, y, t0, t1);
}

}  // namespace attnlab_decode

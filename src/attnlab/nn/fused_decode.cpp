// One decoding step of a LLaMA-style decoder stack in one call: one new token for each of N sequences,
// every layer, the final norm and the output projection, with the model's own weights; each sequence
// has its own KV cache row, length and position (continuous batching: engines/fused.py).
//
// Shapes: N sequences, D model dim, H query heads, K kv heads, Dh head dim, F FFN hidden size,
// V vocabulary, S cache rows (slots), C cache capacity; x (N, D); q (H·Dh), k, v (K·Dh) per sequence;
// caches (S, K, C, Dh) per layer, fp32 or fp16 (every layer's the same: fp16 halves attention's memory
// traffic, as llama.cpp's default f16 cache; k and v are rounded to nearest when written), sequence n
// in row rows[n], written in place.
// Per layer and sequence (models/gpt.py, nn/blocks.py with Pre-LN; every op in fp32):
//   h = RMSNorm(x) · g_attn                    x / sqrt(mean(x²) + ε), then the gain (nn/norm.py)
//   [q | k | v] = W_qkv h (+ b)                decode_matvec.h: one pass over the threads
//   q, k = RoPE(q), RoPE(k) at the position    x·cos + rotate_half(x)·sin, pairs (i, i + Dh/2)
//   cache[row, :, slot] = k, v                 nn/kv_cache.py's layout: slot = length − start
//   o = softmax(q kᵀ / √Dh) v over the visible slots first..slot (GQA: head h reads kv head h/(H/K))
//   x = x + W_o o (+ b)
//   h = RMSNorm(x) · g_ffn;  [g | u] = W_gu h;  x = x + W_down (SiLU(g) ⊙ u)
// then logits (V,) = W_out (RMSNorm(x) · g_out). RMSNorm, RoPE, SiLU and the residual sums round as
// PyTorch's operations (decode_ops.h), the int8 products are QuantLinear's own code; the fp32
// products and attention add in another order, so results agree with the PyTorch path up to fp32
// summation order (and, quantized, bit for bit until attention over more than one position). Each
// sequence's result does not depend on the others in the batch nor on the threads: a batched step
// gives every sequence the bits its batch-1 step gives.
// Threads: one parallel region per step (decode_team.h): every thread carries the residual stream and
// the norms itself, and takes its share of each product's tiles (the N rows share each weight tile)
// and of attention's (sequence, head) pairs when the contexts are long; barriers between.
// Source: llama.cpp's llm_build_llama graph and ggml-cpu's ops (rms_norm, rope_neox, soft_max,
// swiglu) for the same algebra; Touvron et al. 2023 (LLaMA), Su et al. 2021 (RoPE).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/custom_class.h>
#include <torch/library.h>
#include "simd_compat.h"
#include <algorithm>
#include <cmath>
#include <vector>

#include "decode_attention.h"
#include "decode_matvec.h"
#include "decode_ops.h"
#include "huge_pages.h"

namespace attnlab_decode {
namespace {

constexpr int64_t kParallelAttention = 1 << 13;  // H · S · Dh from which attention is split over threads

struct Layer {
  at::Tensor attn_norm, ffn_norm;  // (D,) fp32 gains
  float attn_eps, ffn_eps;
  Group qkv, o, gate_up, down;
};

struct Scratch {  // one thread's own buffers: every thread carries the residual stream x itself
  std::vector<float> x, h;  // (N, D), (N, max(D, F))
  Acts a8, a4;              // int8 forms of the current product's input
};

}  // namespace

// The decoder stack's weights, read in place, and the step's scratch buffers (not re-entrant).
class DecodePlan : public torch::CustomClassHolder {
 public:
  DecodePlan(int64_t d_model, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim)
      : d_(d_model), h_(n_heads), k_(n_kv_heads), dh_(head_dim) {
    TORCH_CHECK(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 && head_dim % 2 == 0,
                "need n_heads divisible by n_kv_heads and an even head_dim");
  }

  // A weight (O, I): kind 0..2 = q8_0 / q4_0 / q4_1 with tensors [qs, d] or [qs, d, m] (nn/quant.py),
  // kind 3 = fp32 with [w]; bias (O,) fp32 or none; tile: the quantized layout (0 = rows, nn/quant.py).
  // Returns its id for add_layer / set_output. With Tuning::huge_pages its tensors' memory is moved onto
  // 2 MiB pages (huge_pages.h).
  int64_t add_linear(int64_t kind, std::vector<at::Tensor> tensors, c10::optional<at::Tensor> bias, int64_t tile) {
    linears_.push_back(make_linear(kind, tensors, bias, tile));
    if (tuning().huge_pages)
      for (const at::Tensor& t : tensors) collapse_huge_pages(t.data_ptr(), t.nbytes(), huge_);
    return (int64_t)linears_.size() - 1;
  }

  // Bytes of the 2 MiB regions add_linear moved onto huge pages (0 where the kernel could not).
  int64_t huge_page_bytes() const { return (int64_t)(huge_.size() * kHugePage); }

  void add_layer(at::Tensor attn_norm, double attn_eps, std::vector<int64_t> qkv, int64_t o, at::Tensor ffn_norm,
                 double ffn_eps, std::vector<int64_t> gate_up, int64_t down) {
    Layer l;
    l.attn_norm = checked_vector(attn_norm, d_, "attn_norm"), l.attn_eps = (float)attn_eps;
    l.ffn_norm = checked_vector(ffn_norm, d_, "ffn_norm"), l.ffn_eps = (float)ffn_eps;
    l.qkv = group(qkv), l.o = group({o}), l.gate_up = group(gate_up), l.down = group({down});
    TORCH_CHECK(l.qkv.in == d_ && l.qkv.out == (h_ + 2 * k_) * dh_, "q|k|v must map D to (H + 2K)·Dh");
    TORCH_CHECK(l.o.in == h_ * dh_ && l.o.out == d_, "o must map H·Dh to D");
    TORCH_CHECK(l.gate_up.in == d_ && l.down.out == d_ && l.gate_up.out == 2 * l.down.in,
                "gate|up must map D to 2F and down F to D");
    f_ = std::max(f_, l.down.in);
    layers_.push_back(std::move(l));
  }

  // The token embedding (V, D) (kind and tensors as add_linear), the final norm's gain, the output projection.
  void set_output(int64_t embedding, at::Tensor norm, double eps, int64_t lm_head) {
    TORCH_CHECK(embedding >= 0 && embedding < (int64_t)linears_.size() && linears_[embedding].in == d_,
                "embedding must be an added (V, D) weight");
    embed_ = linears_[embedding];
    norm_ = checked_vector(norm, d_, "norm"), norm_eps_ = (float)eps;
    head_ = group({lm_head});
    TORCH_CHECK(head_.in == d_, "lm_head must map D to V");
  }

  // Logits (N, V), or (1, V) of the last entry with last_only: entry n's token tokens[n] at RoPE row
  // positions[n] of cos / sin (P, Dh); writes its k, v at slot slots[n] of row rows[n] of every layer's
  // caches (S, K, C, Dh) and attends to that row's slots firsts[n] .. slots[n]. The (row, slot) pairs
  // must be distinct: entries of one row are consecutive tokens of one sequence (a prefill chunk),
  // each seeing the earlier ones (all k, v are written before attention).
  at::Tensor step(std::vector<int64_t> tokens, std::vector<int64_t> positions, std::vector<int64_t> rows,
                  std::vector<int64_t> slots, std::vector<int64_t> firsts, at::Tensor cos, at::Tensor sin,
                  std::vector<at::Tensor> k_caches, std::vector<at::Tensor> v_caches, bool last_only);

 private:
  Group group(const std::vector<int64_t>& ids) {
    Group g;
    for (int64_t id : ids) {
      TORCH_CHECK(id >= 0 && id < (int64_t)linears_.size(), "unknown linear id ", id);
      g.add(linears_[id]);
    }
    return g;
  }
  void embed(int64_t token, float* x) const;
  template <class KV>
  void attention(const float* qkv, const KV* kc, const KV* vc, int64_t cap, const std::vector<int64_t>& rows,
                 const std::vector<int64_t>& slots, const std::vector<int64_t>& firsts, float* out, const Team& team);
  template <class KV>
  void rope_and_cache(float* qkv, int64_t i0, int64_t i1, const float* cos, const float* sin,
                      const std::vector<int64_t>& positions, const std::vector<int64_t>& rows,
                      const std::vector<int64_t>& slots, KV* kc, KV* vc, int64_t cap) const;

  int64_t d_, h_, k_, dh_, f_ = 0;
  std::vector<Linear> linears_;
  std::vector<Layer> layers_;
  Linear embed_;
  at::Tensor norm_;
  float norm_eps_ = 1e-6f;
  Group head_;
  std::vector<Scratch> scratch_;                // one per thread
  std::vector<float> qkv_, att_, y_, gu_, p_;  // shared outputs, each part written by one thread
  std::set<uintptr_t> huge_;                    // the 2 MiB regions add_linear collapsed
};

// x (D) = row `token` of the embedding: dequantized as nn/quant.py's dequantize (q·d, (q−8)·d, q·d + m)
void DecodePlan::embed(int64_t token, float* x) const {
  const Linear& e = embed_;
  if (e.kind == F32) {
    std::copy(e.wp + token * d_, e.wp + (token + 1) * d_, x);
    return;
  }
  const int64_t nb = d_ / QK;
  uint8_t buf[QK];
  for (int64_t b = 0; b < nb; ++b) {
    int64_t sc;  // the block's bytes in ggml's order and its scales, in either layout (quant_tiles.h)
    const uint8_t* q = row_block(e.qsp, e.kind, e.out, nb, e.tile, token, b, buf, &sc);
    const float d = (float)e.dp[sc];
    float* xb = x + b * QK;
    if (e.kind == Q8_0) {
      for (int i = 0; i < QK; ++i) xb[i] = (float)(int8_t)q[i] * d;
      continue;
    }
    const float m = e.kind == Q4_1 ? (float)e.mp[sc] : 0.0f;
    for (int i = 0; i < QK / 2; ++i) {
      const int lo = q[i] & 0x0F, hi = q[i] >> 4;
      if (e.kind == Q4_0) xb[i] = d * (float)(lo - 8), xb[i + QK / 2] = d * (float)(hi - 8);
      else xb[i] = d * (float)lo + m, xb[i + QK / 2] = d * (float)hi + m;
    }
  }
}

// out (N, H·Dh): for each sequence n, its q (row n of qkv (N, (H + 2K)·Dh)) against slots
// firsts[n] .. slots[n] of cache row rows[n] of kc, vc (S, K, cap, Dh). Units: (sequence, head) pairs;
// this member's are a contiguous run of about 1/nth of the slots read (the sequences' lengths differ),
// the same split at every call with these lengths; within it, the heads of one kv head go through one
// pass over its k, v (decode_attention.h: each head's arithmetic its own), the next kv head's rows
// prefetched meanwhile.
template <class KV>
void DecodePlan::attention(const float* qkv, const KV* kc, const KV* vc, int64_t cap,
                           const std::vector<int64_t>& rows, const std::vector<int64_t>& slots,
                           const std::vector<int64_t>& firsts, float* out, const Team& team) {
  const int64_t group = h_ / k_, n = (int64_t)rows.size(), width = (h_ + 2 * k_) * dh_, units = n * h_;
  auto base = [&](int64_t u) { return ((rows[u / h_] * k_ + u % h_ / group) * cap + firsts[u / h_]) * dh_; };
  auto length = [&](int64_t u) { return slots[u / h_] - firsts[u / h_] + 1; };
  const int64_t kv_ahead = tuning().prefetch_kv;
  auto run = [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1;) {
      const int64_t i = u / h_, h = u % h_, end = std::min(u1, u - h % group + group);  // this kv head's heads
      Ahead next;  // the next kv head's rows, as Tuning::prefetch_kv says
      if (end < u1 && kv_ahead > 0) {
        const int64_t bytes = length(end) * dh_ * (int64_t)sizeof(KV);
        if (kv_ahead == 2) next = Ahead({{kc + base(end), bytes}, {vc + base(end), bytes}}, length(u), true);
        else prefetch_rows(kc + base(end), vc + base(end), length(end), dh_);
      }
      attend_group(qkv + i * width + h * dh_, end - u, kc + base(u), vc + base(u), length(u), dh_,
                   p_.data() + u * cap, cap, out + i * h_ * dh_ + h * dh_, next.empty() ? nullptr : &next);
      u = end;
    }
  };
  int64_t work = 0;
  for (int64_t i = 0; i < n; ++i) work += (slots[i] - firsts[i] + 1) * h_;
  const bool split = work * dh_ >= kParallelAttention;
  if (team.per_op) return at::parallel_for(0, units, split ? 1 : units, run);
  if (!split || team.nth == 1) {
    if (team.leader()) run(0, units);
    return;
  }
  // member t takes the units whose first slot (counted over all units) lies in [t·work/nth, (t+1)·work/nth)
  int64_t u0 = units, u1 = units, seen = 0;
  for (int64_t u = 0; u < units; ++u) {
    const int64_t owner = std::min<int64_t>(team.nth - 1, seen * team.nth / work);
    if (owner == team.tid && u0 == units) u0 = u;
    if (owner > team.tid) {
      u1 = u;
      break;
    }
    seen += length(u);
  }
  if (u0 < u1) run(u0, u1);
}

// q and k of entries i0 .. i1 − 1 rotated at their positions (cos, sin: (P, Dh)); their k, v written at
// their slots (an fp16 cache: each rounded to nearest even, as Tensor.half()). Each entry's own rows
// only: the members of a team take shares of the entries.
template <class KV>
void DecodePlan::rope_and_cache(float* qkv, int64_t i0, int64_t i1, const float* cos, const float* sin,
                                const std::vector<int64_t>& positions, const std::vector<int64_t>& rows,
                                const std::vector<int64_t>& slots, KV* kc, KV* vc, int64_t cap) const {
  const int64_t width = (h_ + 2 * k_) * dh_;
  for (int64_t i = i0; i < i1; ++i) {
    float *q = qkv + i * width, *k = q + h_ * dh_, *v = k + k_ * dh_;
    rope(q, h_, dh_, cos + positions[i] * dh_, sin + positions[i] * dh_);
    rope(k, k_, dh_, cos + positions[i] * dh_, sin + positions[i] * dh_);
    for (int64_t g = 0; g < k_; ++g) {
      const int64_t at_slot = ((rows[i] * k_ + g) * cap + slots[i]) * dh_;
      store_row(kc + at_slot, k + g * dh_, dh_);
      store_row(vc + at_slot, v + g * dh_, dh_);
    }
  }
}

at::Tensor DecodePlan::step(std::vector<int64_t> tokens, std::vector<int64_t> positions, std::vector<int64_t> rows,
                            std::vector<int64_t> slots, std::vector<int64_t> firsts, at::Tensor cos, at::Tensor sin,
                            std::vector<at::Tensor> k_caches, std::vector<at::Tensor> v_caches, bool last_only) {
  TORCH_CHECK(!layers_.empty() && norm_.defined(), "the plan has no layers or no output (set_output)");
  const int64_t n = (int64_t)tokens.size();
  TORCH_CHECK(n > 0 && positions.size() == tokens.size() && rows.size() == tokens.size() &&
              slots.size() == tokens.size() && firsts.size() == tokens.size(),
              "tokens, positions, rows, slots and firsts must be N > 0 values each");
  TORCH_CHECK(cos.dim() == 2 && cos.size(1) == dh_ && cos.sizes() == sin.sizes() && cos.is_contiguous() &&
              sin.is_contiguous() && cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "cos and sin must be contiguous (P, Dh) float32");
  TORCH_CHECK(k_caches.size() == layers_.size() && v_caches.size() == layers_.size(), "one k and v cache per layer");
  const int64_t n_rows = k_caches[0].size(0), cap = k_caches[0].size(2);
  const at::ScalarType cache_type = k_caches[0].scalar_type();
  TORCH_CHECK(cache_type == at::kFloat || cache_type == at::kHalf, "caches must be float32 or float16");
  for (size_t i = 0; i < layers_.size(); ++i)
    for (const at::Tensor& c : {k_caches[i], v_caches[i]})
      TORCH_CHECK(c.dim() == 4 && c.size(0) == n_rows && c.size(1) == k_ && c.size(2) == cap && c.size(3) == dh_ &&
                  c.scalar_type() == cache_type && c.is_contiguous() && c.is_cpu(),
                  "caches must be contiguous (S, K, C, Dh) CPU tensors of one shape and one dtype");
  const bool half = cache_type == at::kHalf;
  std::vector<std::pair<int64_t, int64_t>> places;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(tokens[i] >= 0 && tokens[i] < embed_.out, "token ", tokens[i], " is outside the vocabulary of ",
                embed_.out);
    TORCH_CHECK(positions[i] >= 0 && positions[i] < cos.size(0), "no RoPE row for position ", positions[i]);
    TORCH_CHECK(rows[i] >= 0 && rows[i] < n_rows, "row ", rows[i], " is not a cache row");
    TORCH_CHECK(0 <= firsts[i] && firsts[i] <= slots[i] && slots[i] < cap, "need 0 <= first <= slot < capacity");
    places.emplace_back(rows[i], slots[i]);
  }
  std::sort(places.begin(), places.end());
  TORCH_CHECK(std::adjacent_find(places.begin(), places.end()) == places.end(), "(row, slot) pairs must be distinct");
  const int64_t width = (h_ + 2 * k_) * dh_;
  scratch_.resize(std::max(1, at::get_num_threads()));
  for (Scratch& sc : scratch_) sc.x.resize(n * d_), sc.h.resize(n * std::max(d_, f_));
  qkv_.resize(n * width), att_.resize(n * h_ * dh_), y_.resize(n * d_), gu_.resize(n * 2 * f_), p_.resize(n * h_ * cap);
  const int64_t out_rows = last_only ? 1 : n, first_out = n - out_rows;
  at::Tensor logits = at::empty({out_rows, head_.out}, at::kFloat);
  const float *cs = cos.data_ptr<float>(), *sn = sin.data_ptr<float>();
  float *qkv = qkv_.data(), *att = att_.data(), *y = y_.data(), *gu = gu_.data();
  run_team([&](const Team& team) {
    Scratch& sc = scratch_[team.tid];
    const std::pair<int64_t, int64_t> entries = team.share(n, 1);  // rope_and_cache's
    float *x = sc.x.data(), *h = sc.h.data();
    for (int64_t i = 0; i < n; ++i) embed(tokens[i], x + i * d_);
    for (size_t li = 0; li < layers_.size(); ++li) {
      const Layer& l = layers_[li];
      for (int64_t i = 0; i < n; ++i) rmsnorm(x + i * d_, l.attn_norm.data_ptr<float>(), d_, l.attn_eps, h + i * d_);
      matvec(l.qkv, h, n, qkv, sc.a8, sc.a4, team);
      team.sync();
      auto rope_attend = [&](auto* kc, auto* vc) {  // the layer's caches as fp32 or fp16 (KV)
        rope_and_cache(qkv, entries.first, entries.second, cs, sn, positions, rows, slots, kc, vc, cap);
        team.sync();
        attention(qkv, kc, vc, cap, rows, slots, firsts, att, team);
      };
      if (half) rope_attend(k_caches[li].data_ptr<at::Half>(), v_caches[li].data_ptr<at::Half>());
      else rope_attend(k_caches[li].data_ptr<float>(), v_caches[li].data_ptr<float>());
      team.sync();
      matvec(l.o, att, n, y, sc.a8, sc.a4, team);
      team.sync();
      for (int64_t j = 0; j < n * d_; ++j) x[j] = x[j] + y[j];
      for (int64_t i = 0; i < n; ++i) rmsnorm(x + i * d_, l.ffn_norm.data_ptr<float>(), d_, l.ffn_eps, h + i * d_);
      matvec(l.gate_up, h, n, gu, sc.a8, sc.a4, team);
      team.sync();
      const int64_t f = l.down.in;
      for (int64_t i = 0; i < n; ++i) swiglu(gu + i * 2 * f, gu + i * 2 * f + f, f, h + i * f);
      matvec(l.down, h, n, y, sc.a8, sc.a4, team);
      team.sync();
      for (int64_t j = 0; j < n * d_; ++j) x[j] = x[j] + y[j];
    }
    for (int64_t i = 0; i < out_rows; ++i)
      rmsnorm(x + (first_out + i) * d_, norm_.data_ptr<float>(), d_, norm_eps_, h + i * d_);
    matvec(head_, h, out_rows, logits.data_ptr<float>(), sc.a8, sc.a4, team);
  }, tuning().one_region == 0);
  return logits;
}

}  // namespace attnlab_decode

// The weight kinds the plan knows, in the order q8_0, q4_0, q4_1, fp32: nn/quant_kernel.py's SCHEME_ID
// and nn/fused_decode.py's F32 must equal these (tests/nn/test_kernel_ids.py).
std::vector<int64_t> weight_kinds() {
  return {attnlab_q8::Q8_0, attnlab_q8::Q4_0, attnlab_q8::Q4_1, attnlab_decode::F32};
}

TORCH_LIBRARY(attnlab_decode, m) {
  m.def("weight_kinds", &weight_kinds);
  m.class_<attnlab_decode::DecodePlan>("DecodePlan")
      .def(torch::init<int64_t, int64_t, int64_t, int64_t>())
      .def("add_linear", &attnlab_decode::DecodePlan::add_linear)
      .def("add_layer", &attnlab_decode::DecodePlan::add_layer)
      .def("set_output", &attnlab_decode::DecodePlan::set_output)
      .def("huge_page_bytes", &attnlab_decode::DecodePlan::huge_page_bytes)
      .def("step", &attnlab_decode::DecodePlan::step);
}

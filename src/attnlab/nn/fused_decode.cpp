// One decoding step of a LLaMA-style decoder stack in one call: batch 1, one new token, every layer,
// the final norm and the output projection, with the model's own weights and KV cache tensors.
//
// Shapes: D model dim, H query heads, K kv heads, Dh head dim, F FFN hidden size, V vocabulary,
// L cache capacity; q (H·Dh), k, v (K·Dh); caches (1, K, L, Dh) fp32, written in place.
// Per layer (models/gpt.py, nn/blocks.py with Pre-LN; every op in fp32):
//   h = RMSNorm(x) · g_attn                    x / sqrt(mean(x²) + ε), then the gain (nn/norm.py)
//   [q | k | v] = W_qkv h (+ b)                decode_matvec.h: one pass over the threads
//   q, k = RoPE(q), RoPE(k) at the position    x·cos + rotate_half(x)·sin, pairs (i, i + Dh/2)
//   cache[slot] = k, v                         nn/kv_cache.py's layout: slot = length − start
//   o = softmax(q kᵀ / √Dh) v over the visible slots first..slot (GQA: head h reads kv head h/(H/K))
//   x = x + W_o o (+ b)
//   h = RMSNorm(x) · g_ffn;  [g | u] = W_gu h;  x = x + W_down (SiLU(g) ⊙ u)
// then logits (V,) = W_out (RMSNorm(x) · g_out). RMSNorm, RoPE, SiLU and the residual sums round as
// PyTorch's operations (decode_ops.h), the int8 products are QuantLinear's own code; the fp32
// products and attention add in another order, so results agree with the PyTorch path up to fp32
// summation order (and, quantized, bit for bit until attention over more than one position).
// Threads: at::parallel_for around each matrix product (and attention heads when the context is long).
// Source: llama.cpp's llm_build_llama graph and ggml-cpu's ops (rms_norm, rope_neox, soft_max,
// swiglu) for the same algebra; Touvron et al. 2023 (LLaMA), Su et al. 2021 (RoPE).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/custom_class.h>
#include <torch/library.h>
#include <immintrin.h>
#include <cmath>
#include <vector>

#include "decode_matvec.h"
#include "decode_ops.h"

namespace attnlab_decode {
namespace {

constexpr int64_t kParallelAttention = 1 << 13;  // H · S · Dh from which heads are split over threads

struct Layer {
  at::Tensor attn_norm, ffn_norm;  // (D,) fp32 gains
  float attn_eps, ffn_eps;
  Group qkv, o, gate_up, down;
};

at::Tensor checked_vector(const at::Tensor& t, int64_t n, const char* what) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == n && t.scalar_type() == at::kFloat && t.is_contiguous() && t.is_cpu(),
              what, " must be a contiguous (", n, ",) float32 CPU tensor");
  return t;
}

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
  // kind 3 = fp32 with [w]; bias (O,) fp32 or none. Returns its id for add_layer / set_output.
  int64_t add_linear(int64_t kind, std::vector<at::Tensor> tensors, c10::optional<at::Tensor> bias) {
    Linear l;
    l.kind = (int)kind;
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
      TORCH_CHECK(l.d.dim() == 2 && l.d.scalar_type() == at::kHalf && l.d.is_contiguous() && l.d.size(1) % 2 == 0,
                  "d must be a contiguous (O, NB) float16 tensor with NB even");
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
    linears_.push_back(std::move(l));
    return (int64_t)linears_.size() - 1;
  }

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

  // Logits (V,) of `token` at RoPE row `position` of cos / sin (P, Dh); writes its k, v at `slot`
  // of every layer's cache (1, K, L, Dh) and attends to slots first..slot.
  at::Tensor step(int64_t token, int64_t position, at::Tensor cos, at::Tensor sin, std::vector<at::Tensor> k_caches,
                  std::vector<at::Tensor> v_caches, int64_t slot, int64_t first);

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
  void attention(const float* q, const float* kc, const float* vc, int64_t cap, int64_t first, int64_t n, float* out);

  int64_t d_, h_, k_, dh_, f_ = 0;
  std::vector<Linear> linears_;
  std::vector<Layer> layers_;
  Linear embed_;
  at::Tensor norm_;
  float norm_eps_ = 1e-6f;
  Group head_;
  Acts a8_, a4_;
  std::vector<float> x_, h_buf_, qkv_, att_, gu_, p_;
};

// x (D) = row `token` of the embedding: dequantized as nn/quant.py's dequantize (q·d, (q−8)·d, q·d + m)
void DecodePlan::embed(int64_t token, float* x) const {
  const Linear& e = embed_;
  if (e.kind == F32) {
    std::copy(e.wp + token * d_, e.wp + (token + 1) * d_, x);
    return;
  }
  const int64_t nb = d_ / QK;
  for (int64_t b = 0; b < nb; ++b) {
    const float d = (float)e.dp[token * nb + b];
    float* xb = x + b * QK;
    if (e.kind == Q8_0) {
      const int8_t* q = (const int8_t*)e.qsp + token * d_ + b * QK;
      for (int i = 0; i < QK; ++i) xb[i] = (float)q[i] * d;
      continue;
    }
    const uint8_t* q = e.qsp + token * d_ / 2 + b * QK / 2;
    const float m = e.kind == Q4_1 ? (float)e.mp[token * nb + b] : 0.0f;
    for (int i = 0; i < QK / 2; ++i) {
      const int lo = q[i] & 0x0F, hi = q[i] >> 4;
      if (e.kind == Q4_0) xb[i] = d * (float)(lo - 8), xb[i + QK / 2] = d * (float)(hi - 8);
      else xb[i] = d * (float)lo + m, xb[i + QK / 2] = d * (float)hi + m;
    }
  }
}

// out (H·Dh) from q (H·Dh) and n slots of the caches kc, vc (K, cap, Dh) from slot `first` on
void DecodePlan::attention(const float* q, const float* kc, const float* vc, int64_t cap, int64_t first, int64_t n,
                           float* out) {
  const int64_t group = h_ / k_;
  const int64_t grain = h_ * n * dh_ >= kParallelAttention ? 1 : h_;
  at::parallel_for(0, h_, grain, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t g = h / group;
      attend_head(q + h * dh_, kc + (g * cap + first) * dh_, vc + (g * cap + first) * dh_, n, dh_,
                  p_.data() + h * cap, out + h * dh_);
    }
  });
}

at::Tensor DecodePlan::step(int64_t token, int64_t position, at::Tensor cos, at::Tensor sin,
                            std::vector<at::Tensor> k_caches, std::vector<at::Tensor> v_caches, int64_t slot,
                            int64_t first) {
  TORCH_CHECK(!layers_.empty() && norm_.defined(), "the plan has no layers or no output (set_output)");
  TORCH_CHECK(token >= 0 && token < embed_.out, "token ", token, " is outside the vocabulary of ", embed_.out);
  TORCH_CHECK(cos.dim() == 2 && cos.size(1) == dh_ && cos.sizes() == sin.sizes() && cos.is_contiguous() &&
              sin.is_contiguous() && cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "cos and sin must be contiguous (P, Dh) float32");
  TORCH_CHECK(position >= 0 && position < cos.size(0), "no RoPE row for position ", position);
  TORCH_CHECK(k_caches.size() == layers_.size() && v_caches.size() == layers_.size(), "one k and v cache per layer");
  const int64_t cap = k_caches[0].size(2), n = slot - first + 1;
  for (size_t i = 0; i < layers_.size(); ++i)
    for (const at::Tensor& c : {k_caches[i], v_caches[i]})
      TORCH_CHECK(c.dim() == 4 && c.size(0) == 1 && c.size(1) == k_ && c.size(2) == cap && c.size(3) == dh_ &&
                  c.scalar_type() == at::kFloat && c.is_contiguous() && c.is_cpu(),
                  "caches must be contiguous (1, K, L, Dh) float32 CPU tensors of one capacity");
  TORCH_CHECK(0 <= first && first <= slot && slot < cap, "need 0 <= first <= slot < capacity");
  x_.resize(d_), h_buf_.resize(std::max(d_, f_)), qkv_.resize((h_ + 2 * k_) * dh_), att_.resize(h_ * dh_);
  gu_.resize(2 * f_), p_.resize(h_ * cap);
  const float* cs = cos.data_ptr<float>() + position * dh_;
  const float* sn = sin.data_ptr<float>() + position * dh_;
  float *x = x_.data(), *h = h_buf_.data(), *qkv = qkv_.data();
  embed(token, x);
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& l = layers_[li];
    rmsnorm(x, l.attn_norm.data_ptr<float>(), d_, l.attn_eps, h);
    matvec(l.qkv, h, qkv, a8_, a4_);
    float *q = qkv, *k = qkv + h_ * dh_, *v = k + k_ * dh_;
    rope(q, h_, dh_, cs, sn);
    rope(k, k_, dh_, cs, sn);
    float *kc = k_caches[li].data_ptr<float>(), *vc = v_caches[li].data_ptr<float>();
    for (int64_t g = 0; g < k_; ++g) {
      std::copy(k + g * dh_, k + (g + 1) * dh_, kc + (g * cap + slot) * dh_);
      std::copy(v + g * dh_, v + (g + 1) * dh_, vc + (g * cap + slot) * dh_);
    }
    attention(q, kc, vc, cap, first, n, att_.data());
    matvec(l.o, att_.data(), h, a8_, a4_);
    for (int64_t i = 0; i < d_; ++i) x[i] = x[i] + h[i];
    rmsnorm(x, l.ffn_norm.data_ptr<float>(), d_, l.ffn_eps, h);
    matvec(l.gate_up, h, gu_.data(), a8_, a4_);
    swiglu(gu_.data(), gu_.data() + l.down.in, l.down.in, h);
    matvec(l.down, h, qkv, a8_, a4_);  // qkv is free again: (H + 2K)·Dh >= D
    for (int64_t i = 0; i < d_; ++i) x[i] = x[i] + qkv[i];
  }
  rmsnorm(x, norm_.data_ptr<float>(), d_, norm_eps_, h);
  at::Tensor logits = at::empty({head_.out}, at::kFloat);
  matvec(head_, h, logits.data_ptr<float>(), a8_, a4_);
  return logits;
}

}  // namespace attnlab_decode

TORCH_LIBRARY(attnlab_decode, m) {
  m.class_<attnlab_decode::DecodePlan>("DecodePlan")
      .def(torch::init<int64_t, int64_t, int64_t, int64_t>())
      .def("add_linear", &attnlab_decode::DecodePlan::add_linear)
      .def("add_layer", &attnlab_decode::DecodePlan::add_layer)
      .def("set_output", &attnlab_decode::DecodePlan::set_output)
      .def("step", &attnlab_decode::DecodePlan::step);
}

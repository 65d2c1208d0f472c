"""GGUF loading: dequantization against gguf-py, the Q/K un-permutation, a tiny written GGUF model
that loads back to the same logits, and the errors (not GGUF, unsupported architecture or key,
missing / mis-shaped tensors, unsupported tensor type).

Needs the `gguf` package (the [hf] extra); skips without it. The tiny files are written here with
gguf.GGUFWriter, Q/K rows permuted as llama.cpp's convert_hf_to_gguf.py does.
"""
from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="GGUF tests need the gguf package (pip install 'attnlab[hf]')")
from gguf import GGMLQuantizationType as Q  # noqa: E402

from attnlab.models.gpt import GPTConfig  # noqa: E402
from attnlab.interop.gguf import dequantize, gpt_config_from_gguf, load_gguf, unpermute_qk  # noqa: E402
from attnlab.models.gpt import GPT  # noqa: E402
from attnlab.nn.quant import quantize  # noqa: E402
from attnlab.nn.quant_linear import QuantLinear, prepare, set_quantized  # noqa: E402
from attnlab.nn.rope import RotaryEmbedding, apply_rope  # noqa: E402
from attnlab.tokenizers.pretokenize import token_to_unicode  # noqa: E402

TOKENS = [token_to_unicode(bytes([b])) for b in range(256)] + ["Ġt", "<s>", "</s>"]
TYPES = [1] * 257 + [3, 3]  # normal, then two control tokens
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
# llama.cpp's tensor names (llama-arch.cpp LLM_TENSOR_NAMES), written out independently of ours.
LAYER = {"attn_norm": "attn_norm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.out_proj", "ffn_norm": "ffn_norm",
         "ffn_gate": "ffn.gate_proj", "ffn_up": "ffn.up_proj", "ffn_down": "ffn.down_proj"}


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute, verbatim in numpy."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_model(tied: bool, d_ff: int = 96) -> GPT:
    cfg = GPTConfig.from_name("llama", vocab_size=len(TOKENS), d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                              d_ff=d_ff, max_seq_len=128, rope_theta=50000.0, norm_eps=1e-5,
                              tie_embeddings=tied, bos_id=257, eos_id=258)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # norms too, so that swapped names would show
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    return model


def write_gguf(path, model: GPT, qtype=Q.F32, arch="llama", extra=None, drop=(), replace=None, types=None,
               blocks=None):
    """Write `model` as llama.cpp would: hyper-parameters, the tokenizer, tensors (2-D ones as qtype);
    `blocks`: name -> (raw bytes, type) written as they are."""
    cfg, sd = model.cfg, model.state_dict()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.n_layers), w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model), w.add_feed_forward_length(cfg.ffn_dim)
    w.add_head_count(cfg.n_heads), w.add_head_count_kv(cfg.kv_heads)
    w.add_layer_norm_rms_eps(cfg.norm_eps), w.add_rope_freq_base(cfg.rope_theta)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre("gpt-2"), w.add_token_list(TOKENS)
    w.add_token_types(TYPES), w.add_token_merges(["Ġ t"]), w.add_chat_template(TEMPLATE)
    w.add_bos_token_id(257), w.add_eos_token_id(258)
    for key, value in (extra or {}).items():
        (w.add_string if isinstance(value, str) else w.add_float32 if isinstance(value, float) else w.add_uint32)(
            key, value)
    names = {"token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight"}
    if not cfg.tie_embeddings:
        names["output.weight"] = "lm_head.weight"
    for i in range(cfg.n_layers):
        names.update({f"blk.{i}.{g}.weight": f"layers.{i}.{o}.weight" for g, o in LAYER.items()})
    for name, ours in names.items():
        if name in drop:
            continue
        arr = (replace or {}).get(name, sd[ours].numpy())
        if ".attn_q." in name or ".attn_k." in name:
            arr = llama_cpp_permute(arr, cfg.n_heads if ".attn_q." in name else cfg.kv_heads)
        kind = (types or {}).get(name, qtype if arr.ndim == 2 else Q.F32)
        if name in (blocks or {}):
            raw, kind = blocks[name]
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=kind)
            continue
        w.add_tensor(name, gguf.quants.quantize(arr, kind), raw_dtype=kind)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()


# ----------------------------------------------------------------------------- dequantization
@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1], ids=lambda q: q.name)
def test_dequantize_equals_gguf_reference(qtype):
    rng = np.random.default_rng(int(qtype))
    data = (rng.standard_normal((6, 128)) * rng.uniform(0.01, 10, (6, 1))).astype(np.float32)
    data[0, :32] = 0.0  # an all-zero block (scale 0)
    raw = gguf.quants.quantize(data, qtype)
    ref = gguf.quants.dequantize(raw, qtype)
    for given in (raw, raw.view(np.uint8).reshape(-1)):  # the typed array GGUFReader gives, or bytes
        ours = dequantize(given, qtype, (6, 128))
        assert ours.dtype == np.float32 and ours.shape == (6, 128)
        assert np.array_equal(ours.view(np.uint32), ref.reshape(6, 128).view(np.uint32))  # bit for bit


def test_dequantize_block_layouts_by_hand():
    j = np.arange(16, dtype=np.uint8)
    nibbles = (j | ((15 - j) << 4)).astype(np.uint8)  # low nibble j, high nibble 15 - j
    low, high = j.astype(np.float32), (15 - j).astype(np.float32)
    q4_0 = np.concatenate([np.float16(0.5).reshape(1).view(np.uint8), nibbles])
    assert np.array_equal(dequantize(q4_0, 2, (32,)), np.concatenate([(low - 8) * 0.5, (high - 8) * 0.5]))
    q4_1 = np.concatenate([np.float16(0.25).reshape(1).view(np.uint8), np.float16(-1).reshape(1).view(np.uint8),
                           nibbles])
    assert np.array_equal(dequantize(q4_1, 3, (32,)), np.concatenate([low * 0.25 - 1, high * 0.25 - 1]))
    q8 = np.arange(-16, 16, dtype=np.int8)
    q8_0 = np.concatenate([np.float16(2).reshape(1).view(np.uint8), q8.view(np.uint8)])
    assert np.array_equal(dequantize(q8_0, Q.Q8_0, (1, 32)), 2.0 * q8[None].astype(np.float32))


def kquant_blocks(rows: int, cols: int, kind, seed: int = 0) -> np.ndarray:
    """(rows, bytes per row) uint8 of random K-quant super-blocks (256 weights) with finite fp16
    scales: Q4_K / Q5_K start with d and dmin, Q6_K ends with d (ggml-common.h block_q4_K ...)."""
    block, size = gguf.quants.GGML_QUANT_SIZES[kind]
    raw = np.random.default_rng(seed).integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    scale = np.float16(0.01).reshape(1).view(np.uint8)
    if kind == Q.Q6_K:
        raw[:, size - 2:] = scale
    else:
        raw[:, 0:2], raw[:, 2:4] = scale, scale
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind", [Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_k_quants_are_decoded_by_gguf_quants(kind):
    raw = kquant_blocks(3, 512, kind)
    want = gguf.quants.dequantize(raw, kind)
    assert want.shape == (3, 512) and np.isfinite(want).all()
    assert np.array_equal(dequantize(raw, kind, (3, 512)), want)


def test_dequantize_errors():
    with pytest.raises(ValueError, match=r"blk\.0\.attn_q\.weight: GGUF tensor type type 99 is not supported; "
                                         r"supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, and the types gguf.quants"):
        dequantize(np.zeros(144, np.uint8), 99, (256,), "blk.0.attn_q.weight")
    with pytest.raises(ValueError, match="Q4_K tensor needs a last dimension that is a multiple of 256"):
        dequantize(np.zeros(144, np.uint8), Q.Q4_K, (2, 128))
    with pytest.raises(ValueError, match="Q6_K tensor of shape .1, 256. needs 210 bytes, got 144"):
        dequantize(np.zeros(144, np.uint8), Q.Q6_K, (1, 256))
    with pytest.raises(ValueError, match="needs 68 bytes, got 34"):
        dequantize(np.zeros(34, np.uint8), Q.Q8_0, (2, 32))
    with pytest.raises(ValueError, match="multiple of 32"):
        dequantize(np.zeros(34, np.uint8), Q.Q8_0, (32, 1))


# ----------------------------------------------------------------------------- Q/K rows
def rope_interleaved(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """llama.cpp's LLAMA_ROPE_TYPE_NORM: rotate pairs (2i, 2i+1) by m·θ^(-2i/Dh). x: (H, T, Dh)."""
    dh = x.size(-1)
    angles = positions.float()[:, None] * theta ** (-torch.arange(0, dh, 2).float() / dh)  # (T, Dh/2)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * angles.cos() - x1 * angles.sin(), x0 * angles.sin() + x1 * angles.cos()], -1).flatten(-2)


def test_unpermute_inverts_llama_cpp_and_matches_rope_math():
    torch.manual_seed(0)
    h, dh, d, t, theta = 3, 8, 20, 5, 10000.0
    w_hf = torch.randn(h * dh, d)
    w_gguf = llama_cpp_permute(w_hf.numpy(), h)
    assert np.array_equal(unpermute_qk(w_gguf, h), w_hf.numpy())
    x, pos = torch.randn(t, d), torch.arange(t)
    # The GGUF rows with interleaved RoPE give the same attention scores as ours with rotate-half.
    q_cpp = rope_interleaved((x @ torch.from_numpy(w_gguf).T).view(t, h, dh).transpose(0, 1), pos, theta)
    cos, sin = RotaryEmbedding(dh, theta)(pos)
    q_ours = apply_rope((x @ torch.from_numpy(unpermute_qk(w_gguf, h)).T).view(t, h, dh).transpose(0, 1)[None],
                        cos, sin)[0]  # (H, T, Dh)
    torch.testing.assert_close(q_cpp @ q_cpp.transpose(1, 2), q_ours @ q_ours.transpose(1, 2))


def test_unpermute_equals_transformers():
    pytest.importorskip("transformers", reason="needs transformers")
    try:  # transformers' GGUF loader for "llama" (an internal module; skip if it moves)
        from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor
    except ImportError as err:
        pytest.skip(f"transformers has no LlamaTensorProcessor here ({err})")

    w = np.random.default_rng(0).standard_normal((2 * 16, 24)).astype(np.float32)
    theirs = LlamaTensorProcessor()._reverse_permute_weights(w, 8, 2)  # 8 query heads, 2 kv heads
    assert np.array_equal(unpermute_qk(w, 2), theirs)


# ----------------------------------------------------------------------------- a tiny written model
@pytest.mark.parametrize("qtype,tied", [(Q.F32, False), (Q.F16, True), (Q.Q8_0, True), (Q.Q4_1, False)],
                         ids=["F32", "F16-tied", "Q8_0-tied", "Q4_1"])
def test_tiny_gguf_loads_back_to_same_logits(tmp_path, qtype, tied):
    torch.manual_seed(0)
    model = tiny_model(tied)
    write_gguf(tmp_path / "tiny.gguf", model, qtype)
    loaded, tok, metadata = load_gguf(tmp_path / "tiny.gguf")
    assert not loaded.training and loaded.embed_tokens.weight.dtype == torch.float32
    assert loaded.cfg == GPTConfig(**{**model.cfg.to_dict(), "norm_eps": float(np.float32(1e-5))})
    assert (loaded.lm_head.weight is loaded.embed_tokens.weight) == tied
    with torch.no_grad():  # the reference: our weights through gguf-py's own quantize + dequantize
        for name, p in model.state_dict().items():
            if p.dim() == 2:
                p.copy_(torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(p.numpy(), qtype), qtype)))
    for name, p in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], p), name
    ids = torch.randint(0, len(TOKENS), (2, 12))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert metadata["tokenizer.chat_template"] == TEMPLATE
    assert tok.encode("<s> t", "all") == [257, 256]


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("content", [pickle.dumps({"weight": [1.0, 2.0]}), b"just some text\n", b"GGU", b""])
def test_non_gguf_file_refused_before_parsing(tmp_path, monkeypatch, content):
    def no_parse(*args, **kwargs):
        raise AssertionError("GGUFReader must not see a file without the GGUF magic")

    monkeypatch.setattr(gguf, "GGUFReader", no_parse)
    (tmp_path / "model.gguf").write_bytes(content)
    with pytest.raises(ValueError, match="is not a GGUF file"):
        load_gguf(tmp_path / "model.gguf")
    with pytest.raises(FileNotFoundError):
        load_gguf(tmp_path / "absent.gguf")


def test_unsupported_architecture_is_named(tmp_path):
    write_gguf(tmp_path / "q.gguf", tiny_model(True), arch="qwen2")
    with pytest.raises(ValueError, match="general.architecture 'qwen2' is not supported; supported: llama"):
        load_gguf(tmp_path / "q.gguf")
    with pytest.raises(ValueError, match="'falcon'"):
        gpt_config_from_gguf({"general.architecture": "falcon"})


LLAMA = {"general.architecture": "llama", "llama.block_count": 2, "llama.context_length": 64,
         "llama.embedding_length": 32, "llama.feed_forward_length": 64, "llama.attention.head_count": 4,
         "llama.attention.layer_norm_rms_epsilon": 1e-6, "tokenizer.ggml.tokens": TOKENS}


def test_config_from_metadata():
    cfg = gpt_config_from_gguf(LLAMA, ["token_embd.weight", "output.weight"])
    assert (cfg.n_kv_heads, cfg.rope_theta, cfg.vocab_size, cfg.head_dim) == (4, 10000.0, 259, 8)
    assert not cfg.tie_embeddings and gpt_config_from_gguf(LLAMA, ["token_embd.weight"]).tie_embeddings
    assert cfg.positions == "rope" and cfg.norm == "rmsnorm" and cfg.activation == "swiglu" and not cfg.bias
    with pytest.raises(ValueError, match="llama.embedding_length is missing"):
        gpt_config_from_gguf({k: v for k, v in LLAMA.items() if k != "llama.embedding_length"})


@pytest.mark.parametrize("key,value", [("llama.rope.scaling.type", "linear"), ("llama.rope.scaling.factor", 4.0),
                                       ("llama.rope.dimension_count", 4), ("llama.attention.sliding_window", 16),
                                       ("llama.expert_count", 8), ("llama.vocab_size", 300)])
def test_math_changing_keys_refused(key, value):
    assert gpt_config_from_gguf({**LLAMA, "llama.rope.scaling.type": "none", "llama.vocab_size": 259})
    with pytest.raises(ValueError, match=f"{key} = "):
        gpt_config_from_gguf({**LLAMA, key: value})


def test_missing_and_misshaped_tensors(tmp_path):
    model = tiny_model(False)
    bad = np.zeros((64, 32), np.float32)  # attn_v is (K·Dh, D) = (32, 64)
    write_gguf(tmp_path / "m.gguf", model, drop={"blk.1.ffn_down.weight"}, replace={"blk.0.attn_v.weight": bad})
    with pytest.raises(ValueError, match=r"missing blk\.1\.ffn_down\.weight \(64, 96\).*"
                                         r"blk\.0\.attn_v\.weight has shape \(64, 32\), expected \(32, 64\)"):
        load_gguf(tmp_path / "m.gguf")


@pytest.mark.parametrize("dtype", ["fp32", "auto", "q8_0"])
@pytest.mark.parametrize("where", ["a norm", "a block scale"])
def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path, dtype, where):
    """A GGUF file with NaN in a norm weight, or in the fp16 scale of one Q8_0 block, loaded silently
    and generated garbage (a tester's damaged copy of SmolLM2); it is named as damaged instead."""
    model = tiny_model(False)
    if where == "a norm":
        norm = model.state_dict()["layers.0.attn_norm.weight"].numpy().copy()
        norm[3] = np.nan
        write_gguf(tmp_path / "nan.gguf", model, replace={"blk.0.attn_norm.weight": norm})
        name = "blk.0.attn_norm.weight"
    else:
        down = model.state_dict()["layers.1.ffn.down_proj.weight"].numpy()
        raw = gguf.quants.quantize(down, Q.Q8_0)  # (rows, blocks · 34) bytes: each block's fp16 d first
        raw[2, 34:36] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
        write_gguf(tmp_path / "nan.gguf", model, blocks={"blk.1.ffn_down.weight": (raw, Q.Q8_0)})
        name = "blk.1.ffn_down.weight"
    with pytest.raises(ValueError, match=rf"nan\.gguf: tensor '{re.escape(name)}' holds \d+ non-finite values"):
        load_gguf(tmp_path / "nan.gguf", dtype)


@pytest.mark.parametrize("dtype", ["fp32", "auto"])
def test_k_quant_file_loads_exactly_and_auto_keeps_it_at_q8_0(tmp_path, dtype):
    torch.manual_seed(0)
    model = tiny_model(True, d_ff=256)  # ffn_down is (64, 256): one super-block per row
    raw = {"blk.0.ffn_down.weight": (kquant_blocks(64, 256, Q.Q4_K, 1), Q.Q4_K),
           "blk.1.ffn_down.weight": (kquant_blocks(64, 256, Q.Q6_K, 2), Q.Q6_K),
           "blk.1.ffn_up.weight": (gguf.quants.quantize(model.state_dict()["layers.1.ffn.up_proj.weight"].numpy(), Q.Q5_0),
                                   Q.Q5_0)}
    write_gguf(tmp_path / "k.gguf", model, blocks=raw)
    loaded, _, _ = load_gguf(tmp_path / "k.gguf", dtype=dtype)
    with torch.no_grad():  # the reference: the file's weights as gguf-py decodes them
        for name, (blocks_, kind) in raw.items():
            ours = {"blk.0.ffn_down.weight": "layers.0.ffn.down_proj.weight",
                    "blk.1.ffn_down.weight": "layers.1.ffn.down_proj.weight",
                    "blk.1.ffn_up.weight": "layers.1.ffn.up_proj.weight"}[name]
            model.state_dict()[ours].copy_(torch.from_numpy(gguf.quants.dequantize(blocks_, kind)))
    if dtype == "auto":  # no K-quant (or Q5_0) kernel: those matrices held as Q8_0 of their decoded values
        for name in ("layers.0.ffn.down_proj", "layers.1.ffn.down_proj", "layers.1.ffn.up_proj"):
            set_quantized(model, name, prepare(quantize(model.state_dict()[name + ".weight"], "q8_0")))  # as loaded
            assert isinstance(loaded.get_submodule(name), QuantLinear)
            assert loaded.get_submodule(name).qweight.scheme == "q8_0"
    ids = torch.randint(0, len(TOKENS), (1, 12))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)

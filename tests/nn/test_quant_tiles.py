"""The kernel's tiled layout of a quantized weight (nn/quant.py to_tiles / to_rows, QuantWeight.tile;
nn/quant_tiles.h): an exact permutation of the same bytes, undone exactly; every reader (products,
the bf16 dequantization of prefill, the embedding lookup, the fused step) gives the rows layout's
answer; 16- and 8-row tiles give the same bits; a row of a batch gets the bits it gets alone; a model
is converted once, in place of its rows, tied weights still shared."""
from __future__ import annotations

import pytest
import torch

from attnlab.engines import FusedEngine
from attnlab.interop.gguf_quants import from_gguf_blocks, to_gguf_blocks
from attnlab.nn import cpu_tuning
from attnlab.nn.quant import SCHEMES, TILES, QuantWeight, dequantize, quantize, take_rows, to_rows, to_tiles
from attnlab.nn.quant_kernel import PREFILL_ROWS, SCHEME_ID, kernel, quant_matmul
from attnlab.nn.quant_linear import QuantEmbedding, QuantLinear, prepare, quantize_model, quantized_bytes
from tests.engines.test_fused import assert_close, tiny
from tests.engines.test_reference import prompts
from tests.nn.test_quant import _weights, tiny_llama

CPP = pytest.mark.skipif(kernel() != "cpp", reason="the C++ kernel is not available here")


def _same(a: QuantWeight, b: QuantWeight) -> bool:
    pairs = ((a.qs, b.qs), (a.d, b.d), (a.m, b.m))
    return a.scheme == b.scheme and a.tile == b.tile and all(
        (x is None and y is None) or (x is not None and y is not None and x.dtype == y.dtype and torch.equal(x, y))
        for x, y in pairs)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("tile", [8, 16])
@pytest.mark.parametrize("out", [5, 16, 37, 64])  # no whole tile; tiles only; tiles and a rest
def test_the_layouts_round_trip_exactly_and_read_the_same(scheme, tile, out):
    qw = quantize(_weights(rows=out, cols=320, seed=1), scheme)
    tiled = to_tiles(qw, tile)
    assert tiled.tile == tile and tiled.nbytes() == qw.nbytes()
    assert all(t.shape == u.shape and t.dtype == u.dtype for t, u in ((tiled.qs, qw.qs), (tiled.d, qw.d)))
    assert _same(to_rows(tiled), qw) and to_rows(qw) is qw
    assert _same(to_tiles(to_tiles(qw, 8), tile), tiled)  # from either layout
    if out >= tile:
        assert not torch.equal(tiled.qs, qw.qs)  # really another order
    assert torch.equal(tiled.qs[out // tile * tile:], qw.qs[out // tile * tile:])  # the rest stays rows
    ids = torch.tensor([out - 1, 0, min(3, out - 1), out // 2, 0])
    assert _same(take_rows(tiled, ids), take_rows(qw, ids))
    assert torch.equal(dequantize(tiled), dequantize(qw))
    assert torch.equal(dequantize(tiled, slice(1, 4)), dequantize(qw, slice(1, 4)))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_gguf_blocks_are_written_in_ggmls_order_from_either_layout(scheme):
    qw = quantize(_weights(rows=37, cols=128), scheme)
    assert torch.equal(to_gguf_blocks(to_tiles(qw, 16)), to_gguf_blocks(qw))
    assert _same(from_gguf_blocks(to_gguf_blocks(to_tiles(qw, 8)).numpy(), scheme, (37, 128)), qw)


def test_q8_0_tiles_hold_the_kernels_unsigned_bytes():
    """By hand: 16 rows × one block, row i = i·ones: lane i of dword k of the tile is row i's bytes
    4k..4k+3, each q + 128."""
    w = torch.arange(16.0)[:, None].expand(16, 32) * (torch.arange(32.0) + 1) / 32
    qw = quantize(w.contiguous(), "q8_0")
    tiled = to_tiles(qw, 16).qs.view(torch.uint8).reshape(8, 16, 4)  # (K, T, 4) of block 0
    expect = (qw.qs.view(torch.uint8) ^ 0x80).reshape(16, 8, 4).permute(1, 0, 2)
    assert torch.equal(tiled, expect)


def test_a_bad_tile_is_named():
    with pytest.raises(ValueError, match="tile=4: must be one of 0, 8, 16"):
        to_tiles(quantize(_weights(), "q8_0"), 4)
    assert TILES == cpu_tuning.TILES


@CPP
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("out", [16, 37, 64])
def test_tiled_products_are_the_same_bits_at_8_and_16_rows_and_alone_as_batched(scheme, out):
    qw = quantize(_weights(rows=out, cols=320, seed=3), scheme)  # NB = 10: not a multiple of 4 or 16
    x = torch.randn(PREFILL_ROWS - 1, 320) * torch.linspace(0.1, 20, 320)
    rows = quant_matmul(x, qw, "cpp")
    batched = quant_matmul(x, to_tiles(qw, 16), "cpp")
    assert torch.equal(quant_matmul(x, to_tiles(qw, 8), "cpp"), batched)  # T changes speed only
    for n in (1, 5, 8, 11):
        assert torch.equal(quant_matmul(x[:n], to_tiles(qw, 16), "cpp"), batched[:n])
    for r in range(x.shape[0]):
        assert torch.equal(quant_matmul(x[r:r + 1], to_tiles(qw, 16), "cpp")[0], batched[r])
    # against the rows layout (another summation order) and the PyTorch reference: fp32 rounding only
    ref = quant_matmul(x, qw, "torch")
    assert torch.allclose(batched, rows, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    assert torch.allclose(batched, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    if out % 16:  # the rest rows use the rows layout's tiles: the same bits as there
        assert torch.equal(batched[:, out // 16 * 16:], rows[:, out // 16 * 16:])


@CPP
def test_q8_0_extremes_give_the_same_bits_in_every_tile():
    """The 8-row tiles' int8 products (vpdpbusd, or on AVX2 |q| · sign(x, q) in int16 pairs) at the
    ends of the ranges: q = −128 and 127 against activations rounded to ±127 (the int16 step's
    largest pairs, 2 · 128 · 127): the same bits as the 16-row tiles and the reference's values."""
    qw = quantize(_weights(rows=32, cols=128, seed=5), "q8_0")  # whole tiles of 8 and of 16
    ends = torch.tensor([-128, 127, -128, -128, 127, 127, -1, 0], dtype=torch.int8)
    qw = QuantWeight("q8_0", ends.repeat(32 * 128 // 8).view(32, 128).contiguous(), qw.d)
    x = torch.randn(9, 128)
    x[:, ::2] = 50.0 * torch.sign(x[:, ::2])  # each block's largest magnitude, on both signs: ±127
    x[:, 1::2] = -50.0
    out8 = quant_matmul(x, to_tiles(qw, 8), "cpp")
    assert torch.equal(out8, quant_matmul(x, to_tiles(qw, 16), "cpp"))
    ref = quant_matmul(x, qw, "torch")
    assert torch.allclose(out8, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


@CPP
@pytest.mark.parametrize("scheme", ["q4_0", "q4_1"])
def test_q4_extremes_give_the_same_bits_in_every_tile(scheme):
    """The AVX2 build adds a row's 8 vpmaddubsw per block in int16 (nn/quant_tiles.h tile_avx2): at
    the ends, every nibble 15 against activations all rounded to +127 or all to −127, each int16 lane
    sums 16 products of 15 · 127 (±30480, near the int16 limit): the same bits as the 16-row tiles
    (another instruction sequence on either build) and the reference's values."""
    qw = quantize(_weights(rows=32, cols=128, seed=6), scheme)  # whole tiles of 8 and of 16
    qw = QuantWeight(scheme, torch.full_like(qw.qs, 0xFF), qw.d, qw.m)  # every nibble 15
    x = torch.full((10, 128), 50.0)
    x[5:] = -50.0
    x[4, 1::2] = -50.0  # and a row of mixed signs
    out8 = quant_matmul(x, to_tiles(qw, 8), "cpp")
    assert torch.equal(out8, quant_matmul(x, to_tiles(qw, 16), "cpp"))
    ref = quant_matmul(x, qw, "torch")
    assert torch.allclose(out8, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


@CPP
@pytest.mark.parametrize("scheme", SCHEMES)
def test_prefill_dequantization_reads_either_layout(scheme):
    op = torch.ops.attnlab_quant.dequantize_bf16
    for out in (5, 16, 40, 64):  # no whole tile; tiles only; tiles and a rest; both tile sizes whole
        w = quantize(_weights(rows=out, cols=320, seed=out), scheme)
        rows = op(w.qs, w.d, w.m, SCHEME_ID[scheme], 0)
        assert torch.equal(rows, dequantize(w).bfloat16())
        f32 = torch.ops.attnlab_quant.dequantize_f32(w.qs, w.d, w.m, SCHEME_ID[scheme], 0)
        assert torch.equal(f32, dequantize(w))  # the fp32 prefill's weight (cpu_tuning.prefill_dtype)
        for tile in (8, 16):  # whole tiles at a time (regression: each row's blocks gathered one by one)
            t = to_tiles(w, tile)
            assert torch.equal(op(t.qs, t.d, t.m, SCHEME_ID[scheme], tile), rows), (out, tile)
            assert torch.equal(torch.ops.attnlab_quant.dequantize_f32(t.qs, t.d, t.m, SCHEME_ID[scheme], tile), f32)
    qw = quantize(_weights(rows=37, cols=128), scheme)
    x = torch.randn(PREFILL_ROWS, 128)
    assert torch.equal(quant_matmul(x, to_tiles(qw, 16)), quant_matmul(x, qw))  # the bf16 product
    layer = QuantLinear(to_tiles(qw, 16))
    g = torch.randn(3, 37)
    assert torch.equal(layer.input_grad(g), QuantLinear(qw).input_grad(g))
    with pytest.raises(RuntimeError, match="tile must be 0"):
        op(qw.qs, qw.d, qw.m, SCHEME_ID[scheme], 4)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_model_is_prepared_once_in_place_of_its_rows(scheme, monkeypatch):
    """quantize_model converts each weight once to this machine's layout: the same bytes as the rows
    layout (no second copy), the tied embedding and head still one set of buffers, lookups unchanged."""
    monkeypatch.setenv(cpu_tuning.TILE_ENV, "0")
    rows = quantize_model(tiny_llama(tied=True), scheme)
    monkeypatch.setenv(cpu_tuning.TILE_ENV, "16")
    model = quantize_model(tiny_llama(tied=True), scheme)
    expect = 16 if kernel() == "cpp" else 0
    assert model.lm_head.tile == expect and model.embed_tokens.tile == expect
    assert model.lm_head.qs is model.embed_tokens.qs  # tied: one tensor
    assert quantized_bytes(model) == quantized_bytes(rows)
    ids = torch.tensor([[5, 0, 95, 17]])
    assert torch.equal(model.embed_tokens(ids), rows.embed_tokens(ids))
    for a, b in zip(model.modules(), rows.modules()):
        if isinstance(a, (QuantLinear, QuantEmbedding)):
            assert _same(to_rows(a.qweight), b.qweight)
    assert prepare(model.lm_head.qweight).qs is model.lm_head.qs  # already prepared: no conversion


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_state_dict_holds_rows_whatever_the_layout_and_loads_into_any(scheme, monkeypatch):
    """Regression (issue 23): a prepared (tiled) model's state_dict held its tiles with no marker, so a
    model of another layout (another machine, ATTNLAB_QUANT_TILE) loaded them as rows, silently
    wrong. Now a state_dict is always ggml's rows, and loading converts into the module's layout."""
    monkeypatch.setenv(cpu_tuning.TILE_ENV, "0")
    rows = quantize_model(tiny_llama(tied=True), scheme)
    expect = rows.state_dict()
    models = {0: rows}
    for tile in (8, 16):  # a tiled model by hand, so that this holds where the C++ kernel is not built
        models[tile] = quantize_model(tiny_llama(tied=True), scheme)
        for m in models[tile].modules():
            if isinstance(m, (QuantLinear, QuantEmbedding)) and m.tile != tile:
                t = to_tiles(m.qweight, tile)
                m.qs, m.d, m.m, m.tile = t.qs, t.d, t.m, tile
        models[tile].lm_head.qs = models[tile].embed_tokens.qs  # tied again
        models[tile].lm_head.d, models[tile].lm_head.m = models[tile].embed_tokens.d, models[tile].embed_tokens.m
        state = models[tile].state_dict()
        assert state.keys() == expect.keys()
        assert all(torch.equal(state[k], expect[k]) for k in expect), tile  # rows, bit for bit
        assert models[tile].lm_head.tile == tile and not torch.equal(models[tile].lm_head.qs, rows.lm_head.qs)
    ids = torch.tensor([[5, 0, 95, 17, 3]])
    with torch.no_grad():
        logits = rows(ids).logits
        for src in (0, 8, 16):
            for dst in (0, 8, 16):
                monkeypatch.setenv(cpu_tuning.TILE_ENV, "0")
                target = quantize_model(tiny_llama(tied=True), scheme)  # other weights: all overwritten
                for m in target.modules():
                    if isinstance(m, (QuantLinear, QuantEmbedding)) and dst:
                        t = to_tiles(quantize(torch.zeros(m.qweight.shape), scheme), dst)
                        m.qs, m.d, m.m, m.tile = t.qs, t.d, t.m, dst
                target.load_state_dict(models[src].state_dict())
                assert target.lm_head.tile == dst
                assert _same(to_rows(target.lm_head.qweight), rows.lm_head.qweight), (src, dst)
                assert torch.allclose(target(ids).logits, logits, rtol=1e-5, atol=1e-5 * float(logits.abs().max()))
    bad = {**rows.state_dict(), "lm_head.d": rows.lm_head.d[:-1]}
    with pytest.raises(RuntimeError, match="lm_head.d"):
        models[16].load_state_dict(bad)


def test_the_tile_choice_is_per_format_and_deterministic(monkeypatch):
    monkeypatch.delenv(cpu_tuning.TILE_ENV, raising=False)
    monkeypatch.delenv(cpu_tuning.ENV, raising=False)
    for scheme in SCHEMES:
        assert cpu_tuning.quant_tile(scheme) == cpu_tuning.quant_tile(scheme) in TILES
        assert cpu_tuning.chosen(True)[f"tile_{scheme}"] == cpu_tuning.quant_tile(scheme)
    assert cpu_tuning.ROWS["amd"].tile_q4_1 == 16 and cpu_tuning.ROWS["intel"].tile_q8_0 == 16  # both measured
    monkeypatch.setenv(cpu_tuning.TILE_ENV, "8")
    assert cpu_tuning.quant_tile("q8_0") == 8
    monkeypatch.setenv(cpu_tuning.TILE_ENV, "0")
    assert cpu_tuning.quant_tile("q4_1") == 0
    monkeypatch.setenv(cpu_tuning.TILE_ENV, "12")
    with pytest.raises(ValueError, match="ATTNLAB_QUANT_TILE='12': must be one of 0, 8, 16"):
        cpu_tuning.quant_tile("q8_0")


@CPP
@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_fused_step_reads_the_tiles_and_keeps_batched_equal_to_alone(scheme, monkeypatch):
    """The fused engine on a model prepared in each layout (tied embedding and head included): 8- and
    16-row tiles the same bits, the rows layout within the quantized bound; sequences of 1, 7, 64 and
    300 tokens in one batch each get what they get alone."""
    batch, slots, steps = prompts((1, 7, 64, 300)), [0, 1, 2, 3], [[5, 6, 7, 8], [9, 1, 2, 3], [4, 4, 4, 4]]
    models, out = {}, {}
    for tile in (0, 8, 16):
        monkeypatch.setenv(cpu_tuning.TILE_ENV, str(tile))
        models[tile] = tiny(scheme)
        assert models[tile].lm_head.tile == tile
        engine = FusedEngine(models[tile], 4, 310)
        out[tile] = torch.stack([engine.prefill(slots, batch)] + [engine.step(slots, s) for s in steps])
    assert torch.equal(out[8], out[16])
    assert_close(out[16], out[0], scheme)
    for row, prompt in enumerate(batch):
        alone = FusedEngine(models[16], 1, 310)
        got = [alone.prefill([0], [prompt])[0]] + [alone.step([0], [s[row]])[0] for s in steps]
        assert torch.equal(torch.stack(got), out[16][:, row])

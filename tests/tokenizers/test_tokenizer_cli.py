"""`attnlab tokenizer train|encode|decode|viz`, run in-process through `attnlab.cli.main`."""
from __future__ import annotations

import io
import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.cli import main
from attnlab.tokenizers import ByteLevelBPE, load_tokenizer
from attnlab.cli.tokenizer import lines_with_ends
from attnlab.tokenizers.viz import format_trace, merge_steps
from tokenizer_corpus import STRESS, TEXTS, write_gguf

CLASSIC = [
    "words: low lower newest widest newer wider",
    "step 0: l o w | l o w e r | n e w e s t | w i d e s t | n e w e r | w i d e r",
    "step 1: 'e' + 'r' -> 'er' (count 3): l o w | l o w er | n e w e s t | w i d e s t"
    " | n e w er | w i d er",
    "step 2: 'e' + 's' -> 'es' (count 2): l o w | l o w er | n e w es t | w i d es t"
    " | n e w er | w i d er",
]


def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["tokenizer", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    files = [folder / "a.txt", folder / "b.txt"]
    files[0].write_text("\n".join(TEXTS[:20]) + "\n", encoding="utf-8")
    files[1].write_text("\n".join(TEXTS[20:]), encoding="utf-8")
    return folder, files


def test_train_writes_tokenizer(trained, capsys):
    folder, files = trained
    out = folder / "tok.json"
    code, stdout, _ = _run(capsys, "train", "--input", *files, "--vocab-size", 420, "--out", out,
                           "--pattern", "gpt4", "--special", "<pad>", "<bos>", "--min-frequency", 2)
    assert code == 0 and json.loads(stdout)["vocab_size"] == 420
    tok = load_tokenizer(out)
    lines = [x for f in files for x in lines_with_ends(f.read_bytes().decode("utf-8"))]
    expected = ByteLevelBPE.train(lines, 420, ["<pad>", "<bos>"], pattern="gpt4")
    assert tok.merges == expected.merges and tok.special_tokens == {"<pad>": 0, "<bos>": 1}


def test_encode_decode_round_trip(trained, capsys, monkeypatch):
    folder, files = trained
    out = folder / "rt.json"
    assert _run(capsys, "train", "--input", files[0], "--vocab-size", 300, "--out", out,
                "--special", "<bos>")[0] == 0
    tok = load_tokenizer(out)
    code, stdout, _ = _run(capsys, "encode", "--tokenizer", out, "<bos>Grüße 😀")
    assert code == 0 and json.loads(stdout) == tok.encode("<bos>Grüße 😀")
    code, stdout, _ = _run(capsys, "encode", "--tokenizer", out, "--allow-special", "<bos>x")
    assert json.loads(stdout) == [0] + tok.encode("x")
    lines = ["Zwei Männer", "", "tabs\tand  spaces ", STRESS.replace("\n", " ").replace("\r", "")]
    _stdin(monkeypatch, "\r\n".join(lines).encode("utf-8") + b"\n")
    code, stdout, _ = _run(capsys, "encode", "--tokenizer", folder / "rt.json")
    ids = [json.loads(x) for x in stdout.splitlines()]
    assert code == 0 and ids == [tok.encode(x) for x in lines]
    _stdin(monkeypatch, stdout.encode("utf-8"))
    code, decoded, _ = _run(capsys, "decode", "--tokenizer", out)
    assert code == 0 and decoded.split("\n")[:-1] == lines
    _stdin(monkeypatch, b"[0, 70]\n")
    assert _run(capsys, "decode", "--tokenizer", out, "--skip-special")[1] == "E\n"


def test_encode_gguf_path(tok_gpt2, tmp_path, capsys):
    write_gguf(tmp_path / "t.gguf", tok_gpt2, "gpt-2", "my word")
    code, stdout, _ = _run(capsys, "encode", "--tokenizer", tmp_path / "t.gguf",
                           "--allow-special", "<bos>hello my word")
    assert code == 0 and json.loads(stdout)[:-1] == tok_gpt2.encode("<bos>hello ", "all")


def test_viz_classic_example(capsys, tmp_path):
    code, stdout, _ = _run(capsys, "viz", "--merges", 2)
    assert code == 0 and stdout.splitlines() == CLASSIC[:4]
    png = tmp_path / "merges.png"
    code, stdout, err = _run(capsys, "viz", "--words", "aa aa ab", "--merges", 5, "--out", png)
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert stdout.splitlines()[0] == "words: aa x2 ab" and "stopped after 2 merges" in err


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text("abcé", min_size=1, max_size=7), min_size=1, max_size=6),
       st.integers(0, 12))
def test_viz_steps_are_recounted_maxima(words, n):
    """Each step's pair is a most frequent pair of a naive recount; segmentations stay exact."""
    trace = merge_steps(words, n)
    segs = trace.initial
    for step in trace.steps:
        counts: dict[tuple[bytes, bytes], int] = {}
        for seg, c in zip(segs, trace.counts):
            for pair in zip(seg, seg[1:]):
                counts[pair] = counts.get(pair, 0) + c
        assert step.count == counts[(step.left, step.right)]
        known = {t for s in segs for t in s} | {t for s in trace.steps for t in s.segmentations[0]}
        assert step.count == max(c for p, c in counts.items() if p[0] + p[1] not in known
                                 or p == (step.left, step.right))
        segs = step.segmentations
        assert [b"".join(s) for s in segs] == [w.encode("utf-8") for w in trace.words]
    assert format_trace(trace).count("\n") == len(trace.steps) + 1


@pytest.mark.parametrize("argv, message", [
    (["encode", "--tokenizer", "{tmp}/nope.json", "x"], "tokenizer file not found"),
    (["train", "--input", "{tmp}/nope.txt", "--vocab-size", "300", "--out", "{tmp}/o.json"],
     "input file not found"),
    (["train", "--input", "{tmp}/latin1.txt", "--vocab-size", "300", "--out", "{tmp}/o.json"],
     "latin1.txt: not valid UTF-8 at byte offset 5 (byte 0xe9)"),
    (["train", "--input", "{tmp}/ok.txt", "--vocab-size", "257", "--out", "{tmp}/o.json",
      "--special", "<a>", "<b>"], "the minimum is 258"),
    (["viz", "--words", "  "], "at least one word"),
    (["encode", "--tokenizer", "{tmp}/not.gguf", "x"], "not.gguf: not a valid GGUF"),
])
def test_errors_exit_2(tmp_path, capsys, argv, message):
    if "GGUF" in message:
        pytest.importorskip("gguf")
    (tmp_path / "latin1.txt").write_bytes("abc\ndéf".encode("latin-1") + b" ok")
    (tmp_path / "ok.txt").write_text("hello", encoding="utf-8")
    (tmp_path / "not.gguf").write_bytes(b"GGUF?")
    code, stdout, err = _run(capsys, *[a.format(tmp=tmp_path) for a in argv])
    assert code == 2 and stdout == "" and message in err and err.count("\n") == 1


def test_gguf_without_gguf_package_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if not installed
    (tmp_path / "t.gguf").write_bytes(b"GGUF")
    code, _, err = _run(capsys, "encode", "--tokenizer", tmp_path / "t.gguf", "x")
    assert code == 2 and "needs the `gguf` package" in err and err.count("\n") == 1


@pytest.mark.parametrize("stdin, message", [
    (b"[1, 2]\nnot json\n", "stdin line 2: expected a JSON list of token ids"),
    (b"[1, 2.5]\n", "stdin line 1: expected a JSON list"),
    (b"[99999]\n", "token id 99999 is not in the vocabulary"),
    (b"ok\n\xff\n", "stdin line 2: not valid UTF-8 at byte offset 0 (byte 0xff)"),
])
def test_decode_errors_exit_2(tok_gpt2, tmp_path, capsys, monkeypatch, stdin, message):
    tok_gpt2.save(tmp_path)
    _stdin(monkeypatch, stdin)
    code, _, err = _run(capsys, "decode", "--tokenizer", tmp_path)
    assert code == 2 and message in err

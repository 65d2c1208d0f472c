"""Tiny configs and tiny data shared by the tests."""
from __future__ import annotations

import random

import pytest
import torch

import attnlab.data.datasets as datasets
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.recipes import get_recipe

EN = "a man woman dog cat runs sits on the street in snow red blue big small two".split()
DE = "ein mann frau hund katze läuft sitzt auf der straße im schnee rot blau groß klein zwei".split()


def tiny_config(**overrides) -> Seq2SeqConfig:
    base = dict(vocab_size=40, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64,
                dropout=0.0, max_seq_len=64)
    return Seq2SeqConfig(**{**base, **overrides})


def spread_weights(model, std: float = 0.2):
    """`model` with every matrix redrawn from N(0, std²), wider than the init, so that routing and
    next-token choices vary (tests of padding and long generation need varied tokens)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, std)
    return model


@pytest.fixture
def one_thread():
    """torch on one intra-op thread for the test: runs compared bit for bit must use the same thread
    count, and a forked child (tests/train/crash.py) runs on one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    random.seed(0)


def make_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Word-for-word 'translations' over a 16-word lexicon: learnable by a tiny model."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        idx = [rng.randrange(len(EN)) for _ in range(rng.randint(2, 6))]
        pairs.append((" ".join(EN[i] for i in idx).capitalize() + ".", " ".join(DE[i] for i in idx).capitalize() + "."))
    return pairs


@pytest.fixture
def tiny_multi30k(tmp_path, monkeypatch):
    """A miniature Multi30k folder (train/val/test_2016_flickr, en/de) found through $ATTNLAB_DATA."""
    root = tmp_path / "data"
    folder = root / "multi30k"
    folder.mkdir(parents=True)
    for split, n, seed in (("train", 200, 0), ("val", 20, 1), ("test_2016_flickr", 20, 2)):
        pairs = make_pairs(n, seed)
        (folder / f"{split}.en").write_text("".join(e + "\n" for e, _ in pairs), encoding="utf-8")
        (folder / f"{split}.de").write_text("".join(d + "\n" for _, d in pairs), encoding="utf-8")
    monkeypatch.setenv("ATTNLAB_DATA", str(root))
    return folder


# ----------------------------------------------------------------------------- tiny translation runs
TINY = ["d_model=32", "n_heads=4", "n_encoder_layers=1", "n_decoder_layers=1", "d_ff=64", "dropout=0.1",
        "tokenizer_vocab_size=300", "batch_tokens=200", "batch_tokens_start=80",
        "batch_rampup=3",  # the recipe's batch warm-up, scaled down: resume tests cross it
        "warmup_steps=5", "eval_every=4",
        "checkpoint_every=2", "eval_bleu_sentences=5", "log_every=1", "average_last=2", "minutes=none",
        "warmup_ratio=0",  # tests resume with a longer --steps: the warm-up must not follow the horizon here
                           # (the recipe's warmup_ratio rule: tests/train/test_warmup_ratio.py)
        "autocast=none"]   # fp32 on every CI host (the recipe's bf16 step on bf16 CPUs: tests/train/test_speed.py)


def tiny_recipe(steps, extra=()):
    """The multi30k-en-de recipe shrunk to a few seconds (with the tiny_multi30k fixture)."""
    return get_recipe("multi30k-en-de").with_overrides(TINY + [f"max_steps={steps}", *extra])


# ----------------------------------------------------------------------------- tiny language-model runs
WORDS = "to be or not that is the question whether tis nobler in mind suffer slings and arrows".split()
TINY_LM = ["d_model=32", "n_heads=4", "n_layers=2", "max_seq_len=16", "block_size=16", "batch_size=8",
           "lr=0.01", "min_lr=0.001", "warmup_steps=5", "lr_decay_steps=30", "eval_every=10",
           "checkpoint_every=10", "log_every=5",
           "autocast=none"]  # fp32 on every host: runs are compared across process counts and resumes to 1e-5,
                             # and bf16's rounding follows the batch split (the recipe's bf16 choice: tests/train/test_speed.py)


def tiny_text(n_sentences=150, seed=0) -> str:
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 6))).capitalize() + "." for _ in range(n_sentences)]
    return "To be or not to be.\n" + "\n".join(lines) + "\n"


@pytest.fixture
def tiny_shakespeare(tmp_path, monkeypatch):
    """A few KB of simple sentences as tinyshakespeare/input.txt, the only place searched."""
    root = tmp_path / "data"
    (root / "tinyshakespeare").mkdir(parents=True)
    text = tiny_text()
    (root / "tinyshakespeare" / "input.txt").write_text(text, encoding="utf-8")
    monkeypatch.setenv("ATTNLAB_DATA", str(root))
    monkeypatch.setattr(datasets, "search_path", lambda: [root])
    return text


def tiny_lm_recipe(steps, extra=()):
    """The shakespeare-char recipe shrunk to a few seconds (with the tiny_shakespeare fixture)."""
    return get_recipe("shakespeare-char").with_overrides(TINY_LM + [f"max_steps={steps}", *extra])


# ----------------------------------------------------------------------------- tiny chat model (fine-tuning)
CHAT_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                 "{{ '<|im_start|>system\\nYou are a helpful AI assistant<|im_end|>\\n' }}{% endif %}"
                 "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def make_chat_base(out, d_model: int = 64, seed: int = 0):
    """A tiny random LLaMA-style instruction model as a Hugging Face directory: a byte-level BPE over
    make_pairs' words with SmolLM2's chat tokens (<|im_start|>, <|im_end|> = eos) and chat template."""
    import json

    from attnlab.interop.hf import save_hf
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.tokenizers import ByteLevelBPE

    pairs = make_pairs(300, seed)
    texts = [e for e, _ in pairs] + [d for _, d in pairs] + ["Translate to German: You are a helpful AI assistant"]
    tok = ByteLevelBPE.train(texts, 400, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    ids = tok.special_tokens
    torch.manual_seed(seed)
    cfg = GPTConfig.from_name("llama", vocab_size=tok.vocab_size, d_model=d_model, n_layers=2, n_heads=4,
                              n_kv_heads=2, max_seq_len=256, bos_id=ids["<|im_start|>"], eos_id=ids["<|im_end|>"])
    save_hf(GPT(cfg), out, tok)
    config = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}))
    return out


@pytest.fixture(scope="session")
def tiny_chat_base(tmp_path_factory):
    return make_chat_base(tmp_path_factory.mktemp("chat-base") / "base")


TINY_FT = ["eval_every=10", "eval_sentences=8", "batch_tokens=400", "lr=0.01", "warmup_steps=2", "minutes=none",
           "log_every=1", "checkpoint_every=5", "max_new_tokens=24"]


def tiny_finetune_recipe(base, steps, extra=()):
    """smollm2-lora-multi30k on a tiny chat base (with the tiny_multi30k fixture), a few seconds."""
    return get_recipe("smollm2-lora-multi30k").with_overrides(TINY_FT + [f"base={base}", f"max_steps={steps}",
                                                                          *extra])

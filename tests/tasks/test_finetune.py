"""Fine-tune runs (tasks/finetune.py) on a tiny chat model: a LoRA run is a PEFT adapter directory that
peft + transformers load with our logits, it resumes bit for bit, evaluates to sacreBLEU, loads for
generation and converts to a merged model; full and quantized-base variants; bad settings refused."""
from __future__ import annotations

import json

import pytest
import torch

from attnlab.convert import convert
from attnlab.interop.hf import load_hf
from attnlab.load import load_causal_lm
from attnlab.models.gpt import GPT
from attnlab.nn.lora import LoRALinear, lora_layers
from attnlab.nn.quant_linear import QuantLinear
from attnlab.tasks.registry import evaluate_run, get_task, load_run
from attnlab.tensorfile import read_tensors
from attnlab.train.checkpoint import load_weights
from attnlab.train.run_dir import has_checkpoint
from tests.conftest import tiny_finetune_recipe
from tests.train.crash import assert_same_run, kill_at

IDS = torch.tensor([[1, 40, 41, 42, 43, 44, 45, 46]])


def train(base, out, steps, extra=(), resume=False):
    recipe = tiny_finetune_recipe(base, steps, extra)
    return get_task(recipe.model_type).train(recipe, out, resume=resume)


@pytest.fixture(scope="module")
def lora_run(tiny_chat_base, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        folder = tmp_path_factory.mktemp("ft-data") / "multi30k"
        _write_multi30k(folder)
        mp.setenv("ATTNLAB_DATA", str(folder.parent))
        out = tmp_path_factory.mktemp("ft") / "lora"
        record = train(tiny_chat_base, out, 12)
    return out, record, folder.parent


def _write_multi30k(folder):
    from tests.conftest import make_pairs
    folder.mkdir(parents=True)
    for split, n, seed in (("train", 200, 0), ("val", 20, 1), ("test_2016_flickr", 20, 2)):
        pairs = make_pairs(n, seed)
        (folder / f"{split}.en").write_text("".join(e + "\n" for e, _ in pairs), encoding="utf-8")
        (folder / f"{split}.de").write_text("".join(d + "\n" for _, d in pairs), encoding="utf-8")


def test_a_lora_run_is_a_peft_adapter_directory(lora_run, tiny_chat_base):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    out, record, _ = lora_run
    assert record["steps"] == 12
    assert (out / "adapter_model.safetensors").is_file() and not (out / "model.safetensors").is_file()
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_chat_base) and config["r"] == 8
    checkpoint = read_tensors(out / "checkpoint" / "model.safetensors")
    assert checkpoint and all(".lora_" in k for k in checkpoint)  # the checkpoint holds the adapters only
    run = load_run(out)
    assert not lora_layers(run.model)  # merged into the fp32 base for inference
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_chat_base), dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(hf, str(out)).eval()
    with torch.no_grad():
        ours, expected = run.model(IDS).logits, theirs(IDS).logits
    assert float((ours - expected).abs().max()) <= 1e-4 * float(expected.abs().max())


def test_resume_is_bit_identical(tiny_chat_base, lora_run, tmp_path, monkeypatch, one_thread):
    monkeypatch.setenv("ATTNLAB_DATA", str(lora_run[2]))
    train(tiny_chat_base, tmp_path / "whole", 12)
    train(tiny_chat_base, tmp_path / "parts", 7)
    train(tiny_chat_base, tmp_path / "parts", 12, resume=True)
    a = read_tensors(tmp_path / "whole" / "adapter_model.safetensors")
    b = read_tensors(tmp_path / "parts" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    last = [json.loads(x) for x in (tmp_path / d / "metrics.jsonl" for d in ("whole", "parts"))
            for x in [x.read_text().splitlines()[-1]]]
    assert last[0]["val_loss"] == last[1]["val_loss"]


# kill -9 at file events of a LoRA run (12 steps: checkpoints at 0, 5, 10, 12; the best adapter at 10 and 12)
KILLS = {"inside a checkpoint's Adam moments": "partial:*/.checkpoint.*.tmp/optimizer.safetensors#2",
         "checkpoint swapped, old one not deleted": "swapped:*/checkpoint#3",
         "inside the best adapter": "partial:{out}/adapter_model.safetensors#1"}


@pytest.mark.parametrize("point", list(KILLS))
def test_a_killed_lora_run_resumes_to_the_uninterrupted_run(tiny_chat_base, lora_run, tmp_path, monkeypatch,
                                                            one_thread, point):
    monkeypatch.setenv("ATTNLAB_DATA", str(lora_run[2]))
    train(tiny_chat_base, tmp_path / "whole", 12)
    out = tmp_path / "killed"
    kill_at(lambda: train(tiny_chat_base, out, 12), KILLS[point].format(out=out))
    train(tiny_chat_base, out, 12, resume=has_checkpoint(out))
    assert_same_run(tmp_path / "whole", out)  # adapters, Adam moments, best adapter, metrics: bit for bit


def test_evaluate_generate_and_convert(lora_run, tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    out, _, data = lora_run
    monkeypatch.setenv("ATTNLAB_DATA", str(data))
    record = evaluate_run(out, "test", limit=6)
    assert record["split"] == "test_2016_flickr" and record["n"] == 6 and record["beam"] == 1 and "bleu" in record
    assert evaluate_run(out, "test", limit=3, beam=2)["beam"] == 2
    loaded = load_causal_lm(str(out))
    assert loaded.chat_template and loaded.special["eos"] == "<|im_end|>"
    convert(str(out), tmp_path / "merged")
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32)
    with torch.no_grad():
        assert torch.allclose(merged(IDS).logits, loaded.model(IDS).logits, atol=1e-5)
    assert "chat_template" in json.loads((tmp_path / "merged" / "tokenizer_config.json").read_text())
    record = convert(str(out), tmp_path / "merged.gguf", "q8_0")
    assert record["type"] == "q8_0" and (tmp_path / "merged.gguf").is_file()


def test_full_finetune_learns_and_needs_no_base(tiny_chat_base, lora_run, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_DATA", str(lora_run[2]))
    record = train(tiny_chat_base, tmp_path / "full", 30, ["lora_rank=0", "lr=0.003", "eval_every=30"])
    first = json.loads((tmp_path / "full" / "metrics.jsonl").read_text().splitlines()[0])
    assert (tmp_path / "full" / "model.safetensors").is_file() and not (tmp_path / "full" / "adapter_config.json").exists()
    assert record["val_loss"] < 0.6 * first["loss"]  # the response tokens are learnable (word-for-word pairs)
    run = load_run(tmp_path / "full")
    assert run.model.num_parameters() == record["parameters"] and not lora_layers(run.model)
    ref = GPT(run.model.cfg)  # randomly initialised, then the run's weights: what GPT.for_loading skips
    load_weights(ref, tmp_path / "full" / "model.safetensors")
    x = torch.randint(run.model.cfg.vocab_size, (1, 12))
    with torch.no_grad():
        assert torch.equal(run.model(x).logits, ref.eval()(x).logits)


def test_quantized_base_keeps_its_kernels(tiny_chat_base, lora_run, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_DATA", str(lora_run[2]))
    train(tiny_chat_base, tmp_path / "qlora", 4, ["base_dtype=q8_0", "eval_every=4"])
    run = load_run(tmp_path / "qlora")
    layers = lora_layers(run.model)
    assert layers and all(isinstance(m, LoRALinear) and isinstance(m.base_layer, QuantLinear) for m in layers.values())
    assert not any(type(m) is torch.nn.Linear for m in run.model.modules())


def test_a_peft_trained_adapter_loads(tiny_chat_base, tmp_path):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_chat_base), dtype=torch.float32)
    tuned = peft.get_peft_model(hf, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "down_proj"]))
    with torch.no_grad():
        for name, p in tuned.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
        expected = tuned.eval()(IDS).logits
    tuned.save_pretrained(str(tmp_path / "adapter"))  # base_model_name_or_path: the base directory
    loaded = load_causal_lm(str(tmp_path / "adapter"))
    assert loaded.chat_template  # the base's
    with torch.no_grad():
        assert float((loaded.model(IDS).logits - expected).abs().max()) <= 1e-4 * float(expected.abs().max())


@pytest.mark.parametrize("extra, match", [(["lora_rank=0", "base_dtype=q8_0"], "full fine-tune"),
                                          (["lora_targets=q_proj,qkv"], "lora_targets"),
                                          (["instruction=Translate"], "instruction")])
def test_bad_settings_are_refused_by_name(tiny_chat_base, extra, match):
    with pytest.raises(ValueError, match=match):
        tiny_finetune_recipe(tiny_chat_base, 2, extra)


def test_a_base_without_chat_template_is_refused(tiny_chat_base, lora_run, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_DATA", str(lora_run[2]))
    model, _ = load_hf(tiny_chat_base)
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (plain / name).write_bytes((tiny_chat_base / name).read_bytes())
    with pytest.raises(ValueError, match="no chat template"):
        train(plain, tmp_path / "run", 2)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_train_the_adapters_of_one(tiny_chat_base, lora_run, tmp_path, monkeypatch, one_thread,
                                                 parallel):
    from tests.conftest import TINY_FT
    from tests.train.distributed_runs import max_difference, one_process, torchrun, weights
    argv = ["--recipe", "smollm2-lora-multi30k", *(a for s in TINY_FT for a in ("--set", s)),
            "--set", f"base={tiny_chat_base}", "--set", "eps=1e-4", "--steps", "5"]
    one_process(monkeypatch, lora_run[2], [*argv, "--out", str(tmp_path / "one")])
    result = torchrun(lora_run[2], [*argv, "--set", f"parallel={parallel}", "--out", str(tmp_path / "two")])
    assert result.returncode == 0, result.stderr[-3000:]
    assert max_difference(weights(tmp_path / "one"), weights(tmp_path / "two")) < 1e-5
    assert (tmp_path / "two" / "adapter_model.safetensors").is_file()

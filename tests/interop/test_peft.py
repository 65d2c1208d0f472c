"""PEFT's adapter format (interop/peft.py): our adapter loaded by peft + transformers gives our logits,
a peft adapter loaded by us gives theirs (1e-4 of the largest logit), and what we do not implement
is refused by name."""
from __future__ import annotations

import json

import pytest
import torch

from attnlab.interop.hf import load_hf, save_hf
from attnlab.interop.peft import AdapterSettings, load_adapter, read_adapter_config, save_adapter
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn.lora import apply_lora, lora_layers

transformers = pytest.importorskip("transformers", reason="needs transformers (pip install 'attnlab[hf]')")
peft = pytest.importorskip("peft", reason="needs peft (pip install 'attnlab[hf]')")

IDS = torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = GPTConfig.from_name("llama", vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    out = tmp_path_factory.mktemp("peft") / "base"
    save_hf(GPT(cfg), out)
    return out


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return float((a - b).detach().abs().max()) <= 1e-4 * float(b.detach().abs().max())


def test_our_adapter_in_peft_gives_our_logits(base_dir, tmp_path):
    model, _ = load_hf(base_dir)
    targets = ["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]
    apply_lora(model, targets, rank=4, alpha=8)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.weight.normal_(0, 0.2)
    ours = model(IDS).logits
    save_adapter(model, tmp_path / "adapter", AdapterSettings(4, 8.0, targets, base=str(base_dir)))
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["base_model_name_or_path"] == str(base_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    assert _close(theirs(IDS).logits, ours)


@pytest.mark.parametrize("options", [dict(target_modules=["k_proj", "up_proj"], use_rslora=True),
                                     dict(target_modules="all-linear", rank_pattern={"down_proj": 2}),
                                     dict(target_modules=r".*\.self_attn\.(q|v)_proj")])
def test_a_peft_adapter_in_attnlab_gives_peft_logits(base_dir, tmp_path, options):
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    torch.manual_seed(1)
    tuned = peft.get_peft_model(hf, peft.LoraConfig(r=3, lora_alpha=5, **options))
    with torch.no_grad():
        for name, p in tuned.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    theirs = tuned.eval()(IDS).logits
    tuned.save_pretrained(str(tmp_path / "adapter"))
    model, _ = load_hf(base_dir)
    settings = load_adapter(model, tmp_path / "adapter")
    assert settings.rank == 3 and settings.alpha == 5
    assert _close(model(IDS).logits, theirs)


@pytest.mark.parametrize("field, value", [("use_dora", True), ("bias", "all"), ("modules_to_save", ["lm_head"]),
                                          ("layers_to_transform", [0]), ("peft_type", "IA3")])
def test_unsupported_options_are_refused_by_name(tmp_path, field, value):
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], field: value}
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=field if field != "peft_type" else "LoRA adapters"):
        read_adapter_config(tmp_path / "adapter_config.json")


def test_pickled_and_mismatched_adapters_are_refused(base_dir, tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                                                              "target_modules": ["q_proj"]}))
    (tmp_path / "adapter_model.bin").write_bytes(b"pickle")
    model, _ = load_hf(base_dir)
    with pytest.raises(ValueError, match="never unpickles"):
        load_adapter(model, tmp_path)
    other, _ = load_hf(base_dir)
    apply_lora(other, ["q_proj", "k_proj"], rank=4, alpha=8)
    save_adapter(other, tmp_path / "two", AdapterSettings(4, 8.0, ["q_proj", "k_proj"]))
    (tmp_path / "two" / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}))
    model, _ = load_hf(base_dir)
    with pytest.raises(ValueError, match="unexpected tensors"):
        load_adapter(model, tmp_path / "two")

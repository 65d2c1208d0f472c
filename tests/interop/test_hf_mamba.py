"""Mamba <-> Hugging Face MambaForCausalLM: same logits as transformers' pure-PyTorch path on tiny random
models (both directions, left padding too), round trips bit-identical, unsupported options refused by
name, mismatched tensors listed."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

from attnlab.generate import generate  # noqa: E402
from attnlab.interop.hf_mamba import load_mamba_hf, mamba_config_from_hf, save_mamba_hf  # noqa: E402
from attnlab.models.mamba import Mamba, MambaConfig  # noqa: E402

TOL = 1e-5
SIZES = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, state_size=8, bos_token_id=1, eos_token_id=2,
             pad_token_id=0)
HF_CASES = {
    "default": {},
    "untied_biases_rank": dict(tie_word_embeddings=False, use_bias=True, use_conv_bias=False, time_step_rank=5,
                               conv_kernel=3, expand=3),
}


def _perturb(module: torch.nn.Module, seed: int = 0) -> None:
    """Random noise on every parameter, so unit norms, D = 1 and zero biases are mapped visibly."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


def _hf_model(**kwargs):
    torch.manual_seed(0)
    model = transformers.MambaForCausalLM(transformers.MambaConfig(**{**SIZES, **kwargs}))
    _perturb(model)
    return model.eval()


def _batch(pad: int = 0):
    """Two rows of 12 tokens, the second left-padded by `pad`."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 100, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :pad] = 0
    ids[1, :pad] = 0
    return ids, mask


def _max_diff(ours: Mamba, hf_model, pad: int = 0) -> float:
    ids, mask = _batch(pad)
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).logits
        b = hf_model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    real = mask.bool()
    return (a[real] - b[real]).abs().max().item()


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_transformers_model_loads_with_the_same_logits(case, tmp_path):
    hf_model = _hf_model(**HF_CASES[case])
    hf_model.save_pretrained(tmp_path / "hf")
    ours, _ = load_mamba_hf(tmp_path / "hf")
    assert _max_diff(ours, hf_model) < TOL
    if not HF_CASES[case].get("use_bias"):  # transformers lets in_proj's bias of padding into the conv
        assert _max_diff(ours, hf_model, pad=4) < TOL


def test_saved_model_loads_in_transformers_with_the_same_logits_and_generation(tmp_path):
    torch.manual_seed(0)
    ours = Mamba(MambaConfig(vocab_size=100, d_model=32, n_layers=2, d_state=8, bos_id=1, eos_id=2)).eval()
    _perturb(ours)
    save_mamba_hf(ours, tmp_path / "out")
    hf_model = transformers.MambaForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert _max_diff(ours, hf_model) < TOL
    ids = _batch()[0][:1, :5]
    hf_tokens = hf_model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None,
                                  pad_token_id=0)[0, 5:].tolist()
    assert generate(ours, [ids[0].tolist()], max_new_tokens=8, stop_tokens=[]) == [hf_tokens]


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_round_trip_is_bit_identical(case, tmp_path):
    _hf_model(**HF_CASES[case]).save_pretrained(tmp_path / "hf")
    ours, _ = load_mamba_hf(tmp_path / "hf")
    save_mamba_hf(ours, tmp_path / "again")
    first, second = load_file(str(tmp_path / "hf" / "model.safetensors")), load_file(str(tmp_path / "again" / "model.safetensors"))
    if ours.cfg.tie_embeddings:  # transformers 5 writes the tied head too; we leave it out, as it does on load
        first.pop("lm_head.weight", None)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    back, _ = load_mamba_hf(tmp_path / "again")
    assert back.cfg == ours.cfg
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), back.state_dict().values()))


@pytest.mark.parametrize("field,value,match", [
    ("hidden_act", "gelu", "hidden_act='gelu'"),
    ("expand", 1.5, "expand=1.5"),
    ("intermediate_size", 50, "intermediate_size=50"),
    ("time_step_init_scheme", "uniform", "dt_init must be one of"),
    ("architectures", ["Mamba2ForCausalLM"], "not a MambaForCausalLM"),
    ("state_size", 0, "d_state must be a positive integer"),
])
def test_unsupported_options_are_refused_by_name(field, value, match):
    hf = {**SIZES, "architectures": ["MambaForCausalLM"], "model_type": "mamba", field: value}
    with pytest.raises(ValueError, match=match):
        mamba_config_from_hf(hf)


def test_options_that_do_not_change_the_computation_are_accepted():
    hf = {**SIZES, "model_type": "mamba", "use_mambapy": True, "use_associative_scan": False,
          "rescale_prenorm_residual": True, "residual_in_fp32": False, "eos_token_id": [2, 3]}
    cfg = mamba_config_from_hf(hf)
    assert cfg.rescale_prenorm_residual and not cfg.residual_in_fp32 and cfg.eos_id == 2 and cfg.delta_rank == 2


def test_mismatched_tensors_are_listed(tmp_path):
    _hf_model().save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "model.safetensors"
    tensors = load_file(str(path))
    tensors.pop("backbone.layers.1.mixer.A_log")
    tensors["backbone.layers.0.mixer.D"] = torch.zeros(3)
    save_file(tensors, str(path))
    with pytest.raises(ValueError, match=r"missing tensors: backbone.layers.1.mixer.A_log \(64, 8\).*"
                                         r"wrong shapes: backbone.layers.0.mixer.D is \(3,\)"):
        load_mamba_hf(tmp_path / "hf")


def test_save_refuses_another_model_and_a_foreign_directory(tmp_path):
    with pytest.raises(TypeError, match="attnlab Mamba"):
        save_mamba_hf(torch.nn.Linear(2, 2), tmp_path / "x")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    model = Mamba(MambaConfig(vocab_size=10, d_model=8, n_layers=1, d_state=2))
    with pytest.raises(ValueError, match="notes.txt"):
        save_mamba_hf(model, tmp_path / "busy")
    save_mamba_hf(model, tmp_path / "ok")
    assert json.loads((tmp_path / "ok" / "config.json").read_text())["architectures"] == ["MambaForCausalLM"]

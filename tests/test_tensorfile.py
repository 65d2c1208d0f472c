"""tensorfile.py: no non-finite tensor is ever written; every tensor read is validated (checksum,
finiteness, names, shapes, dtypes), each error one line naming the file and the tensor (issue 13,
cases 7 and 8)."""
import os

import pytest
import torch
from safetensors.torch import load_model, save_file

from attnlab.models.gpt import GPT, GPTConfig
from attnlab.tensorfile import load_model_weights, model_tensors, read_tensors, save_tensors


def _gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_seq_len=8, tie_embeddings=True))


def test_a_non_finite_tensor_is_never_written(tmp_path):
    path = tmp_path / "w.safetensors"
    for bad in (float("nan"), float("inf")):
        with pytest.raises(FloatingPointError, match=r"refusing to write .*w\.safetensors: tensor 'b' holds 1 "):
            save_tensors(path, {"a": torch.zeros(3), "b": torch.tensor([1.0, bad])})
        assert os.listdir(tmp_path) == []


def test_garbled_bytes_that_still_parse_are_caught_by_the_checksum(tmp_path):
    path = tmp_path / "w.safetensors"
    save_tensors(path, {"w": torch.arange(1000, dtype=torch.float32)})
    data = bytearray(path.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = bytes(range(64))  # finite floats, valid header
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"w\.safetensors is damaged: its tensor data does not match the checksum"):
        read_tensors(path)


def test_a_file_without_checksum_is_still_checked_for_finiteness(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.tensor([1.0, float("nan")])}, str(path))  # written by someone else
    with pytest.raises(ValueError, match=r"tensor 'w' holds 1 non-finite values"):
        read_tensors(path)


def test_names_shapes_and_dtypes_are_checked_against_the_model(tmp_path):
    model, path = _gpt(), tmp_path / "model.safetensors"
    tensors, meta = model_tensors(model)
    for change, message in (
            (lambda t: t.update({"norm.weight": t["norm.weight"].double()}), "'norm.weight' is float64, the model's"),
            (lambda t: t.update({"norm.weight": torch.ones(3)}), r"'norm.weight' has shape \(3,\), the model's is"),
            (lambda t: t.pop("norm.weight"), r"missing tensors \['norm.weight'\]"),
            (lambda t: t.update({"extra": torch.ones(1)}), r"unexpected tensors \['extra'\]")):
        damaged = dict(tensors)
        change(damaged)
        save_file(damaged, str(path), metadata=meta)
        with pytest.raises(ValueError, match=message):
            load_model_weights(_gpt(), path)


def test_tied_weights_are_written_once_and_read_by_us_and_by_safetensors(tmp_path):
    model, path = _gpt(), tmp_path / "model.safetensors"
    tensors, meta = model_tensors(model)
    assert len(tensors) == len(model.state_dict()) - 1 and set(meta.values()) <= set(tensors)
    save_tensors(path, tensors, meta)
    other = _gpt()
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    load_model_weights(other, path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    assert other.lm_head.weight is other.embed_tokens.weight
    missing, unexpected = load_model(_gpt(), str(path))
    assert not missing and not unexpected

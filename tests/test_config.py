"""config.py: a config read from a dict (a run's config.json) checks each value's type and
finiteness by field name (issue 13, cases 7 and 8)."""
import dataclasses
from dataclasses import dataclass
from typing import Literal, Optional, Union

import pytest

from attnlab.config import Config, parse_value
from attnlab.models.gpt import GPTConfig
from attnlab.models.mamba import MambaConfig
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.recipes import get_recipe


@dataclass
class Example(Config):
    size: int = 1                     # an int
    rate: float = 0.5                 # a float
    flag: bool = False                # a bool
    limit: Optional[float] = None     # a float or None
    rank: Union[int, Literal["auto"]] = "auto"  # an int or a named choice
    kind: Literal["a", "b"] = "a"     # a choice


@pytest.mark.parametrize("field, value, message", [
    ("size", "x", "size must be int, got 'x'"),
    ("size", 2.0, "size must be int, got 2.0"),
    ("size", True, "size must be int, got True"),
    ("rate", "0.1", "rate must be float, got '0.1'"),
    ("rate", float("inf"), "rate must be a finite number, got inf"),
    ("flag", 1, "flag must be bool, got 1"),
    ("limit", float("nan"), "limit must be a finite number, got nan"),
    ("rank", "x", "rank must be int or 'auto', got 'x'"),
    ("kind", 3, "kind must be one of 'a', 'b', got 3"),
    ("size", None, "size must not be null"),
])
def test_from_dict_names_the_field_of_a_value_of_the_wrong_type(field, value, message):
    with pytest.raises(ValueError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        Example.from_dict({field: value})


def test_from_dict_takes_values_of_the_right_type():
    cfg = Example.from_dict({"size": 3, "rate": 1, "flag": True, "limit": None, "rank": 4, "kind": "b"})
    assert cfg == Example(3, 1.0, True, None, 4, "b") and isinstance(cfg.rate, float)
    assert Example.from_dict({"rank": "auto", "limit": 2.5}).rank == "auto"


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "1e999"])
def test_set_refuses_non_finite_numbers(text):
    with pytest.raises(ValueError, match="rate must be a finite number"):
        parse_value(Example, "rate", text)


def test_derived_sizes_follow_the_settings_they_derive_from():
    """Regression: n_kv_heads, d_ff and dt_rank were written into the config when derived, so an
    override of d_model (--set d_model=..., dataclasses.replace) kept the old width's FFN size."""
    cfg = GPTConfig(vocab_size=16, d_model=64, n_heads=4, n_layers=1)
    assert (cfg.n_kv_heads, cfg.d_ff, cfg.kv_heads, cfg.ffn_dim) == (None, None, 4, 256)
    wider = dataclasses.replace(cfg, d_model=128, n_heads=8)
    assert (wider.kv_heads, wider.ffn_dim) == (8, 512)
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg and cfg.to_dict()["d_ff"] is None
    assert dataclasses.replace(cfg, activation="swiglu").ffn_dim == 192  # 8/3 · 64, rounded up to 32
    recipe = get_recipe("shakespeare-char").with_overrides(["d_model=256"])
    assert recipe.model.ffn_dim == 4 * 256 and recipe.model.kv_heads == recipe.model.n_heads
    mamba = MambaConfig(vocab_size=16, d_model=64, n_layers=1)
    assert (mamba.dt_rank, mamba.delta_rank, dataclasses.replace(mamba, d_model=160).delta_rank) == ("auto", 4, 10)
    assert Seq2SeqConfig(d_model=32, n_heads=4).ffn_dim == 128
    # an older config.json wrote the derived values: they read as explicit settings, the same sizes
    old = GPTConfig.from_dict({**cfg.to_dict(), "n_kv_heads": 4, "d_ff": 256})
    assert (old.kv_heads, old.ffn_dim) == (4, 256)
    with pytest.raises(ValueError, match="n_kv_heads must be a divisor of n_heads=4, got 3"):
        GPTConfig(vocab_size=16, d_model=64, n_heads=4, n_kv_heads=3)

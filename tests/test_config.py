"""config.py: a config read from a dict (a run's config.json) checks each value's type and
finiteness by field name (issue 13, cases 7 and 8)."""
from dataclasses import dataclass
from typing import Literal, Optional, Union

import pytest

from attnlab.config import Config, parse_value


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

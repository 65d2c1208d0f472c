"""The base of every configuration dataclass: JSON round trips, validation helpers, `--set` parsing.

Each config lives with its owner (a model's beside the model, a task's data settings with the task,
TrainConfig with the loop). Every field has a comment; invalid values raise ValueError naming the
field and the allowed values. Choices are Literal strings so configs serialise to JSON.
"""
from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import fields
from typing import Literal

from attnlab.errors import UserError


def check(cond: bool, field: str, allowed: str, value) -> None:
    if not cond:
        raise UserError(f"{field} must be {allowed}, got {value!r}")


def check_finite(obj) -> None:
    """Every float field of config `obj` must be a finite number (refused by name: an lr of inf or
    NaN would make every weight NaN)."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float):
            check(math.isfinite(value), f.name, "a finite number", value)


def _type_error(name: str, hint, value) -> str | None:
    """Why `value` cannot be field `name` of type `hint` (None when it can)."""
    options = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
    if value is None:
        return None if type(None) in options else f"{name} must not be null"
    for option in options:
        if typing.get_origin(option) is Literal:
            if value in typing.get_args(option):
                return None
            continue
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return None if math.isfinite(value) else f"{name} must be a finite number, got {value!r}"
        if option in (int, str, bool) and type(value) is option:
            return None
    names = [("one of " if len(options) == 1 else "") + ", ".join(map(repr, typing.get_args(o)))
             if typing.get_origin(o) is Literal else o.__name__ for o in options if o is not type(None)]
    return f"{name} must be {' or '.join(names)}{' or null' if type(None) in options else ''}, got {value!r}"


def check_literals(obj) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        hint = hints[f.name]
        if typing.get_origin(hint) is Literal:
            allowed = typing.get_args(hint)
            value = getattr(obj, f.name)
            check(value in allowed, f.name, "one of " + ", ".join(map(repr, allowed)), value)


class Config:
    """JSON round-trip helpers shared by the config dataclasses (subclasses are dataclasses)."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        """The config of dict `d` (e.g. a section of a run's config.json), checked: known fields
        only, each value of its field's type (an int where an int is expected, a finite number for
        a float), then the config's own checks.

        Raises:
            ValueError: naming the field (and the allowed values).
        """
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise UserError(f"unknown {cls.__name__} field(s) {unknown}; known: {sorted(names)}")
        hints = typing.get_type_hints(cls)
        for name, value in d.items():
            problem = _type_error(name, hints[name], value)
            if problem:
                raise UserError(problem)
        float_fields = {n for n, h in hints.items() if h is float or h == typing.Optional[float]}
        return cls(**{k: float(v) if k in float_fields and isinstance(v, int) else v for k, v in d.items()})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)



def parse_value(cls, name: str, text: str):
    """Convert the text of a `--set name=text` to the type of field `name` of dataclass `cls`.

    Raises:
        ValueError: naming the field and the expected type when the text does not parse.
    """
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is Literal:
        return text
    if text.lower() in ("none", "null") and type(None) in typing.get_args(hint):
        return None
    choices = [c for a in args if typing.get_origin(a) is Literal for c in typing.get_args(a)]
    if text in choices:  # e.g. dt_rank: Union[int, Literal["auto"]]
        return text
    args = [a for a in args if typing.get_origin(a) is not Literal]
    base = args[0] if typing.get_origin(hint) is typing.Union else hint
    try:
        if base is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "1")
        value = base(text)
    except ValueError:
        raise UserError(f"{name} must be {getattr(base, '__name__', base)}, got {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{name} must be a finite number, got {text!r}")
    return value

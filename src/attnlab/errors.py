"""The errors attnlab raises for bad input, in one place.

Bad input is anything the caller can fix: a setting out of range, a name that is not known, a
damaged file, a model of the wrong kind for what was asked, training settings that diverge. The
library raises UserError (a ValueError) for it, or one of its two subclasses that are also the
builtin error a caller may expect (UnknownName is a KeyError, NonFiniteError a FloatingPointError);
missing or unusable files stay OSErrors (FileNotFoundError, FileExistsError ...). The command line
prints these as one line and exits with code 2; any other exception is a bug and keeps its
traceback.

Messages name parameters as the Python API does, as `name=value` ("dtype='q2'", "out=runs/x",
"resume=True"); an error lists the parameters it names in `params`, and the command line writes each
as its flag ("--dtype q2", "--out runs/x", "--resume").
"""
from __future__ import annotations


class UserError(ValueError):
    """Bad input: the message says what is wrong and what is allowed.

    Args:
        message: one line. param: the parameter(s) the message names as `name=value`, as the
            Python API calls them (e.g. "dtype"); the command line writes those as flags.
    """

    def __init__(self, message: str, *, param: str | tuple[str, ...] = ()):
        super().__init__(message)
        self.params = (param,) if isinstance(param, str) else tuple(param)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownName(UserError, KeyError):
    """A name that is not known (a data set, a token, a tensor): also a KeyError, for lookups."""


class NonFiniteError(UserError, FloatingPointError):
    """Numbers that must be finite are not: a training step that diverged, a tensor refused on save."""


def naming(error: BaseException, *params: str) -> BaseException:
    """`error` (e.g. a FileExistsError) marked, as UserError's `param` marks a UserError, as naming
    `params` in its message as `name=value`: the command line writes those as flags."""
    error.params = params
    return error

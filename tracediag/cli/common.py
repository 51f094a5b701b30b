"""What every command shares: the exit-code mapping of errors, and reading a user's file or failing
in one line."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tracediag.errors import one_line, shown

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

T = TypeVar("T")

EXIT_FINDING = 3
"""`analyze --fail-on` exits with this status when a finding of a named cause exists."""


class Finite(click.FloatRange):
    """A float option in its range and finite: click's `FloatRange` takes ``nan`` (no comparison fails)
    and ``inf``, which would pass a gate that can then never trip, or scale a model to nothing."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The number, or a usage error for nan and inf."""
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class Jobs(click.ParamType):
    """A process count: 0 (automatic) or N >= 1. A negative number or a non-number says both choices
    (click's "not in the range x>=0" left the user to guess what 0 means). More than the CPUs is capped."""

    name = "N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The count, or a usage error naming what is accepted."""
        if isinstance(value, int) and not isinstance(value, bool):
            jobs = value
        else:
            text = str(value).strip()
            jobs = int(text) if text.isascii() and text.lstrip("+-").isdigit() else None
        if jobs is None or jobs < 0:
            self.fail(f"{value!r}: give 0 (automatic) or a number of processes N >= 1", param, ctx)
        return jobs


class FilePath(click.Path):
    """A file option (`click.Path`) that is not empty: ``-o ""`` names no file and would be ignored as absent."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The path, or a usage error for an empty one."""
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path names no file", param, ctx)
        return super().convert(value, param, ctx)


class LazyChoice(click.Choice):
    """A `click.Choice` whose choices are looked up on first use (help, completion, a value to check):
    a command taking a preset name of the model (``--gpu``, ``--engine``) starts without importing the
    model. The option's own default converts to itself unlooked-up, as `click.Choice` would convert it
    (a test checks each such default is a choice), so a run without the option imports nothing either."""

    def __init__(self, load: Callable[[], Iterable[str]], *, case_sensitive: bool = True) -> None:
        self.load = load
        self.case_sensitive = case_sensitive

    @functools.cached_property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]
        """The choices, from `load` at the first call."""
        return tuple(self.load())

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The choice `value` names, or a usage error listing them."""
        if param is not None and isinstance(value, str) and value == param.default:
            return value
        return super().convert(value, param, ctx)


class InputError(click.ClickException):
    """Bad input or options: one line on stderr, exit status 2, no traceback."""

    exit_code = 2


FILE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError)
"""What a JSON file with a wrong-typed value (a string or a list where a number belongs, 1e400)
raises in the code that reads it; at the command line it is one line naming the file."""


def read_user_file(path: str | Path, option: str, read: Callable[[str | Path], T], what: str) -> T:
    """``read(path)`` for the file a user gave with `option`, or one line naming it: not a regular file
    (`regular_file`), or content `read` cannot use (`FILE_ERRORS`: "not a usable <what> (why)")."""
    regular_file(path, option)
    try:
        return read(path)
    except FILE_ERRORS as e:
        why = one_line(f"{type(e).__name__}: {e}")
        msg = f"{shown(path)}: not a usable {what} ({why})"
        raise InputError(msg) from None


def regular_file(path: str | Path, option: str) -> None:
    """`InputError` when `path` exists but is not a regular file: reading a FIFO with no writer would
    wait forever, and a device would never end."""
    if Path(path).exists() and not Path(path).is_file():
        msg = f"{shown(path)}: {option} must name a regular file"
        raise InputError(msg)

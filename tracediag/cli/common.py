"""What every command shares: the exit-code mapping of errors."""

from __future__ import annotations

import os
from pathlib import Path

import click

from tracediag.errors import shown

EXIT_FINDING = 3
"""`analyze --fail-on` exits with this status when a finding of a named cause exists."""


class InputError(click.ClickException):
    """Bad input or options: one line on stderr, exit status 2, no traceback."""

    exit_code = 2


def regular_file(path: str | Path, option: str) -> None:
    """`InputError` when `path` exists but is not a regular file: reading a FIFO with no writer would
    wait forever, and a device would never end."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise InputError(f"{shown(path)}: {option} must name a regular file")

"""What every command shares: the exit-code mapping of errors."""

from __future__ import annotations

import click

EXIT_FINDING = 3
"""`analyze --fail-on` exits with this status when a finding of a named cause exists."""


class InputError(click.ClickException):
    """Bad input or options: one line on stderr, exit status 2, no traceback."""

    exit_code = 2

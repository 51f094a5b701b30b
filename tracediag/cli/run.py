"""Run the command line to one exit status and at most one line on stderr, whatever ends it.

A signal, a closed pipe or a full disk are no bugs: each ends in its documented status without a
traceback. SIGTERM is raised as an exception in the main thread, like Ctrl-C, so that every pending
``finally`` runs: a half-written output's temporary file is removed and worker processes are stopped.
"""

from __future__ import annotations

import errno
import gc
import os
import signal
import sys
import warnings
from contextlib import suppress
from typing import TYPE_CHECKING, NoReturn

import click

from tracediag.errors import one_line

if TYPE_CHECKING:
    from types import FrameType

EXIT_INTERRUPTED = 130
"""SIGINT (Ctrl-C): 128 + 2, as a shell reports a process the signal ended."""
EXIT_TERMINATED = 143
"""SIGTERM: 128 + 15."""
EXIT_OUTPUT = 2
"""stdout could not take the output (a full disk, a closed pipe)."""


class Terminated(BaseException):
    """SIGTERM arrived: unwinds like `KeyboardInterrupt` (not an `Exception`, so no handler takes it)."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def run(command: click.Command) -> NoReturn:
    """Run `command` (click, not standalone) and exit with its status.

    0 ok; what a command raises `SystemExit` with (3 a finding); 2 a usage or input error (one line),
    or stdout full (one line) or closed (quiet: ``| head`` ended it); 130 Ctrl-C and 143 SIGTERM (one
    line each); 1 an internal error (one line; ``TRACEDIAG_DEBUG=1`` raises it with its traceback).
    """
    with suppress(ValueError):  # not the main thread: the caller owns signals
        signal.signal(signal.SIGTERM, _terminate)
    stdout = sys.stdout
    try:
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _one_line_warning
                status = command.main(standalone_mode=False)
            code = status if isinstance(status, int) else 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if sys.stdout is not stdout:  # click met EPIPE and swapped stdout for a quiet wrapper
                code = _closed_stdout()
            elif not isinstance(e.code, int) and e.code is not None:
                click.echo(e.code, err=True)
        _flush_stdout()
    except click.ClickException as e:
        e.show()
        code = e.exit_code
    except (KeyboardInterrupt, click.exceptions.Abort):
        code = _say("interrupted", EXIT_INTERRUPTED)
    except Terminated:
        code = _say("terminated", EXIT_TERMINATED)
    except OSError as e:
        if e.errno == errno.EPIPE:
            code = _closed_stdout()
        elif e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG):
            code = _say(f"cannot write the output ({one_line(e.strerror or str(e))})", EXIT_OUTPUT)
        else:
            code = _internal(e)
    except Exception as e:
        code = _internal(e)
    except BaseException as e:  # a Rust panic in polars is a BaseException: one line too, never a traceback
        if type(e).__name__ != "PanicException":
            raise
        code = _internal(e)  # type: ignore[arg-type]
    # The exit frees what is left; the interpreter's last collection, over every object the command
    # made, would find nothing to free (3% of the instructions of a tiny `analyze`).
    gc.freeze()
    sys.exit(code)


def _one_line_warning(message: Warning | str, category: type[Warning], *_: object, **__: object) -> None:
    """A warning as one line on stderr (Python's format adds the warning's source line and file)."""
    text = one_line(str(message))
    with suppress(OSError, ValueError):
        click.echo(text if text.startswith("tracediag") else f"tracediag: warning: {text}", err=True)


def _flush_stdout() -> None:
    """Flush now, so that a full disk or a closed pipe is seen here and not at interpreter exit."""
    if sys.stdout is not None:
        sys.stdout.flush()


def _closed_stdout() -> int:
    """The reader of stdout went away: nothing more to say to it; quiet, and no second EPIPE at exit."""
    with suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return EXIT_OUTPUT


def _say(line: str, code: int) -> int:
    with suppress(OSError, ValueError):
        if code == EXIT_OUTPUT:  # what stdout still holds cannot be written either
            _closed_stdout()
        click.echo(f"Error: {line}", err=True)
    return code


def _internal(e: Exception) -> int:
    if os.environ.get("TRACEDIAG_DEBUG"):
        raise e
    text = str(e).splitlines()[0] if str(e) else ""
    return _say(
        f"internal error ({type(e).__name__}: {text}); rerun with TRACEDIAG_DEBUG=1 for the traceback, "
        "and please report it",
        1,
    )

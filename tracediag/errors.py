"""Error types. Each message is one line that names the file (when there is one) and the problem."""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")


def shown(path: object) -> str:
    """A file name as it appears in a one-line message: control characters (a newline in a file
    name) escaped, so the message stays one line and cannot forge a second one."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(path))


def one_line(text: str) -> str:
    """`text` with its line breaks folded into spaces (library messages span several lines)."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


SHOWN_LINES = 20
"""Lines `capped` writes out before it counts the rest."""


def capped(lines: Sequence[str], *, limit: int = SHOWN_LINES, noun: str = "file") -> list[str]:
    """`lines` (`path: problem` each) for a terminal: the first `limit`, then one line counting the rest
    by problem (a folder of thousands of empty files is one line more, not thousands; `--format json`
    keeps every line)."""
    if len(lines) <= limit + 1:
        return list(lines)
    return [*lines[:limit], more_line(Counter(problem_of(line) for line in lines[limit:]), noun=noun)]


def problem_of(line: str) -> str:
    """The problem of a `path: problem` line, as `capped` counts it (its first 80 characters)."""
    return line.split(": ", 1)[-1][:80]


def more_line(by_problem: Counter[str], *, noun: str = "file") -> str:
    """The line `capped` ends with: how many lines more, the three commonest problems and their counts."""
    top = "; ".join(f"{problem}: {n:,}" for problem, n in by_problem.most_common(3))
    others = len(by_problem) - 3
    more = f"; {others:,} other problem{'s' if others > 1 else ''}" if others > 0 else ""
    return f"{by_problem.total():,} more {noun}s ({top}{more})"


class TracediagError(Exception):
    """Base class of every error tracediag raises on purpose (bad input, bad options)."""


class TraceError(TracediagError):
    """A trace file cannot be read: `path: problem`."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = str(path)
        self.problem = one_line(problem)
        super().__init__(f"{shown(self.path)}: {self.problem}")


class NotATraceError(TraceError):
    """The file is a well-formed document of another kind (JSON without `traceEvents`, an SQLite
    database that is not an Nsight export, a saved run among traces): in a directory scan such a
    file is a sidecar and is ignored; a damaged file (not JSON, an image, cut gzip) is an error."""


class RankError(TracediagError):
    """The rank of a file is unknown, or two files claim the same rank."""


class SpecError(TracediagError):
    """A model, device, link or split specification is invalid or impossible."""


class NoStepsError(TracediagError):
    """The traces hold no step markers the analysis can segment by."""


class OutputError(TracediagError):
    """An output cannot be written where asked (it is an input, its folder is missing, a device)."""


class MixedRunError(TracediagError):
    """The files given as one run are not ranks of one run (`same_run.check_same_run`)."""

"""Error types. Each message is one line that names the file (when there is one) and the problem."""

from __future__ import annotations


class TracediagError(Exception):
    """Base class of every error tracediag raises on purpose (bad input, bad options)."""


class TraceError(TracediagError):
    """A trace file cannot be read: `path: problem`."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


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

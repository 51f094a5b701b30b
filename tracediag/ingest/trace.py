"""What every reader returns: one file's event table and what the file says about itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl


@dataclass(frozen=True, slots=True)
class ProcessGroup:
    """A process group as the trace describes it."""

    name: str
    """The group's id as a string ("0", "1", ...), the key collectives refer to."""
    desc: str | None = None
    """Human description (`default_pg`, a user `group_desc`), when the trace has one."""
    size: int | None = None
    ranks: tuple[int, ...] | None = None
    """Global ranks in the group, when listed."""


@dataclass(frozen=True, slots=True)
class FileMeta:
    """What one trace file says about itself, plus what reading it skipped."""

    path: str
    format: str
    """"kineto", "nsys", "jax" or "timeline"."""
    rank: int
    world_size: int | None = None
    backend: str | None = None
    process_groups: tuple[ProcessGroup, ...] = ()
    time_base: str = "epoch"
    """"epoch": ts are Unix-epoch ns; "relative": the file has no absolute time base."""
    devices: tuple[str, ...] = ()
    """Device names from the trace (e.g. "NVIDIA A100-SXM4-80GB")."""
    host: str | None = None
    """The host the rank ran on, where the trace names it (Kineto's `host_name`, Nsight's `Hostname`): ranks
    of one host share one clock (`derive.collectives.clock_offsets`)."""
    events_in: int = 0
    """Input events seen in the file (every one is a row or counted in `skipped`)."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Input events that did not become rows, by reason (see `schema.SKIP_REASONS`)."""
    warnings: tuple[str, ...] = ()
    coords: dict[str, int] = field(default_factory=dict)
    """The rank's coordinates in the job's parallel layout (`dp`, `pp`, `tp`, `cp`, `ep`), where the
    input gives them (op-timeline tables)."""
    windows: tuple[str, ...] = ()
    """Further files of this rank, read as later profiler windows of its timeline (`run.merge_windows`):
    `path` is the first window's file, these the others in time order."""


@dataclass(frozen=True, slots=True, eq=False)
class FileTrace:
    """One file read: its events (event-table schema, `rank` filled) and its metadata."""

    events: pl.DataFrame
    meta: FileMeta

"""The watcher's restart state (``--state FILE``): what was reported, so a restarted watcher resumes.

One JSON object, replaced atomically (written beside, synced, renamed) after each window is
reported: the next window's index, the files of the windows reported (never read again), the recent
windows (so a late file is recognised), the ranks seen, and the change detector's history. A window
is marked reported when the caller asks for the next one, so a watcher killed while a window is
being handled reports that window again after its restart, under the same index and key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from tracediag.errors import TracediagError, one_line, shown
from tracediag.output import write_atomic
from tracediag.watching.windows import Done

STATE_VERSION = 1


@dataclass
class State:
    """What a watcher must remember across restarts (see the module docstring)."""

    location: str
    next_index: int = 1
    consumed: set[str] = field(default_factory=set)
    done: list[Done] = field(default_factory=list)
    known_ranks: set[int] = field(default_factory=set)
    detector: dict[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """The state as the bytes of its file (`--state`)."""
        return orjson.dumps(
            {
                "version": STATE_VERSION,
                "location": self.location,
                "next_index": self.next_index,
                "consumed": sorted(self.consumed),
                "done": [[*(d.steps or (None, None)), d.lo_ns, d.hi_ns, d.index] for d in self.done],
                "known_ranks": sorted(self.known_ranks),
                "detector": self.detector,
            }
        )


def load_state(path: str | Path, location: str) -> State:
    """The state saved at `path`, or a fresh one when the file does not exist. A damaged file, or one
    of another location, is a one-line `TracediagError`."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return State(location)
    except OSError as e:
        msg = f"{shown(path)}: cannot read the watch state ({e.strerror or e})"
        raise TracediagError(msg) from None
    try:
        d = orjson.loads(raw)
        if d.get("version") != STATE_VERSION:
            msg = f"version {d.get('version')!r}, this tracediag reads {STATE_VERSION}"
            raise ValueError(msg)
        if d["location"] != location:
            msg = f"it is the state of {d['location']!r}, not of {location!r}"
            raise ValueError(msg)
        done = [Done(None if lo is None else (lo, hi), t0, t1, i) for lo, hi, t0, t1, i in d.get("done", [])]
        return State(
            location=location,
            next_index=int(d["next_index"]),
            consumed=set(d.get("consumed", [])),
            done=done,
            known_ranks=set(d.get("known_ranks", [])),
            detector=dict(d.get("detector", {})),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
        msg = f"{shown(path)}: not a watch state file ({one_line(str(e))})"
        raise TracediagError(msg) from None


def save_state(path: str | Path, state: State) -> None:
    """Replace `path` with `state`, synced to disk before the rename."""
    data = state.to_bytes()

    def write(f: BinaryIO) -> None:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())

    write_atomic(path, write)

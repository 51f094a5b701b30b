"""Grouping rank files into profiler windows across ranks, and deciding when a window is complete.

`schedule(wait, warmup, active, repeat)` with `tensorboard_trace_handler` writes one file per rank
per window, named by host and process id, not by window. Files are grouped by what they hold: the
same step range (``ProfilerStep#N`` numbers, the same on every rank of a window) at about the same
time (the recorded spans within one window's length of each other, so a job restarted with the same
step numbers makes new windows, and clocks skewed by less than a window still group). Files without
step markers group by time alone.

A window is complete when every rank of the job has written it (the world size the traces state,
else the ranks seen in earlier windows), or, after `timeout` seconds of the watcher's own clock
since its first file (file times are never read, so skewed clocks cannot stall it), with the
missing ranks named. Windows are handed out in time order: a complete window waits for an earlier
one still incomplete.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracediag.watching.files import Part

DONE_KEPT = 64
"""Windows already handed out that a late file is still recognised as belonging to."""


@dataclass(eq=False)
class Pending:
    """A window being filled: its ranks' parts so far."""

    steps: tuple[int, int] | None
    lo_ns: int
    hi_ns: int
    opened: float
    """The watcher's clock (seconds) when its first file was read."""
    parts: dict[int, Part] = field(default_factory=dict)

    def matches(self, part: Part) -> bool:
        """`part` is a file of this window: the same steps, at about the same time."""
        if part.steps != self.steps:
            return False
        return near((self.lo_ns, self.hi_ns), (part.lo_ns, part.hi_ns))

    def add(self, part: Part) -> None:
        """Take `part` into the window (its rank's file; the window's span grows to hold it)."""
        self.parts[part.rank] = part
        self.lo_ns, self.hi_ns = min(self.lo_ns, part.lo_ns), max(self.hi_ns, part.hi_ns)

    @property
    def world_size(self) -> int | None:
        """The largest world size the window's files state (None: none states one)."""
        stated = [p.meta.world_size for p in self.parts.values() if p.meta.world_size]
        return max(stated) if stated else None


def near(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Two recorded spans within one window's length (the longer span) of each other."""
    slack = max(a[1] - a[0], b[1] - b[0])
    return a[0] - slack <= b[1] and b[0] <= a[1] + slack


@dataclass(frozen=True, slots=True)
class Done:
    """A window already handed out, as far as a late file needs it."""

    steps: tuple[int, int] | None
    lo_ns: int
    hi_ns: int
    index: int

    def matches(self, part: Part) -> bool:
        """`part` is a file of this finished window: the same steps, at about the same time."""
        return part.steps == self.steps and near((self.lo_ns, self.hi_ns), (part.lo_ns, part.hi_ns))


class Grouper:
    """The windows being filled, and the recent ones already handed out."""

    def __init__(self, timeout: float, done: list[Done] | None = None, known_ranks: set[int] | None = None) -> None:
        self.timeout = timeout
        self.pending: list[Pending] = []
        self.done: deque[Done] = deque(done or (), maxlen=DONE_KEPT)
        self.known_ranks: set[int] = set(known_ranks or ())
        """Ranks seen in windows handed out (the job's ranks when no trace states the world size)."""

    def add(self, part: Part, now: float) -> tuple[str, str] | None:
        """File `part` into its window; (reason, one line) when it cannot be: "late" (its window was
        reported) or "duplicate" (its window has a file of that rank)."""
        for d in self.done:
            if d.matches(part):
                return "late", f"{part.path}: rank {part.rank}'s file of window {d.index} came after it was reported"
        for w in self.pending:
            if w.matches(part):
                if part.rank in w.parts:
                    first = w.parts[part.rank].path
                    why = f"{part.path}: a second file of rank {part.rank} for one window (after {first}); left out"
                    return "duplicate", why
                w.add(part)
                return None
        w = Pending(part.steps, part.lo_ns, part.hi_ns, now)
        w.add(part)
        self.pending.append(w)
        self.pending.sort(key=lambda p: (p.lo_ns, p.steps or (0, 0)))
        return None

    def expected(self, w: Pending) -> set[int]:
        """The ranks window `w` should have."""
        world = w.world_size
        return set(range(world)) if world else set(self.known_ranks)

    def missing(self, w: Pending) -> tuple[int, ...]:
        """The ranks window `w` still lacks."""
        return tuple(sorted(self.expected(w) - set(w.parts)))

    def due(self, now: float, *, flush: bool = False) -> list[Pending]:
        """The windows to hand out now, in time order (removed from `pending`): complete, timed out,
        or all of them with `flush`; a window not due holds back the later ones."""
        out = []
        while self.pending:
            w = self.pending[0]
            expected = self.expected(w)
            complete = bool(expected) and expected <= set(w.parts)
            if not (flush or complete or now - w.opened >= self.timeout):
                break
            out.append(self.pending.pop(0))
        return out

    def handed_out(self, w: Pending, index: int, ranks: tuple[int, ...]) -> None:
        """Record window `w` as handed out as window `index` with `ranks`."""
        self.done.append(Done(w.steps, w.lo_ns, w.hi_ns, index))
        self.known_ranks |= set(ranks)

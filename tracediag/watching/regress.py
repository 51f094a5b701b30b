"""What changed between windows: a change-point test over step times and who the job waits for.

Two tests, each run when a window is closed, against the job's own history (no fixed target):

- **Step time against the baseline.** The baseline is the job's first `baseline_windows` complete
  windows (every rank present, analysed), their per-step times pooled (a step's time is its slowest
  rank's). A later window regresses when the median of its steps is at least `slower` (relative)
  above the baseline's median *and* its steps are larger than the baseline's by a one-sided
  Mann-Whitney U test at `min_confidence` (confidence = 1 - p; exact for small samples, so three
  steps against six can reach 0.988 at most, when every step is slower than every baseline step).
  The rank test makes one slow step (a checkpoint, a GC pause) not a regression, and the median
  ratio makes a statistically clear but tiny change (1%) not one either.
- **A new straggler.** A rank is *named* at a window when everyone waits for it (`Lateness.waited_for`)
  or a finding of a ``*_straggler`` cause names it. A rank named now and not at the previous window is
  a ``new_straggler`` (confidence: the highest of its findings' confidences and 1 - the lateness
  test's chance); one named at the previous window and not now is ``straggler_gone``. A cause found
  now (measurable, not a straggler, not healthy) that the previous window did not have is ``new_cause``.

The state (`Detector.to_dict`) is a few numbers per baseline step and the previous window's names,
so it is bounded whatever the job's length, and it is saved with the watcher's state (``--state``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from tracediag.analysis import Cause
from tracediag.watching.result import Change

if TYPE_CHECKING:
    from collections.abc import Mapping

STRAGGLER_CAUSES = frozenset(c.value for c in Cause if c.value.endswith("_straggler"))
"""Causes whose finding names the culprit rank(s)."""
EXACT_CELLS = 2500
"""Up to this many pairs (steps now x baseline steps) the U test's p-value is exact; above, the
normal approximation (then both samples have 50 steps or more, where it is close)."""


@dataclass(frozen=True, slots=True)
class Observation:
    """What the detector reads of one analysed window."""

    index: int
    step_seconds: tuple[float, ...]
    """Per step, the slowest rank's step time."""
    named: Mapping[int, tuple[float, float, str]] = field(default_factory=dict)
    """Rank -> (confidence, caused-wait share, cause) for each rank named (see the module docstring)."""
    causes: frozenset[str] = frozenset()
    """Measurable causes other than stragglers and healthy."""
    complete: bool = True
    """Every rank present and the window analysed: may join the baseline."""


class Detector:
    """The change-point tests over the windows of one job (see the module docstring)."""

    def __init__(self, *, baseline_windows: int = 2, slower: float = 0.10, min_confidence: float = 0.9) -> None:
        if baseline_windows < 1:
            msg = f"baseline_windows must be 1 or more, got {baseline_windows!r}"
            raise ValueError(msg)
        self.baseline_windows, self.slower, self.min_confidence = baseline_windows, slower, min_confidence
        self.baseline: list[float] = []
        self.baseline_from: list[int] = []
        """The indices of the baseline's windows."""
        self.previous: dict[int, tuple[float, float, str]] | None = None
        self.previous_causes: frozenset[str] = frozenset()

    def observe(self, obs: Observation) -> tuple[Change, ...]:
        """The changes at window `obs` against the windows before it; then `obs` joins the history."""
        changes: list[Change] = []
        if len(self.baseline_from) >= self.baseline_windows and obs.step_seconds:
            change = self._step_time(obs)
            if change is not None:
                changes.append(change)
        if self.previous is not None:
            changes += self._stragglers(obs)
            for cause in sorted(obs.causes - self.previous_causes):
                changes.append(
                    Change("new_cause", 1.0, 1.0, f"{cause} found (not at the previous window)", cause=cause)
                )
        if obs.complete and len(self.baseline_from) < self.baseline_windows and obs.step_seconds:
            self.baseline += obs.step_seconds
            self.baseline_from.append(obs.index)
        if obs.complete or self.previous is None:
            self.previous = dict(obs.named)
            self.previous_causes = obs.causes
        return tuple(changes)

    def _step_time(self, obs: Observation) -> Change | None:
        base = statistics.median(self.baseline)
        now = statistics.median(obs.step_seconds)
        if base <= 0:
            return None
        rel = now / base - 1
        confidence = 1 - u_test_greater(obs.step_seconds, self.baseline)
        if rel < self.slower or confidence < self.min_confidence:
            return None
        since = ", ".join(map(str, self.baseline_from))
        summary = (
            f"step time {now:.3f} s is {rel:.0%} above the baseline's {base:.3f} s (windows {since}; "
            f"U test confidence {confidence:.3f})"
        )
        return Change("step_time", rel, confidence, summary, baseline=base)

    def _stragglers(self, obs: Observation) -> list[Change]:
        prev = self.previous or {}
        out = []
        for rank in sorted(set(obs.named) - set(prev)):
            confidence, share, cause = obs.named[rank]
            how = f"everyone waits for it ({share:.0%} of the waiting)" if share > 0 else f"{cause}"
            summary = f"rank {rank} is a new straggler: {how}; not named at the previous window"
            out.append(Change("new_straggler", share or confidence, confidence, summary, ranks=(rank,), cause=cause))
        for rank in sorted(set(prev) - set(obs.named)):
            out.append(
                Change("straggler_gone", 1.0, 1.0, f"rank {rank}, named at the previous window, is not now", (rank,))
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """The detector's state, for the restart state (`--state`)."""
        return {
            "baseline": self.baseline,
            "baseline_from": self.baseline_from,
            "previous": None if self.previous is None else {str(r): list(v) for r, v in self.previous.items()},
            "previous_causes": sorted(self.previous_causes),
        }

    def restore(self, d: Mapping[str, Any]) -> None:
        """Continue from `to_dict` output (a restarted watcher)."""
        self.baseline = [float(v) for v in d.get("baseline", [])]
        self.baseline_from = [int(v) for v in d.get("baseline_from", [])]
        prev = d.get("previous")
        self.previous = (
            None if prev is None else {int(r): (float(c), float(s), str(k)) for r, (c, s, k) in prev.items()}
        )
        self.previous_causes = frozenset(d.get("previous_causes", []))


def u_test_greater(x: tuple[float, ...] | list[float], y: tuple[float, ...] | list[float]) -> float:
    """One-sided Mann-Whitney U p-value that `x` tends to be larger than `y` (ties count a half)."""
    n, m = len(x), len(y)
    if not n or not m:
        return 1.0
    u = sum((a > b) + 0.5 * (a == b) for a in x for b in y)
    if n * m <= EXACT_CELLS:
        counts = _u_counts(n, m)
        total = sum(counts)
        return sum(counts[math.ceil(u) :]) / total  # P(U >= u), U without ties taking whole values
    mean, sd = n * m / 2, (n * m * (n + m + 1) / 12) ** 0.5
    z = (u - 0.5 - mean) / sd
    return 0.5 * math.erfc(z / 2**0.5)


@lru_cache(maxsize=64)
def _u_counts(n: int, m: int) -> tuple[int, ...]:
    """How many of the C(n+m, n) orderings of two samples give each U = 0..n*m (no ties)."""
    # f[i][j] = counts for sizes (i, j): the largest value is from x (adds j to U) or from y
    prev_row = [(1,)] * (m + 1)  # i = 0: U = 0 only
    for i in range(1, n + 1):
        row: list[tuple[int, ...]] = [(1,)]  # j = 0
        for j in range(1, m + 1):
            a, b = prev_row[j], row[j - 1]  # x largest: U += j from (i-1, j); y largest: (i, j-1)
            out = [0] * (i * j + 1)
            for k, c in enumerate(a):
                out[k + j] += c
            for k, c in enumerate(b):
                out[k] += c
            row.append(tuple(out))
        prev_row = row
    return prev_row[m]

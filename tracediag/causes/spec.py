"""What a cause registers: its detector, its what-if pricing and its report text (`CauseSpec`), and
what a detector may read of the others' findings (`Context`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    import polars as pl

    from tracediag.analysis import Cause, Finding
    from tracediag.detect.facts import Facts
    from tracediag.detect.thresholds import Thresholds
    from tracediag.whatif.price import Pricing


@dataclass(eq=False)
class Context:
    """One detection pass: the facts, the thresholds, the findings of the causes registered before
    this one, and per-run tables derived once and shared (`memo`)."""

    facts: Facts
    thresholds: Thresholds
    found: list[tuple[CauseSpec, Finding]] = field(default_factory=list)
    """(the cause's spec, a finding of it), in detection order."""
    _memo: dict[Callable, Any] = field(default_factory=dict)

    def memo(self, derive: Callable[[pl.DataFrame, Thresholds], Any]) -> Any:
        """``derive(facts.steps, thresholds)``, computed once per pass (e.g. the straggler's per
        rank-step ratios, read by its detector and by the healthy finding)."""
        if derive not in self._memo:
            self._memo[derive] = derive(self.facts.steps, self.thresholds)
        return self._memo[derive]

    def explained_idle(self) -> bool:
        """A cause found so far accounts for the device's idle time (`CauseSpec.explains_idle`)."""
        return any(spec.explains_idle for spec, _ in self.found)

    def outlier_ranks(self) -> tuple[int, ...]:
        """Ranks the findings so far name as outliers (`CauseSpec.outliers`): a job-wide cause does
        not hold while one rank sets the pace."""
        return tuple(r for spec, f in self.found for r in spec.outliers(f))


def _no_outliers(_: Finding) -> tuple[int, ...]:
    return ()


def _absorbs_nothing(own: Finding, other: Finding) -> bool:
    return False


@dataclass(frozen=True)
class CauseSpec:
    """Everything about one cause, in one place (one module under `tracediag.causes` each)."""

    cause: Cause
    detect: Callable[[Context], list[Finding]]
    """The detector (a `tracediag.detect` module's `detect`, given what it reads from the context)."""
    pricing: Pricing | None
    """How the what-if removes it (`whatif.causes` edit and the clause saying what was removed);
    None: the detector's estimate stands."""
    quiet: str
    """Its measure as the healthy finding lists it among those below their thresholds ("exposed
    communication"); the first registered reads as a clause ("no rank computes ..."); empty: covered
    by another cause's phrase."""
    near: Callable[[Context], tuple[float, str]] | None = None
    """How close its run-level measure came to its threshold (1 = at it) and that as a clause, for
    the healthy finding's "closest: ..."."""
    explains_idle: bool = False
    """Its findings account for the device's idle time (host_bound then does not fire)."""
    outliers: Callable[[Finding], tuple[int, ...]] = _no_outliers
    """The ranks one of its findings names as setting the pace (job-wide causes then do not fire)."""
    absorbs: Callable[[Finding, Finding], bool] = _absorbs_nothing
    """``absorbs(own, other)``: `other` (a finding of another cause) is an effect of `own`, one of this
    cause's findings, and is not reported (a heavy stage's pipeline bubble; the single slow steps of
    uneven batches). Applied both ways round, whichever was found first (`causes.detect_all`)."""
    blames_ranks: bool = False
    """Its findings blame their ranks (reports mark them); job-wide causes name every rank and blame none."""

"""`Window`: what the watcher keeps of one analysed profiler window (its tables are dropped).

One record per window: which steps and ranks, step time per rank, the findings (the schema of
``analyze --format json``, `analysis.Finding.to_dict`), who everyone waited for, and what changed
since the job's earlier windows (`Change`, from `watching.regress`). `to_dict` is the JSON Lines
record and `from_dict` reads it back (docs/watch.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from tracediag.analysis import Analysis, Finding
from tracediag.api_types import checked

RECORD_VERSION = "1.0"


@dataclass(frozen=True, slots=True)
class Change:
    """One thing that changed at a window against the job's earlier windows."""

    kind: str
    """"step_time" (the job's step time against its baseline windows), "new_straggler" (a rank named
    that earlier windows did not name), "straggler_gone", or "new_cause"."""
    value: float
    """step_time: the relative change (0.25 = 25% slower); new_straggler: the share of the waiting
    the rank causes (or its finding's confidence when it causes none); otherwise 1."""
    confidence: float
    """0..1 (`watching.regress` says how each kind's is computed)."""
    summary: str
    ranks: tuple[int, ...] = ()
    cause: str = ""
    baseline: float | None = None
    """step_time: the baseline's median step in seconds."""

    def to_dict(self) -> dict[str, Any]:
        """The change's JSON form (in a window's record)."""
        return {
            "kind": self.kind,
            "ranks": list(self.ranks),
            "cause": self.cause,
            "value": round(self.value, 6),
            "baseline": self.baseline,
            "confidence": round(self.confidence, 4),
            "summary": self.summary,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Change:
        """The change a `to_dict` form describes."""
        return cls(
            kind=str(d["kind"]),
            value=float(d["value"]),
            confidence=float(d["confidence"]),
            summary=str(d.get("summary", "")),
            ranks=tuple(d.get("ranks", ())),
            cause=str(d.get("cause", "")),
            baseline=d.get("baseline"),
        )


@checked
@dataclass(frozen=True)
class Window:
    """One profiler window of the job, analysed (see the module docstring)."""

    index: int
    """1 for the job's first window reported, then 2, 3, ...; stable across watcher restarts (`--state`)."""
    key: str
    """Identifies the window (its steps and start time): the same key is the same window."""
    steps: tuple[int, ...]
    """The step numbers analysed (as the profiler numbered them)."""
    ranks: tuple[int, ...]
    """The ranks whose file of this window was read."""
    missing_ranks: tuple[int, ...] = ()
    """Ranks of the job with no file for this window when it was closed (`window_timeout`)."""
    start_ns: int = 0
    end_ns: int = 0
    """The window's recorded span (Unix-epoch ns, the ranks' own clocks)."""
    step_seconds: float | None = None
    """The job's step time: median over the window's steps of the step's slowest rank."""
    step_seconds_by_rank: Mapping[int, float] = field(default_factory=dict)
    """Median step time per rank."""
    exposed_comm_ratio_by_rank: Mapping[int, float] = field(default_factory=dict)
    """Communication not hidden behind compute, over the step time, per rank."""
    idle_ratio_by_rank: Mapping[int, float] = field(default_factory=dict)
    """Device (or operator) idle time over the step time, per rank."""
    findings: tuple[Finding, ...] = ()
    """Ranked, as `Analysis.findings`."""
    mfu: float | None = None
    """Observed MFU when a prediction of the job is given (`watch(prediction=...)`): its model FLOPs per
    step over (the window's median step · the devices' peak · GPUs); None without one, on traces with no
    device activity, or above 100% (the prediction is for other work; `mfu_note` says why)."""
    mfu_predicted: float | None = None
    """The prediction's own MFU, for comparison."""
    mfu_note: str = ""
    waited_for: tuple[int, ...] = ()
    """The ranks everyone waited for at the collectives (`Analysis.lateness`)."""
    caused_wait_share_by_rank: Mapping[int, float] = field(default_factory=dict)
    """Each rank's share of the waiting it caused the others."""
    changes: tuple[Change, ...] = ()
    warnings: tuple[str, ...] = ()
    """The analysis's warnings."""
    error: str = ""
    """Why the window could not be analysed ("" when it was): one line."""
    files: tuple[str, ...] = ()
    analysis_seconds: float = 0.0
    """Wall time of the reduce (watcher's clock): informational."""

    @property
    def regressed(self) -> bool:
        """A step-time change against the baseline was reported at this window."""
        return any(c.kind == "step_time" for c in self.changes)

    @checked
    def slower_than(self, ratio: float, confidence: float = 0.0) -> Change | None:
        """The step-time change at least `ratio` slower (0.1 = 10%) with at least `confidence`, if any."""
        return next(
            (c for c in self.changes if c.kind == "step_time" and c.value >= ratio and c.confidence >= confidence),
            None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The window's record (one JSON Lines record of `watch --jsonl`)."""

        def by_rank(m: Mapping[int, float]) -> dict[str, float]:
            return {str(r): round(v, 9) for r, v in sorted(m.items())}

        return {
            "record_version": RECORD_VERSION,
            "window": self.index,
            "key": self.key,
            "steps": list(self.steps),
            "ranks": list(self.ranks),
            "missing_ranks": list(self.missing_ranks),
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "step_seconds": self.step_seconds,
            "step_seconds_by_rank": by_rank(self.step_seconds_by_rank),
            "exposed_comm_ratio_by_rank": by_rank(self.exposed_comm_ratio_by_rank),
            "idle_ratio_by_rank": by_rank(self.idle_ratio_by_rank),
            "findings": [f.to_dict() for f in self.findings],
            "mfu": self.mfu,
            "mfu_predicted": self.mfu_predicted,
            "mfu_note": self.mfu_note,
            "waited_for": list(self.waited_for),
            "caused_wait_share_by_rank": by_rank(self.caused_wait_share_by_rank),
            "changes": [c.to_dict() for c in self.changes],
            "warnings": list(self.warnings),
            "error": self.error,
            "files": list(self.files),
            "analysis_seconds": round(self.analysis_seconds, 3),
        }

    @classmethod
    @checked
    def from_dict(cls, d: Mapping[str, Any]) -> Window:
        """The window a `to_dict` record describes."""

        def by_rank(m: Mapping[str, float] | None) -> dict[int, float]:
            return {int(r): float(v) for r, v in (m or {}).items()}

        return cls(
            index=int(d["window"]),
            key=str(d["key"]),
            steps=tuple(d.get("steps", ())),
            ranks=tuple(d.get("ranks", ())),
            missing_ranks=tuple(d.get("missing_ranks", ())),
            start_ns=int(d.get("start_ns", 0)),
            end_ns=int(d.get("end_ns", 0)),
            step_seconds=d.get("step_seconds"),
            step_seconds_by_rank=by_rank(d.get("step_seconds_by_rank")),
            exposed_comm_ratio_by_rank=by_rank(d.get("exposed_comm_ratio_by_rank")),
            idle_ratio_by_rank=by_rank(d.get("idle_ratio_by_rank")),
            findings=tuple(Finding.from_dict(f) for f in d.get("findings", ())),
            mfu=d.get("mfu"),
            mfu_predicted=d.get("mfu_predicted"),
            mfu_note=str(d.get("mfu_note", "")),
            waited_for=tuple(d.get("waited_for", ())),
            caused_wait_share_by_rank=by_rank(d.get("caused_wait_share_by_rank")),
            changes=tuple(Change.from_dict(c) for c in d.get("changes", ())),
            warnings=tuple(d.get("warnings", ())),
            error=str(d.get("error", "")),
            files=tuple(d.get("files", ())),
            analysis_seconds=float(d.get("analysis_seconds", 0.0)),
        )


def window_key(steps: tuple[int, int] | None, start_ns: int) -> str:
    """The window's identity: its step range and its start to the second."""
    where = f"steps {steps[0]}-{steps[1]}" if steps else "no steps"
    return f"{where} @ {start_ns // 1_000_000_000}"


def step_times(analysis: Analysis) -> list[float]:
    """Per analysed step, the slowest rank's step time in seconds (in step order)."""
    steps = analysis.steps
    if not steps.height:
        return []
    per = steps.group_by("step").agg(pl.col("dur_ns").max()).sort("step")
    return [v / 1e9 for v in per["dur_ns"].to_list()]


def per_rank(analysis: Analysis) -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
    """Median step seconds, exposed-communication ratio and idle ratio, per rank."""
    steps = analysis.steps
    if not steps.height:
        return {}, {}, {}
    total = pl.col("dur_ns").sum()
    table = (
        steps.group_by("rank")
        .agg(
            (pl.col("dur_ns").median() / 1e9).alias("step"),
            (pl.col("exposed_comm_ns").sum() / total).alias("comm"),
            (pl.col("idle_ns").sum() / total).alias("idle"),
        )
        .sort("rank")
        .fill_nan(0.0)
    )
    ranks = table["rank"].to_list()
    return tuple(dict(zip(ranks, table[c].to_list())) for c in ("step", "comm", "idle"))  # type: ignore[return-value]


def caused_shares(analysis: Analysis) -> tuple[tuple[int, ...], dict[int, float]]:
    """Who everyone waited for, and each rank's share of the waiting it caused."""
    late = analysis.lateness
    if late is None or not late.ranks.height:
        return (), {}
    table = late.ranks.select("rank", pl.col("share").fill_null(0.0).fill_nan(0.0))
    return tuple(late.waited_for), dict(zip(table["rank"].to_list(), table["share"].to_list()))

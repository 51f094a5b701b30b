"""The result of `tracediag analyze`: per-step facts, collective instances and findings.

This is the contract between the analysis (derive/, detect/), the observed-vs-predicted check and
the renderings (text, JSON, HTML). Text, JSON and HTML are renderings of the same `Analysis`;
`to_dict` / `from_dict` are the versioned JSON form documented in docs/analysis-json.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import polars as pl

from tracediag import display
from tracediag.api_types import CheckedEnumType, checked
from tracediag.units import NS_PER_MS, count, format_ms

if TYPE_CHECKING:  # `checked` resolves it through this module's `__getattr__`
    from tracediag.check_result import Check  # noqa: TC004

SCHEMA_VERSION = "1.9"
SHOWN = 2
"""Findings an `Analysis` repr names (the most time lost first) before it counts the rest."""


def __getattr__(name: str) -> object:
    """`Check`, the type of `Analysis.check`, imported on first use: only an analysis checked against a
    model (`--model`, `--plan`) has one, and its module builds four dataclasses."""
    if name == "Check":
        from tracediag.check_result import Check

        return Check
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


class Cause(StrEnum, metaclass=CheckedEnumType):
    """What a finding names; the JSON carries the value (``"comm_bound"``), and a `Cause` compares
    equal to it."""

    COMPUTE_STRAGGLER = "compute_straggler"
    COMM_BOUND = "comm_bound"
    PIPELINE_BUBBLE = "pipeline_bubble"
    INPUT_BOUND = "input_bound"
    HOST_BOUND = "host_bound"
    HOST_STRAGGLER = "host_straggler"
    INPUT_STRAGGLER = "input_straggler"
    STAGE_IMBALANCE = "stage_imbalance"
    SEQUENCE_IMBALANCE = "sequence_imbalance"
    SLOW_LINK = "slow_link"
    HEALTHY = "healthy"


CAUSES: tuple[str, ...] = tuple(c.value for c in Cause)

STEP_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "step": pl.Int32(),
    "start_ns": pl.Int64(),
    "dur_ns": pl.Int64(),
    "compute_ns": pl.Int64(),
    "comm_ns": pl.Int64(),
    "exposed_comm_ns": pl.Int64(),
    "wait_ns": pl.Int64(),
    "idle_ns": pl.Int64(),
    "host_gap_ns": pl.Int64(),
    "input_ns": pl.Int64(),
    "device": pl.Int16(),
    "exposed_p2p_ns": pl.Int64(),
    "stall_ns": pl.Int64(),
    "lead_idle_ns": pl.Int64(),
    "copy_ns": pl.Int64(),
    "idle_host_ns": pl.Int64(),
    "idle_kernel_ns": pl.Int64(),
    "idle_other_ns": pl.Int64(),
}
"""One row per (rank, step) of complete steps; `step` is the ProfilerStep number as in the trace.

- ``start_ns``/``dur_ns``: the step's span (on the rank's aligned clock).
- ``compute_ns``: union of compute intervals (device kernels; on CPU-only traces the training
  thread's operator time outside communication and data loading).
- ``comm_ns``: union of communication intervals; ``exposed_comm_ns``: the part no compute overlaps.
- ``wait_ns``: the part of ``exposed_comm_ns`` spent waiting for peers to arrive at collectives (from
  cross-rank matching; capped by the exposed time).
- ``idle_ns``: step time with neither compute nor communication nor copies.
  ``dur_ns = compute_ns + exposed_comm_ns + copy_ns + idle_ns`` on every row.
- ``host_gap_ns``: time the host's training thread is in no operator (Python, scheduling, syncs).
- ``input_ns``: time in data loading on the host (DataLoader `__next__`, `dataloader` annotations).
- ``device``: the device whose timeline the row describes (the rank's busiest), -1 on CPU-only traces.
- ``exposed_p2p_ns``: the part of ``exposed_comm_ns`` where only send/recv is active (pipeline waits).
- ``stall_ns``: from the step start to its first compute (a device starved at step start).
- ``copy_ns``: memory copies/sets with no compute or communication running.
- ``idle_host_ns`` + ``idle_kernel_ns`` + ``idle_other_ns`` = ``idle_ns``: the device waiting on the host
  (nothing queued until the launch call returns), on kernels (≤ 30 µs launch latency after it), or other
  (queued work held by an event, a sync or another device). CPU-only ranks: all idle is other.
- ``lead_idle_ns``: the device idle with nothing to do right before the step's first activity (CPU
  ranks: from the step start to the first activity that starts in the step; GPU ranks: from the previous
  step's last activity).
"""

COLLECTIVE_SCHEMA: dict[str, pl.DataType] = {
    "group": pl.String(),
    "seq": pl.Int64(),
    "op": pl.String(),
    "bytes": pl.Int64(),
    "step": pl.Int32(),
    "n_ranks": pl.Int32(),
    "first_arrival_ns": pl.Int64(),
    "last_arrival_ns": pl.Int64(),
    "skew_ns": pl.Int64(),
    "last_rank": pl.Int32(),
    "end_ns": pl.Int64(),
    "transfer_ns": pl.Int64(),
    "algbw_gbps": pl.Float64(),
    "busbw_gbps": pl.Float64(),
}
"""One row per collective instance matched across ranks (aligned clocks).

``seq``: the collective's `Seq`, or the k-th occurrence of that group on each rank when there is none.
``skew_ns`` = last − first arrival; ``transfer_ns`` = end − last arrival; bandwidths follow
nccl-tests (algbw = bytes / transfer time; busbw = algbw × the op's bus factor).
"""

LATENESS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "coll_n": pl.Int32(),
    "last_n": pl.Int32(),
    "late_ns": pl.Int64(),
    "caused_ns": pl.Int64(),
    "waited_ns": pl.Int64(),
    "share": pl.Float64(),
}
"""Per rank over the analysed steps (`derive.lateness`), most waiting caused first: ``coll_n``
matched collective instances, ``last_n`` of them among the last arrivers, ``late_ns`` = Σ over those
of its arrival − the instance's median arrival, ``caused_ns`` the waiting blamed on it (its peers'
waits at the instances it arrived last at, split among the last arrivers), ``waited_ns`` its own
waiting, ``share`` = caused / all waiting."""

KERNEL_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "name": pl.String(),
    "category": pl.String(),
    "count": pl.Int64(),
    "total_ns": pl.Int64(),
    "mean_ns": pl.Int64(),
    "wall_ns": pl.Int64(),
    "share": pl.Float64(),
}
"""The kernel view (`derive.kernels`): one row per (rank, kernel or operator name); ``category`` is
compute, communication or memory; ``total_ns`` is summed over streams/threads (concurrent rows each
count), ``wall_ns`` the union of their spans; ``share`` = wall / the rank's summed step time."""

KERNEL_CATEGORY_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "category": pl.String(),
    "count": pl.Int64(),
    "total_ns": pl.Int64(),
    "wall_ns": pl.Int64(),
    "share": pl.Float64(),
}
"""Per (rank, category) over all kernels/operators: as `KERNEL_SCHEMA`, the wall time of the category's rows."""


def _freeze(value: Any) -> Any:
    """A read-only copy: mappings as `MappingProxyType`, lists as tuples (deeply)."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    """The JSON-ready form of `_freeze` output (dicts and lists)."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@checked
@dataclass(frozen=True, slots=True, repr=False)
class Finding:
    """One diagnosed cause, with the numbers that decided it. Complete when built: `cause` must be a
    `Cause` (or its value), and `evidence` is stored as a read-only copy."""

    cause: Cause
    ranks: tuple[int, ...]
    """The ranks responsible (the straggler) or affected (all, for comm_bound / input_bound)."""
    steps: tuple[int, ...]
    """ProfilerStep numbers, as in the trace."""
    time_lost_ns: int
    """What the cause costs: the sum over its steps of the observed step − the step replayed without
    the cause (`tracediag.whatif`)."""
    confidence: float
    """0..1: how clearly the evidence separates this cause from noise."""
    summary: str
    """One sentence a person reads first ("rank 2 computes 2.4x the median ...")."""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    """The deciding numbers as fields (scalars, short lists as tuples, small mappings), read-only."""
    step_time_without_ns: int | None = None
    """The step time without this cause (median over its steps), from the what-if replay."""
    whatif: str = ""
    """The what-if as a sentence ("without rank 2's extra compute the step would take ...")."""
    measurable: bool = True
    """False when removing the cause recovers less than `Thresholds.whatif_measurable_share` of the
    step: found, but it costs nothing measurable (``--fail-on`` does not count it)."""
    whatif_withheld: str = ""
    """Why the what-if did not price this finding (its ``time_lost_ns`` is then the detector's estimate)."""

    def __post_init__(self) -> None:
        if self.cause not in CAUSES:
            msg = f"unknown cause {self.cause!r}; one of {', '.join(CAUSES)}"
            raise ValueError(msg)
        object.__setattr__(self, "cause", Cause(self.cause))
        object.__setattr__(self, "ranks", tuple(self.ranks))
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "evidence", _freeze(self.evidence))

    def __repr__(self) -> str:
        lost = format_ms(self.time_lost_ns / NS_PER_MS)
        where = f"{display.listing('rank', self.ranks)}, {display.listing('step', self.steps)}, {lost} lost"
        return f"<Finding {self.cause.value}: {where}, confidence {self.confidence:.2f}: {display.cut(self.summary)}>"

    def _repr_html_(self) -> str | None:
        """The report's card of this finding (`tracediag.report.notebook`)."""
        return display.html(self)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle (a read-only mapping cannot be): rebuilt through the constructor, which freezes again."""
        fields = (self.cause, self.ranks, self.steps, self.time_lost_ns, self.confidence, self.summary)
        more = (self.step_time_without_ns, self.whatif, self.measurable, self.whatif_withheld)
        return (type(self), (*fields, _thaw(self.evidence), *more))

    def to_dict(self) -> dict[str, Any]:
        """The finding's JSON form (docs/analysis-json.md, ``findings``)."""
        return {
            "cause": self.cause.value,
            "ranks": list(self.ranks),
            "steps": list(self.steps),
            "time_lost_ns": int(self.time_lost_ns),
            "step_time_without_ns": self.step_time_without_ns,
            "confidence": round(float(self.confidence), 3),
            "summary": self.summary,
            "whatif": self.whatif,
            "measurable": self.measurable,
            "whatif_withheld": self.whatif_withheld,
            "evidence": _thaw(self.evidence),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        """The finding a `to_dict` form describes."""
        return cls(
            cause=d["cause"],
            ranks=tuple(d["ranks"]),
            steps=tuple(d["steps"]),
            time_lost_ns=int(d["time_lost_ns"]),
            confidence=float(d["confidence"]),
            summary=d["summary"],
            evidence=d.get("evidence", {}),
            step_time_without_ns=d.get("step_time_without_ns"),
            whatif=d.get("whatif", ""),
            measurable=bool(d.get("measurable", True)),
            whatif_withheld=d.get("whatif_withheld", ""),
        )


@dataclass(frozen=True, slots=True)
class StageIdle:
    """One pipeline stage: its rank and the share of its steps spent idle or waiting on send/recv."""

    stage: int
    rank: int
    idle_share: float
    """Median over steps of (exposed send/recv + idle) / step time."""


@dataclass(frozen=True, slots=True)
class Pipeline:
    """One pipeline's stages against the schedule's ideal bubble (the JSON `pipeline` section)."""

    ranks: tuple[int, ...]
    """In stage order."""
    p: int
    m: int
    """Micro-batches per step (the first stage's sends)."""
    v: int
    """Interleaving degree (1: not visible in the trace)."""
    expected_bubble_share: float
    """The schedule's ideal bubble (p−1)/(m+p−1)/v."""
    stages: tuple[StageIdle, ...]

    def to_dict(self) -> dict[str, Any]:
        """The pipeline's JSON form (``pipelines``)."""
        return {
            "ranks": list(self.ranks),
            "p": self.p,
            "m": self.m,
            "v": self.v,
            "expected_bubble_share": self.expected_bubble_share,
            "stages": [{"stage": s.stage, "rank": s.rank, "idle_share": s.idle_share} for s in self.stages],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Pipeline:
        """The pipeline a `to_dict` form describes."""
        return cls(
            ranks=tuple(d["ranks"]),
            p=int(d["p"]),
            m=int(d["m"]),
            v=int(d.get("v", 1)),
            expected_bubble_share=float(d["expected_bubble_share"]),
            stages=tuple(StageIdle(int(s["stage"]), int(s["rank"]), float(s["idle_share"])) for s in d["stages"]),
        )


@dataclass(frozen=True, slots=True)
class Lateness:
    """Who everyone waits for at the collectives (the JSON `lateness` section; `derive.lateness`)."""

    waited_for: tuple[int, ...]
    """The ranks everyone waits for; empty: no one (`reason` says why)."""
    share: float
    """Their share of all waiting (when no one: the share of the rank that causes the most)."""
    wait_ns: int
    """All waiting in matched collectives over the analysed steps (each rank's waits counted once)."""
    instances: int
    """Matched collective instances read."""
    gap: float
    """The least member's caused waiting over the most any other rank causes (0 when no set qualified)."""
    chance: float
    """P(the members are among the last arrivers this often by chance)."""
    wait_share: float
    """The waiting they cause per waiting rank over the analysed time (Σ over steps of the median step)."""
    reason: str
    """Why no one is named ("" when someone is)."""
    ranks: pl.DataFrame
    """`LATENESS_SCHEMA`, one row per rank."""
    untraced: tuple[int, ...] = ()
    """Ranks of the world size with no trace (a rank set that is not complete)."""
    after_last_ns: int = 0
    """Σ over instances of the traced ranks' median time from the last traced arrival to their end: the
    transfer, and whatever wait for an untraced rank hides in it."""

    def to_dict(self) -> dict[str, Any]:
        """The lateness's JSON form (``lateness``)."""
        return {
            "waited_for": list(self.waited_for),
            "share": self.share,
            "wait_ns": self.wait_ns,
            "instances": self.instances,
            "gap": self.gap if self.gap != float("inf") else None,
            "chance": self.chance,
            "wait_share": self.wait_share,
            "reason": self.reason,
            "ranks": self.ranks.to_dicts(),
            "untraced": list(self.untraced),
            "after_last_ns": self.after_last_ns,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Lateness:
        """The lateness a `to_dict` form describes (older documents lack some keys)."""
        gap = d.get("gap")
        return cls(
            waited_for=tuple(d.get("waited_for", ())),
            share=float(d.get("share", 0.0)),
            wait_ns=int(d.get("wait_ns", 0)),
            instances=int(d.get("instances", 0)),
            gap=float("inf") if gap is None else float(gap),
            chance=float(d.get("chance", 1.0)),
            wait_share=float(d.get("wait_share", 0.0)),
            reason=str(d.get("reason", "")),
            ranks=pl.DataFrame(d.get("ranks", []), schema=LATENESS_SCHEMA),
            untraced=tuple(d.get("untraced", ())),
            after_last_ns=int(d.get("after_last_ns", 0)),
        )


@dataclass(frozen=True, slots=True)
class WhatIfStep:
    """One step: observed, replayed from the observed durations, and replayed without every cause."""

    step: int
    observed_ns: int
    replayed_ns: int
    without_all_ns: int


@dataclass(frozen=True, slots=True)
class WhatIf:
    """The replay behind the findings' ``time_lost_ns`` (the JSON `whatif` section; `tracediag.whatif`)."""

    replay_error_median: float | None
    """Relative error of the replay of the observed durations against the observed steps (median)."""
    replay_error_max: float | None
    operations: int
    """Sync operations replayed (matched collectives and send/recv pairs)."""
    step_time_ns: int | None
    """Median observed step."""
    step_time_without_all_ns: int | None
    """Median step with every finding's cause removed at once."""
    time_lost_all_ns: int
    """Sum over steps of observed − the combined what-if."""
    steps: tuple[WhatIfStep, ...] = ()
    pipeline: tuple[Mapping[str, Any], ...] = ()
    """Per pipeline_bubble finding: ``ranks`` and ``step_ns_by_microbatches`` (m → projected ideal step)."""
    replay_error_by_rank: Mapping[str, float] = field(default_factory=dict)
    """Per rank (its trace): the replay's relative error against its observed steps, median over steps."""
    withheld: str = ""
    """Why no what-if is given (a rank's replay error above `Thresholds.replay_error_limit`), or ""."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "pipeline", tuple(_freeze(p) for p in self.pipeline))
        object.__setattr__(self, "replay_error_by_rank", _freeze(self.replay_error_by_rank))

    def to_dict(self) -> dict[str, Any]:
        """The what-if's JSON form (``whatif``)."""
        out = {
            "replay_error_median": self.replay_error_median,
            "replay_error_max": self.replay_error_max,
            "replay_error_by_rank": _thaw(self.replay_error_by_rank),
            "withheld": self.withheld,
            "operations": self.operations,
            "step_time_ns": self.step_time_ns,
            "step_time_without_all_ns": self.step_time_without_all_ns,
            "time_lost_all_ns": self.time_lost_all_ns,
            "steps": [
                {
                    "step": s.step,
                    "observed_ns": s.observed_ns,
                    "replayed_ns": s.replayed_ns,
                    "without_all_ns": s.without_all_ns,
                }
                for s in self.steps
            ],
        }
        if self.pipeline:
            out["pipeline"] = [_thaw(p) for p in self.pipeline]
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WhatIf:
        """The what-if a `to_dict` form describes."""
        return cls(
            replay_error_median=d.get("replay_error_median"),
            replay_error_max=d.get("replay_error_max"),
            operations=int(d.get("operations", 0)),
            step_time_ns=d.get("step_time_ns"),
            step_time_without_all_ns=d.get("step_time_without_all_ns"),
            time_lost_all_ns=int(d.get("time_lost_all_ns", 0)),
            steps=tuple(
                WhatIfStep(int(s["step"]), int(s["observed_ns"]), int(s["replayed_ns"]), int(s["without_all_ns"]))
                for s in d.get("steps", [])
            ),
            pipeline=tuple(d.get("pipeline", [])),
            replay_error_by_rank=d.get("replay_error_by_rank", {}),
            withheld=d.get("withheld", ""),
        )


@checked
@dataclass(frozen=True, repr=False)
class Analysis:
    """Everything `tracediag analyze` found in a run."""

    ranks: tuple[int, ...]
    world_size: int
    steps: pl.DataFrame
    """Per (rank, step) breakdown, `STEP_SCHEMA`."""
    collectives: pl.DataFrame
    """Collective instances matched across ranks, `COLLECTIVE_SCHEMA`."""
    findings: tuple[Finding, ...]
    """Ranked, most time lost first; a single `healthy` finding when no cause is found."""
    excluded_steps: int = 0
    """Partial steps at the edges of the recorded window, per rank, left out of `steps`."""
    warnings: tuple[str, ...] = ()
    pipelines: tuple[Pipeline, ...] = ()
    """Each pipeline's stages and their idle share, when the run has pipeline parallelism."""
    check: Check | None = None
    """Observed against predicted (`tracediag.check`), when a prediction was given."""
    whatif: WhatIf | None = None
    """The what-if replay: its error, the combined what-if and the per-step table."""
    kernels: pl.DataFrame | None = None
    """The kernel view: per rank, the top kernels/operators by total time (`KERNEL_SCHEMA`)."""
    kernel_categories: pl.DataFrame | None = None
    """Per (rank, category) over all kernels/operators (`KERNEL_CATEGORY_SCHEMA`)."""
    lateness: Lateness | None = None
    """Who everyone waits for at the collectives, when collectives were matched."""

    def __repr__(self) -> str:
        named = [
            f"{f.cause.value} {display.listing('rank', f.ranks)} ({format_ms(f.time_lost_ns / NS_PER_MS)} lost)"
            for f in self.findings[:SHOWN]
        ]
        more = len(self.findings) - SHOWN
        findings = "; ".join(named) + (f"; +{more} more" if more > 0 else "")
        head = f"{count(len(self.ranks), 'rank')}, {count(len(self.step_numbers), 'step')}"
        return f"<Analysis: {head}, {count(len(self.findings), 'finding')}{': ' if named else ''}{findings}>"

    def _repr_html_(self) -> str | None:
        """The report's finding cards and what-if table (`tracediag.report.notebook`)."""
        return display.html(self)

    @property
    def step_numbers(self) -> list[int]:
        """The analysed step numbers, in order."""
        return sorted(self.steps["step"].unique().to_list()) if self.steps.height else []

    def to_dict(self, *, tables: bool = True) -> dict[str, Any]:
        """The documented JSON form (docs/analysis-json.md). Without `tables`, the row tables (``steps``,
        ``collectives``, ``kernels``, ``kernel_categories``) stay DataFrames, for a writer that turns them
        into rows a slice at a time (`report.analyses.write_analyses_json`)."""
        rows = pl.DataFrame.to_dicts if tables else (lambda t: t)
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "run": {
                "ranks": list(self.ranks),
                "world_size": self.world_size,
                "steps": self.step_numbers,
                "excluded_steps": self.excluded_steps,
            },
            "steps": rows(self.steps),
            "collectives": rows(self.collectives),
            "findings": [f.to_dict() for f in self.findings],
            "warnings": list(self.warnings),
        }
        if self.pipelines:
            out["pipeline"] = [p.to_dict() for p in self.pipelines]
        if self.check is not None:
            out["check"] = self.check.to_dict()
        if self.whatif is not None:
            out["whatif"] = self.whatif.to_dict()
        if self.kernels is not None and self.kernels.height:
            out["kernels"] = rows(self.kernels)
        if self.kernel_categories is not None and self.kernel_categories.height:
            out["kernel_categories"] = rows(self.kernel_categories)
        if self.lateness is not None:
            out["lateness"] = self.lateness.to_dict()
        return out

    @classmethod
    @checked
    def from_dict(cls, d: dict[str, Any]) -> Analysis:
        """Read back `to_dict` output (e.g. for `tracediag report analysis.json`); sections a later
        minor version adds are ignored."""
        from tracediag.check_result import Check

        major = str(d.get("schema_version", "")).split(".")[0]
        if major != SCHEMA_VERSION.split(".")[0]:
            got = d.get("schema_version")
            msg = f"analysis schema_version {got!r}; this tracediag reads {SCHEMA_VERSION}"
            raise ValueError(msg)
        return cls(
            ranks=tuple(d["run"]["ranks"]),
            world_size=int(d["run"]["world_size"]),
            steps=pl.DataFrame(d.get("steps", []), schema=STEP_SCHEMA),
            collectives=pl.DataFrame(d.get("collectives", []), schema=COLLECTIVE_SCHEMA),
            findings=tuple(Finding.from_dict(f) for f in d.get("findings", [])),
            excluded_steps=int(d["run"].get("excluded_steps", 0)),
            warnings=tuple(d.get("warnings", [])),
            pipelines=tuple(Pipeline.from_dict(p) for p in d.get("pipeline", [])),
            check=Check.from_dict(d["check"]) if d.get("check") else None,
            whatif=WhatIf.from_dict(d["whatif"]) if d.get("whatif") else None,
            kernels=pl.DataFrame(d["kernels"], schema=KERNEL_SCHEMA) if d.get("kernels") else None,
            kernel_categories=pl.DataFrame(d["kernel_categories"], schema=KERNEL_CATEGORY_SCHEMA)
            if d.get("kernel_categories")
            else None,
            lateness=Lateness.from_dict(d["lateness"]) if d.get("lateness") else None,
        )

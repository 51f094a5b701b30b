"""The result of `tracediag analyze`: per-step facts, collective instances and findings.

This is the contract between the analysis (derive/, detect/), the observed-vs-predicted check and
the renderings (text, JSON, HTML). Text, JSON and HTML are renderings of the same `Analysis`;
`to_dict` / `from_dict` are the versioned JSON form documented in docs/analysis-json.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import polars as pl

SCHEMA_VERSION = "1.2"

Cause = Literal["compute_straggler", "comm_bound", "pipeline_bubble", "input_bound", "host_bound", "healthy"]
CAUSES: tuple[str, ...] = (
    "compute_straggler",
    "comm_bound",
    "pipeline_bubble",
    "input_bound",
    "host_bound",
    "healthy",
)

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
  ranks: from the step start; GPU ranks: from the previous step's last activity).
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


@dataclass(frozen=True, slots=True)
class Finding:
    """One diagnosed cause, with the numbers that decided it."""

    cause: str
    """One of `CAUSES`."""
    ranks: tuple[int, ...]
    """The ranks responsible (the straggler) or affected (all, for comm_bound / input_bound)."""
    steps: tuple[int, ...]
    """ProfilerStep numbers, as in the trace."""
    time_lost_ns: int
    """What the slow steps cost against the healthy steps or the peers."""
    confidence: float
    """0..1: how clearly the evidence separates this cause from noise."""
    summary: str
    """One sentence a person reads first ("rank 2 computes 2.4x the median ...")."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """The deciding numbers as fields (JSON-serialisable scalars or short lists)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "ranks": list(self.ranks),
            "steps": list(self.steps),
            "time_lost_ns": int(self.time_lost_ns),
            "confidence": round(float(self.confidence), 3),
            "summary": self.summary,
            "evidence": dict(self.evidence),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        return cls(
            cause=d["cause"],
            ranks=tuple(d["ranks"]),
            steps=tuple(d["steps"]),
            time_lost_ns=int(d["time_lost_ns"]),
            confidence=float(d["confidence"]),
            summary=d["summary"],
            evidence=dict(d.get("evidence", {})),
        )


@dataclass(frozen=True)
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
    extra: dict[str, Any] = field(default_factory=dict)
    """Further sections by name (e.g. "check" for observed vs predicted, "pipeline"), JSON-ready."""

    @property
    def step_numbers(self) -> list[int]:
        return sorted(self.steps["step"].unique().to_list()) if self.steps.height else []

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON form (docs/analysis-json.md)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "run": {
                "ranks": list(self.ranks),
                "world_size": self.world_size,
                "steps": self.step_numbers,
                "excluded_steps": self.excluded_steps,
            },
            "steps": self.steps.to_dicts(),
            "collectives": self.collectives.to_dicts(),
            "findings": [f.to_dict() for f in self.findings],
            "warnings": list(self.warnings),
            **self.extra,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Analysis:
        """Read back `to_dict` output (e.g. for `tracediag report analysis.json`)."""
        major = str(d.get("schema_version", "")).split(".")[0]
        if major != SCHEMA_VERSION.split(".")[0]:
            got = d.get("schema_version")
            raise ValueError(f"analysis schema_version {got!r}; this tracediag reads {SCHEMA_VERSION}")
        known = {"schema_version", "run", "steps", "collectives", "findings", "warnings"}
        return cls(
            ranks=tuple(d["run"]["ranks"]),
            world_size=int(d["run"]["world_size"]),
            steps=pl.DataFrame(d.get("steps", []), schema=STEP_SCHEMA),
            collectives=pl.DataFrame(d.get("collectives", []), schema=COLLECTIVE_SCHEMA),
            findings=tuple(Finding.from_dict(f) for f in d.get("findings", [])),
            excluded_steps=int(d["run"].get("excluded_steps", 0)),
            warnings=tuple(d.get("warnings", [])),
            extra={k: v for k, v in d.items() if k not in known},
        )

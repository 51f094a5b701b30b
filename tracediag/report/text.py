"""The terminal rendering of an `Analysis`: a ranked summary read in ten seconds, then a per-step table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from tracediag.analysis import Analysis, Finding
from tracediag.words import count, noun

MS = 1e6
COLUMNS = (
    ("dur_ns", "dur", "step time"),
    ("compute_ns", "compute", "computing"),
    ("comm_ns", "comm", "communicating"),
    ("exposed_comm_ns", "exposed", "communicating with no compute alongside"),
    ("wait_ns", "wait", "in collectives waiting for peers"),
    ("idle_ns", "idle", "neither computing nor communicating"),
    ("input_ns", "input", "loading data"),
    ("host_gap_ns", "host gap", "host thread in no operator"),
)
"""(steps column, table header, what it means: the table's legend)."""
LEGEND = "; ".join(
    [*(f"{label} = {meaning}" for _, label, meaning in COLUMNS), "max compute = the rank computing longest"]
)


def _span(values: tuple[int, ...]) -> str:
    """Numbers as ranges: (2, 3, 4, 7) -> '2..4, 7'."""
    if not values:
        return "-"
    parts, start, prev = [], values[0], values[0]
    for v in (*values[1:], None):
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}..{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(parts)


def _evidence(evidence: Mapping[str, Any]) -> str:
    scalars = [f"{k}={v}" for k, v in evidence.items() if not isinstance(v, (Mapping, tuple, list))]
    return ", ".join(scalars)


def _finding_lines(i: int, f: Finding) -> list[str]:
    if f.cause == "healthy":
        return [f"{i}. healthy  {f.summary}", f"   evidence: {_evidence(f.evidence)}"]
    head = (
        f"{i}. {f.cause}  {noun(len(f.ranks), 'rank')} {_span(f.ranks)}  "
        f"{noun(len(f.steps), 'step')} {_span(f.steps)}  "
        f"lost {f.time_lost_ns / MS:,.1f} ms  confidence {f.confidence:.2f}"
    )
    return [head, f"   {f.summary}", f"   evidence: {_evidence(f.evidence)}"]


def _step_table(steps: pl.DataFrame) -> list[str]:
    if not steps.height:
        return ["no complete steps"]
    per_step = (
        steps.group_by("step")
        .agg(
            *[(pl.col(c).median() / MS).alias(c) for c, _, _ in COLUMNS],
            slowest=pl.col("rank").sort_by("compute_ns").last(),
        )
        .sort("step")
    )
    header = f"{'step':>8}" + "".join(f"{label:>10}" for _, label, _ in COLUMNS) + f"{'max compute':>13}"
    lines = ["per step: median over ranks, ms", f"columns: {LEGEND}", header]
    for row in per_step.iter_rows(named=True):
        cells = "".join(f"{row[c]:>10.1f}" for c, _, _ in COLUMNS)
        lines.append(f"{row['step']:>8}{cells}{'rank ' + str(row['slowest']):>13}")
    return lines


def render_text(analysis: Analysis) -> str:
    """The summary and per-step table as text (no trailing newline)."""
    nums = analysis.step_numbers
    lines = [
        f"tracediag analyze: {count(len(analysis.ranks), 'rank')} (world size {analysis.world_size}), "
        f"{count(len(nums), 'step')} ({_span(tuple(nums))}), "
        f"{count(analysis.excluded_steps, 'partial rank-step')} left out",
        "",
    ]
    for i, f in enumerate(analysis.findings, 1):
        lines.extend(_finding_lines(i, f))
    for pipe in analysis.pipelines:
        stages = ", ".join(f"{s.rank}:{s.idle_share:.0%}" for s in pipe.stages)
        lines.append(
            f"   pipeline p={pipe.p} m={pipe.m}: idle share by stage (rank:share) {stages}; "
            f"ideal {pipe.expected_bubble_share:.0%}"
        )
    lines.append("")
    lines.extend(_step_table(analysis.steps))
    lines.extend(f"warning: {w}" for w in analysis.warnings)
    return "\n".join(lines)

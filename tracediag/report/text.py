"""The terminal rendering of an `Analysis`: a ranked summary read in ten seconds, then a per-step table."""

from __future__ import annotations

from typing import Any

import polars as pl

from tracediag.analysis import Analysis, Finding

MS = 1e6
COLUMNS = (
    ("dur_ns", "dur ms"),
    ("compute_ns", "compute"),
    ("exposed_comm_ns", "exposed"),
    ("copy_ns", "copy"),
    ("idle_host_ns", "idle:host"),
    ("idle_kernel_ns", "idle:kern"),
    ("idle_other_ns", "idle:other"),
    ("wait_ns", "(wait)"),
    ("input_ns", "input"),
    ("host_gap_ns", "host gap"),
)
LEGEND = (
    "ms, mean over ranks so the parts add up: dur = compute + exposed comm + copy + idle "
    "(waiting on host / kernels / other); (wait) = the part of exposed spent waiting for late peers; "
    "input, host gap = host side"
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


def _evidence(evidence: dict[str, Any]) -> str:
    scalars = [f"{k}={v}" for k, v in evidence.items() if not isinstance(v, (dict, list))]
    return ", ".join(scalars)


def _finding_lines(i: int, f: Finding) -> list[str]:
    if f.cause == "healthy":
        return [f"{i}. healthy  {f.summary}", f"   evidence: {_evidence(f.evidence)}"]
    n = len(f.steps)
    head = (
        f"{i}. {f.cause}  ranks {_span(f.ranks)}  steps {_span(f.steps)}  "
        f"lost {f.time_lost_ns / MS:,.1f} ms over {n} step{'s' if n != 1 else ''}  confidence {f.confidence:.2f}"
    )
    return [head, f"   {f.summary}", f"   evidence: {_evidence(f.evidence)}"]


def _step_table(steps: pl.DataFrame) -> list[str]:
    if not steps.height:
        return ["no complete steps"]
    per_step = (
        steps.group_by("step")
        .agg(
            *[(pl.col(c).mean() / MS).alias(c) for c, _ in COLUMNS],
            slowest=pl.col("rank").sort_by("compute_ns").last(),
        )
        .sort("step")
    )
    header = f"{'step':>8}" + "".join(f"{label:>11}" for _, label in COLUMNS) + f"{'max compute':>13}"
    lines = [f"per step ({LEGEND}; max compute = the rank computing longest)", header]
    for row in per_step.iter_rows(named=True):
        cells = "".join(f"{row[c]:>11.1f}" for c, _ in COLUMNS)
        lines.append(f"{row['step']:>8}{cells}{'rank ' + str(row['slowest']):>13}")
    return lines


def render_text(analysis: Analysis) -> str:
    """The summary and per-step table as text (no trailing newline)."""
    nums = analysis.step_numbers
    lines = [
        f"tracediag analyze: {len(analysis.ranks)} rank{'s' if len(analysis.ranks) != 1 else ''} "
        f"(world size {analysis.world_size}), "
        f"{len(nums)} steps ({_span(tuple(nums))}), {analysis.excluded_steps} partial rank-steps left out",
        "",
    ]
    for i, f in enumerate(analysis.findings, 1):
        lines.extend(_finding_lines(i, f))
    pipes = analysis.extra.get("pipeline", [])
    for pipe in pipes:
        stages = ", ".join(f"{s['rank']}:{s['idle_share']:.0%}" for s in pipe["stages"])
        lines.append(
            f"   pipeline p={pipe['p']} m={pipe['m']}: idle share by stage (rank:share) {stages}; "
            f"ideal {pipe['expected_bubble_share']:.0%}"
        )
    lines.append("")
    lines.extend(_step_table(analysis.steps))
    lines.extend(f"warning: {w}" for w in analysis.warnings)
    return "\n".join(lines)

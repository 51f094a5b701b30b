"""The terminal rendering of an `Analysis`: a ranked summary read in ten seconds, then a per-step table."""

from __future__ import annotations

from typing import Any

import polars as pl

from tracediag.analysis import Analysis, Finding

MS = 1e6
COLUMNS = (
    ("dur_ns", "dur"),
    ("compute_ns", "compute"),
    ("comm_ns", "comm"),
    ("exposed_comm_ns", "exposed"),
    ("wait_ns", "wait"),
    ("idle_ns", "idle"),
    ("input_ns", "input"),
    ("host_gap_ns", "host gap"),
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
    head = (
        f"{i}. {f.cause}  ranks {_span(f.ranks)}  steps {_span(f.steps)}  "
        f"lost {f.time_lost_ns / MS:,.1f} ms  confidence {f.confidence:.2f}"
    )
    whatif = [f"   what-if: {f.whatif}"] if f.whatif else []
    return [head, f"   {f.summary}", *whatif, f"   evidence: {_evidence(f.evidence)}"]


def _step_table(steps: pl.DataFrame, whatif: dict[str, Any] | None = None) -> list[str]:
    if not steps.height:
        return ["no complete steps"]
    per_step = (
        steps.group_by("step")
        .agg(
            *[(pl.col(c).median() / MS).alias(c) for c, _ in COLUMNS],
            slowest=pl.col("rank").sort_by("compute_ns").last(),
        )
        .sort("step")
    )
    without = {s["step"]: s["without_all_ns"] / MS for s in (whatif or {}).get("steps", [])}
    header = f"{'step':>8}" + "".join(f"{label:>10}" for _, label in COLUMNS) + f"{'max compute':>13}"
    header += f"{'what-if':>10}" if without else ""
    note = "; what-if = the step replayed without every cause found" if without else ""
    lines = [f"per step: median over ranks, ms; max compute = the rank computing longest{note}", header]
    for row in per_step.iter_rows(named=True):
        cells = "".join(f"{row[c]:>10.1f}" for c, _ in COLUMNS)
        w = without.get(row["step"])
        tail = (f"{w:>10.1f}" if w is not None else f"{'-':>10}") if without else ""
        lines.append(f"{row['step']:>8}{cells}{'rank ' + str(row['slowest']):>13}{tail}")
    return lines


def _whatif_line(section: dict[str, Any] | None) -> list[str]:
    """The combined what-if and the replay's own error."""
    if not section or section.get("step_time_ns") is None:
        return []
    err = section.get("replay_error_median")
    fit = f" (the replay of the observed durations is off by {err:.1%} median)" if err is not None else ""
    return [
        f"what-if, every cause removed: the step would take {section['step_time_without_all_ns'] / MS:,.1f} ms "
        f"instead of {section['step_time_ns'] / MS:,.1f} ms{fit}"
    ]


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
    if any(f.whatif for f in analysis.findings):
        lines.extend(_whatif_line(analysis.extra.get("whatif")))
    lines.append("")
    lines.extend(_step_table(analysis.steps, analysis.extra.get("whatif")))
    lines.extend(f"warning: {w}" for w in analysis.warnings)
    return "\n".join(lines)

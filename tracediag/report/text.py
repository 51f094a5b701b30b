"""The terminal rendering of an `Analysis`: a ranked summary read in ten seconds, then a per-step table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from tracediag.analysis import Analysis, Cause, Finding, Lateness, WhatIf
from tracediag.api_types import checked
from tracediag.units import NS_PER_MS, count, format_ms, noun

COLUMNS = (
    ("dur_ns", "dur ms", "step time = compute + exposed + copy + the three idles"),
    ("compute_ns", "compute", "computing"),
    ("exposed_comm_ns", "exposed", "communicating with no compute alongside"),
    ("copy_ns", "copy", "only memory copies"),
    ("idle_host_ns", "idle:host", "idle with nothing queued, waiting on the host"),
    ("idle_kernel_ns", "idle:kern", "idle up to 30 us between queued kernels"),
    ("idle_other_ns", "idle:other", "idle for any other reason"),
    ("wait_ns", "(wait)", "the part of exposed spent waiting for late peers"),
    ("input_ns", "input", "host loading data"),
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
    if f.cause == Cause.HEALTHY:
        return [f"{i}. healthy  {f.summary}", f"   evidence: {_evidence(f.evidence)}"]
    n = len(f.steps)
    head = (
        f"{i}. {f.cause}  {noun(len(f.ranks), 'rank')} {_span(f.ranks)}  "
        f"{noun(n, 'step')} {_span(f.steps)}  "
        f"lost {format_ms(f.time_lost_ns / NS_PER_MS)} over {count(n, 'step')}  confidence {f.confidence:.2f}"
    )
    if not f.measurable:
        head += "  found, costs nothing measurable"
    whatif = [f"   what-if: {f.whatif}"] if f.whatif else []
    if f.whatif_withheld:
        whatif.append(f"   what-if withheld: {f.whatif_withheld}")
    return [head, f"   {f.summary}", *whatif, f"   evidence: {_evidence(f.evidence)}"]


LATENESS_RANKS_SHOWN = 8
"""Ranks listed on the lateness line (most waiting caused first)."""


def _lateness_lines(late: Lateness | None) -> list[str]:
    """Who everyone waits for, and each rank's share of the waiting it causes."""
    if late is None or not late.instances:
        return []
    t = late.ranks
    waits = f"{format_ms(late.wait_ns / NS_PER_MS)} waiting in {count(late.instances, 'collective instance')}"
    if late.waited_for:
        mine = t.filter(pl.col("rank").is_in(list(late.waited_for)))
        last = int(mine["last_n"].max())
        who = f"rank {late.waited_for[0]}" if len(late.waited_for) == 1 else f"ranks {_span(late.waited_for)}"
        head = f"waited for: {who}, {late.share:.0%} of the {waits} (last at up to {last} of {late.instances})"
    elif late.untraced and late.after_last_ns > late.wait_ns:
        head = f"waited for: {late.reason} ({waits} among the traced ranks)"
    else:
        head = f"waited for: no one ({late.reason}; {waits})"
    shown = [
        f"{r}:{sh:.0%} {n}/{c}"
        for r, sh, n, c in t.head(LATENESS_RANKS_SHOWN).select("rank", "share", "last_n", "coll_n").iter_rows()
    ]
    more = f" (+{count(t.height - LATENESS_RANKS_SHOWN, 'rank')})" if t.height > LATENESS_RANKS_SHOWN else ""
    return [head, f"   waiting caused by rank (rank:share last/instances): {', '.join(shown)}{more}"]


def _step_table(steps: pl.DataFrame, whatif: WhatIf | None = None) -> list[str]:
    if not steps.height:
        return ["no complete steps"]
    per_step = (
        steps.group_by("step")
        .agg(
            *[(pl.col(c).mean() / NS_PER_MS).alias(c) for c, _, _ in COLUMNS],
            slowest=pl.col("rank").sort_by("compute_ns").last(),
        )
        .sort("step")
    )
    without = {s.step: s.without_all_ns / NS_PER_MS for s in whatif.steps} if whatif else {}
    header = f"{'step':>8}" + "".join(f"{label:>11}" for _, label, _ in COLUMNS) + f"{'max compute':>13}"
    header += f"{'what-if':>10}" if without else ""
    legend = LEGEND + ("; what-if = the step replayed without every cause found" if without else "")
    lines = ["per step: ms, mean over ranks (so the parts add up)", f"columns: {legend}", header]
    for row in per_step.iter_rows(named=True):
        cells = "".join(f"{row[c]:>11.1f}" for c, _, _ in COLUMNS)
        w = without.get(row["step"])
        tail = (f"{w:>10.1f}" if w is not None else f"{'-':>10}") if without else ""
        lines.append(f"{row['step']:>8}{cells}{'rank ' + str(row['slowest']):>13}{tail}")
    return lines


def _whatif_line(whatif: WhatIf | None) -> list[str]:
    """The combined what-if and the replay's own error."""
    if whatif is not None and whatif.withheld:
        return [f"what-if withheld: {whatif.withheld}"]
    if whatif is None or whatif.step_time_ns is None or whatif.step_time_without_all_ns is None:
        return []
    err = whatif.replay_error_median
    fit = f" (the replay of the observed durations is off by {err:.1%} median)" if err is not None else ""
    return [
        f"what-if, every cause removed: the step would take {format_ms(whatif.step_time_without_all_ns / NS_PER_MS)} "
        f"instead of {format_ms(whatif.step_time_ns / NS_PER_MS)}{fit}"
    ]


def run_line(analysis: Analysis) -> str:
    """What was analysed: "4 ranks (world size 4), 8 steps (2..9), 0 partial rank-steps left out"."""
    nums = analysis.step_numbers
    return (
        f"{count(len(analysis.ranks), 'rank')} (world size {analysis.world_size}), "
        f"{count(len(nums), 'step')} ({_span(tuple(nums))}), "
        f"{count(analysis.excluded_steps, 'partial rank-step')} left out"
    )


@checked
def render_text(analysis: Analysis) -> str:
    """The analysis as text, what `tracediag analyze` prints: the run, each finding with its evidence and
    what-if, the lateness, the per-step table and the warnings (no trailing newline)."""
    lines = [f"tracediag analyze: {run_line(analysis)}", ""]
    for i, f in enumerate(analysis.findings, 1):
        lines.extend(_finding_lines(i, f))
    for pipe in analysis.pipelines:
        stages = ", ".join(f"{s.rank}:{s.idle_share:.0%}" for s in pipe.stages)
        lines.append(
            f"   pipeline p={pipe.p} m={pipe.m}: idle share by stage (rank:share) {stages}; "
            f"ideal {pipe.expected_bubble_share:.0%}"
        )
    if any(f.whatif or f.whatif_withheld for f in analysis.findings):
        lines.extend(_whatif_line(analysis.whatif))
    lines.extend(_lateness_lines(analysis.lateness))
    lines.append("")
    priced = any(f.whatif for f in analysis.findings)
    lines.extend(_step_table(analysis.steps, analysis.whatif if priced else None))
    lines.extend(f"warning: {w}" for w in analysis.warnings)
    return "\n".join(lines)

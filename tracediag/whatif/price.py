"""Price each finding by replaying the run without its cause: ``time_lost_ns``, ``step_time_without_ns``,
a sentence, the combined what-if and the per-step table (the `whatif` section of the analysis).

For a finding: lost per step = replay(observed durations) − replay(the cause's edit), at least 0 (both
simulated, so the replay's own bias cancels); ``time_lost_ns`` = its sum over the finding's steps;
``step_time_without_ns`` = the median over those steps of (observed step − lost). The combined
what-if applies every finding's edit at once, on the same steps (the ones the diagnosis read).

Honest by construction: a finding whose what-if recovers less than `Thresholds.whatif_measurable_share`
of the step (1 − its step without the cause / its observed step, both medians over its steps, as the
sentence says them; a pipeline's projection to more micro-batches counts) is
``measurable = False`` — found, costs nothing measurable; a finding whose edit leaves a step of no
time is not priced (``whatif_withheld``); and when the replay of the observed durations misses a rank's
steps by more than `Thresholds.replay_error_limit` (median over steps, ``replay_error_by_rank``) no
what-if is given at all (the What-if analysis drops such traces).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Cause, Finding, WhatIf, WhatIfStep
from tracediag.detect.thresholds import Thresholds
from tracediag.units import NS_PER_MS, format_ms
from tracediag.whatif import causes
from tracediag.whatif.replay import replay, step_times

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from tracediag.detect.facts import Facts
    from tracediag.whatif.graph import Graph


@dataclass(frozen=True)
class Pricing:
    """How the what-if prices one cause (registered with the cause, `tracediag.causes`)."""

    edit: Callable[[Finding, Facts, Graph], causes.Edit | None]
    """The durations to change (`whatif.causes`); None where the graph cannot express the cause (the
    detector's estimate then stays)."""
    removed: Callable[[Finding, Facts, Graph], str]
    """What the edit removes, as the clause that opens the sentence ("without rank 2's extra compute")."""
    project: Callable[[Finding, float], tuple[dict[str, int], str]] | None = None
    """From the finding and its median edited step: projected steps (the JSON's ``whatif.pipeline``
    entry, e.g. m → step) and the clause appended to the sentence; None: no projection."""


def _then(without_ns: float, observed_ns: float) -> str:
    """The clause "the step would take 124 ms instead of 255 ms"."""
    without, observed = (format_ms(ns / NS_PER_MS, None, unit=False) for ns in (without_ns, observed_ns))
    return f"the step would take {without} ms instead of {observed} ms"


def replay_error_by_rank(per_rank: pl.DataFrame) -> dict[int, float]:
    """Per rank (`replay.replay` rows): |replayed − observed| / observed, median over its steps."""
    err = (pl.col("replay_ns") - pl.col("dur_ns")).abs() / pl.col("dur_ns").clip(lower_bound=1)
    rows = per_rank.group_by("rank").agg(err.median().alias("e")).drop_nulls("e").sort("rank")
    return {int(r): float(e) for r, e in rows.iter_rows()}


def _share_of_step(f: Finding, facts: Facts) -> float:
    """The detector's estimate as a share of the step (for findings the replay does not price)."""
    s = facts.steps.filter(pl.col("step").is_in(list(f.steps))) if f.steps else facts.steps
    step = float(s["dur_ns"].median() or 0) if s.height else 0.0
    n = len(f.steps) or (s["step"].n_unique() if s.height else 0)
    return f.time_lost_ns / (n * step) if n and step > 0 else 0.0


def _unpriced(f: Finding, facts: Facts, th: Thresholds, why: str) -> Finding:
    return dataclasses.replace(
        f, whatif_withheld=why, measurable=_share_of_step(f, facts) >= th.whatif_measurable_share
    )


def _withheld(err: dict[int, float], th: Thresholds) -> str:
    """The reason the what-if is withheld (a rank's replay off by more than the limit), or ""."""
    bad = {r: e for r, e in err.items() if e > th.replay_error_limit}
    if not bad:
        return ""
    worst = max(bad, key=bad.get)
    others = f" and {len(bad) - 1} more rank{'s' if len(bad) > 2 else ''}" if len(bad) > 1 else ""
    return (
        f"the replay of the observed durations misses rank {worst}'s steps by {bad[worst]:.1%}{others} (median "
        f"over steps; above {th.replay_error_limit:.0%}): a saving would be within the replay's own error"
    )


def price(
    findings: tuple[Finding, ...],
    facts: Facts,
    graph: Graph,
    pricing: Mapping[Cause, Pricing],
    *,
    thresholds: Thresholds | None = None,
) -> tuple[tuple[Finding, ...], WhatIf]:
    """Findings with replayed ``time_lost_ns``, ``step_time_without_ns``, ``whatif`` and
    ``measurable``, ranked by time lost, and the ``whatif`` section (replay error per rank, combined
    what-if, per step). `pricing`: per cause, how to price it (a cause without an entry keeps its
    detector's estimate). Withheld, with the reason: every what-if when a rank's replay misses its
    observed steps by more than `Thresholds.replay_error_limit`; a finding's when removing its cause
    leaves a step of no time (the trace shows no other work in it)."""
    th = thresholds or Thresholds()
    per_rank = replay(graph)
    base = step_times(per_rank)
    err = ((base["replay_ns"] - base["dur_ns"]).abs() / base["dur_ns"].clip(lower_bound=1)).drop_nulls()
    by_rank = replay_error_by_rank(per_rank)
    withheld = _withheld(by_rank, th)
    priced, edits, projections = [], [], []
    for f in findings:
        how = pricing.get(f.cause)
        edit = how.edit(f, facts, graph) if how is not None and not withheld else None
        if how is None or edit is None:
            why = withheld or "the replay has no matched operation to edit for it: the detector's estimate stands"
            priced.append(_unpriced(f, facts, th, why) if how is not None else f)
            continue
        w = causes.whatif(graph, edit, base)
        mine = w.filter(pl.col("step").is_in(list(f.steps))) if f.steps else w
        if not mine.height:
            priced.append(f)
            continue
        if (mine["without_ns"] <= 0).any() or (mine["edited_ns"].fill_null(0) <= 0).any():
            why = "removing it leaves a step with no time in the replay: the trace shows no other work there to price"
            priced.append(_unpriced(f, facts, th, why))
            continue
        edits.append(edit)
        without = float(mine["without_ns"].median())
        observed = float(mine["dur_ns"].median())
        recovered = 1 - without / max(observed, 1.0)  # the share of the step the sentence says it saves
        proj, tail = how.project(f, float(mine["edited_ns"].median())) if how.project else ({}, "")
        if proj:
            projections.append({"ranks": list(f.ranks), "step_ns_by_microbatches": proj})
            # the projected remedy counts: a pipeline's own bubble is removed by more micro-batches
            recovered = max(recovered, 1 - min(proj.values()) / max(observed, 1.0))
        priced.append(
            dataclasses.replace(
                f,
                time_lost_ns=int(mine["lost_ns"].sum()),
                step_time_without_ns=round(without),
                whatif=f"{how.removed(f, facts, graph)} {_then(without, observed)}{tail}",
                measurable=recovered >= th.whatif_measurable_share,
            )
        )
    ranked = tuple(sorted(priced, key=lambda f: (-f.time_lost_ns, f.cause)))
    all_steps = base.select("step", "dur_ns", "replay_ns")
    if edits:
        combined = causes.whatif(graph, causes.combine(edits), base)
        all_steps = all_steps.join(combined.select("step", without_all_ns="without_ns"), on="step", how="left")
    else:
        all_steps = all_steps.with_columns(without_all_ns=pl.col("dur_ns"))
    med = base.height > 0 and not withheld
    section = WhatIf(
        replay_error_median=round(float(err.median()), 4) if err.len() else None,
        replay_error_max=round(float(err.max()), 4) if err.len() else None,
        operations=int(graph.ops["op"].n_unique()),
        step_time_ns=int(base["dur_ns"].median()) if base.height else None,
        step_time_without_all_ns=int(all_steps["without_all_ns"].median()) if med else None,
        time_lost_all_ns=int((all_steps["dur_ns"] - all_steps["without_all_ns"]).sum()) if med else 0,
        steps=tuple(
            WhatIfStep(int(s), int(d), int(r), int(w))
            for s, d, r, w in all_steps.select("step", "dur_ns", "replay_ns", "without_all_ns").iter_rows()
        ),
        pipeline=tuple(projections),
        replay_error_by_rank={str(r): round(e, 4) for r, e in by_rank.items()},
        withheld=withheld,
    )
    return ranked, section

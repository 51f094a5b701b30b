"""Price each finding by replaying the run without its cause: ``time_lost_ns``, ``step_time_without_ns``,
a sentence, the combined what-if and the per-step table (the `whatif` section of the analysis).

For a finding: lost per step = replay(observed durations) − replay(the cause's edit), at least 0 (both
simulated, so the replay's own bias cancels); ``time_lost_ns`` = its sum over the finding's steps;
``step_time_without_ns`` = the median over those steps of (observed step − lost). The combined
what-if applies every finding's edit at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import polars as pl

from tracediag.analysis import Cause, Finding, WhatIf, WhatIfStep
from tracediag.detect.facts import Facts
from tracediag.whatif import causes
from tracediag.whatif.graph import Graph
from tracediag.whatif.replay import replay, step_times

MS = 1e6


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
    return f"the step would take {without_ns / MS:,.0f} ms instead of {observed_ns / MS:,.0f} ms"


def price(
    findings: tuple[Finding, ...], facts: Facts, graph: Graph, pricing: Mapping[Cause, Pricing]
) -> tuple[tuple[Finding, ...], WhatIf]:
    """Findings with replayed ``time_lost_ns``, ``step_time_without_ns`` and ``whatif``, ranked by
    time lost, and the ``whatif`` section (replay error, combined what-if, per step). `pricing`: per
    cause, how to price it (a cause without an entry keeps its detector's estimate)."""
    base = step_times(replay(graph))
    err = ((base["replay_ns"] - base["dur_ns"]).abs() / base["dur_ns"].clip(lower_bound=1)).drop_nulls()
    priced, edits, projections = [], [], []
    for f in findings:
        how = pricing.get(f.cause)
        edit = how.edit(f, facts, graph) if how is not None else None
        if how is None or edit is None:
            priced.append(f)
            continue
        edits.append(edit)
        w = causes.whatif(graph, edit, base)
        mine = w.filter(pl.col("step").is_in(list(f.steps))) if f.steps else w
        if not mine.height:
            priced.append(f)
            continue
        without = float(mine["without_ns"].median())
        observed = float(mine["dur_ns"].median())
        proj, tail = how.project(f, float(mine["edited_ns"].median())) if how.project else ({}, "")
        if proj:
            projections.append({"ranks": list(f.ranks), "step_ns_by_microbatches": proj})
        priced.append(
            dataclasses.replace(
                f,
                time_lost_ns=int(mine["lost_ns"].sum()),
                step_time_without_ns=round(without),
                whatif=f"{how.removed(f, facts, graph)} {_then(without, observed)}{tail}",
            )
        )
    ranked = tuple(sorted(priced, key=lambda f: (-f.time_lost_ns, f.cause)))
    all_steps = base.select("step", "dur_ns", "replay_ns")
    if edits:
        combined = causes.whatif(graph, causes.combine(edits), base)
        all_steps = all_steps.join(combined.select("step", without_all_ns="without_ns"), on="step", how="left")
    else:
        all_steps = all_steps.with_columns(without_all_ns=pl.col("dur_ns"))
    med = base.height > 0
    section = WhatIf(
        replay_error_median=round(float(err.median()), 4) if err.len() else None,
        replay_error_max=round(float(err.max()), 4) if err.len() else None,
        operations=int(graph.ops["op"].n_unique()),
        step_time_ns=int(base["dur_ns"].median()) if med else None,
        step_time_without_all_ns=int(all_steps["without_all_ns"].median()) if med else None,
        time_lost_all_ns=int((all_steps["dur_ns"] - all_steps["without_all_ns"]).sum()) if med else 0,
        steps=tuple(
            WhatIfStep(int(s), int(d), int(r), int(w))
            for s, d, r, w in all_steps.select("step", "dur_ns", "replay_ns", "without_all_ns").iter_rows()
        ),
        pipeline=tuple(projections),
    )
    return ranked, section

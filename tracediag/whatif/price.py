"""Price each finding by replaying the run without its cause: ``time_lost_ns``, ``step_time_without_ns``,
a sentence, the combined what-if and the per-step table (the `whatif` section of the analysis).

For a finding: lost per step = replay(observed durations) − replay(the cause's edit), at least 0 (both
simulated, so the replay's own bias cancels); ``time_lost_ns`` = its sum over the finding's steps;
``step_time_without_ns`` = the median over those steps of (observed step − lost). The combined
what-if applies every finding's edit at once.
"""

from __future__ import annotations

import dataclasses

import polars as pl

from tracediag.analysis import Finding, WhatIf, WhatIfStep
from tracediag.detect.facts import Facts
from tracediag.detect.pipeline import bubble_formula
from tracediag.whatif import causes
from tracediag.whatif.graph import Graph
from tracediag.whatif.replay import replay, step_times

MS = 1e6
PROJECTED_MICROBATCHES = (2, 4, 8)
"""A pipeline's step is also projected at these multiples of its micro-batches."""


def _edit(f: Finding, facts: Facts, graph: Graph) -> causes.Edit | None:
    """The cause's edit; None where the graph cannot express it (the detector's estimate then stays):
    a pipeline whose send/recv could not be paired (no peers, no schedule annotations) would replay
    its stages as independent, and communication no operation was matched for cannot be sped up."""
    kinds = set(graph.ops.filter(pl.col("rank").is_in(list(f.ranks)))["kind"].to_list())
    if f.cause == "pipeline_bubble" and "p2p" not in kinds:
        return None
    if f.cause == "comm_bound" and "collective" not in kinds:
        return None
    if f.cause == "compute_straggler":
        return causes.combine([causes.straggler(graph, facts.steps, r, f.steps) for r in f.ranks])
    if f.cause == "input_bound":
        return causes.no_input(graph, f.ranks, f.steps)
    if f.cause == "comm_bound":
        return causes.comm(graph, facts.collectives, facts.link_gbps)
    if f.cause == "host_bound":
        return causes.no_idle(graph, f.ranks, f.steps)
    if f.cause == "host_straggler":  # the late rank's device idle (its host late) closed in its late steps
        return causes.no_idle(graph, f.ranks, f.steps)
    if f.cause == "input_straggler":
        return causes.no_input(graph, f.ranks, f.steps)
    if f.cause == "pipeline_bubble":
        return causes.pipeline(graph, facts.steps, f.ranks, f.steps)
    return None


def _ranks(ranks: tuple[int, ...]) -> str:
    return f"rank {ranks[0]}'s" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}'"


def _sentence(f: Finding, without_ns: float, observed_ns: float, facts: Facts, graph: Graph) -> str:
    """ "without rank 2's extra compute the step would take 131 ms instead of 379 ms"."""
    then = f"the step would take {without_ns / MS:,.0f} ms instead of {observed_ns / MS:,.0f} ms"
    if f.cause == "compute_straggler":
        return f"without {_ranks(f.ranks)} extra compute {then}"
    if f.cause == "input_bound":
        return f"without the wait for data {then}"
    if f.cause == "host_bound":
        return f"with the host's launch gaps closed {then}"
    if f.cause == "host_straggler":
        return f"without {_ranks(f.ranks)} idle time in its late steps (its host on time) {then}"
    if f.cause == "input_straggler":
        return f"without {_ranks(f.ranks)} data loading in its late steps {then}"
    if f.cause == "comm_bound":
        sized = graph.ops.filter(pl.col("kind") == "collective", pl.col("bytes").fill_null(0) > 0).height > 0
        if not sized:
            return f"with every collective as fast as in its fastest step (the trace has no message sizes) {then}"
        bw = facts.link_gbps
        link = f"the link's {bw:g} GB/s" if bw else "the best bus bandwidth the run reached"
        return f"with communication at {link} {then}"
    if f.cause == "pipeline_bubble":
        p, m = f.evidence.get("p"), f.evidence.get("m")
        ideal = f" ({bubble_formula(p, m):.0%} for p={p}, m={m})" if p and m else ""
        return f"with balanced stages and free transfers, only the schedule's own bubble left{ideal}, {then}"
    return ""


def _projection(f: Finding, edited_ns: float) -> dict[str, int]:
    """A pipeline's ideal step at more micro-batches: the ideal step scales as (m+p−1)/m."""
    p, m = f.evidence.get("p"), f.evidence.get("m")
    if not p or not m:
        return {}
    now = (m + p - 1) / m
    return {str(k * m): round(edited_ns * ((k * m + p - 1) / (k * m)) / now) for k in PROJECTED_MICROBATCHES}


def _more_microbatches(f: Finding, proj: dict[str, int]) -> str:
    """ "; with 4 micro-batches (4x) about 310 ms" for a pipeline."""
    m = f.evidence.get("m")
    if not proj or not m or str(4 * m) not in proj:
        return ""
    return f"; with {4 * m} micro-batches (4x) about {proj[str(4 * m)] / MS:,.0f} ms"


def price(findings: tuple[Finding, ...], facts: Facts, graph: Graph) -> tuple[tuple[Finding, ...], WhatIf]:
    """Findings with replayed ``time_lost_ns``, ``step_time_without_ns`` and ``whatif``, ranked by
    time lost, and the ``whatif`` section (replay error, combined what-if, per step)."""
    base = step_times(replay(graph))
    err = ((base["replay_ns"] - base["dur_ns"]).abs() / base["dur_ns"].clip(lower_bound=1)).drop_nulls()
    priced, edits, projections = [], [], []
    for f in findings:
        edit = _edit(f, facts, graph)
        if edit is None:
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
        proj = _projection(f, float(mine["edited_ns"].median())) if f.cause == "pipeline_bubble" else {}
        if proj:
            projections.append({"ranks": list(f.ranks), "step_ns_by_microbatches": proj})
        priced.append(
            dataclasses.replace(
                f,
                time_lost_ns=int(mine["lost_ns"].sum()),
                step_time_without_ns=round(without),
                whatif=_sentence(f, without, observed, facts, graph) + _more_microbatches(f, proj),
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

"""input_bound: every rank's device idles at step start while its host loads data.

Per (rank, step): input share = ``input_ns`` / step, and starvation = ``lead_idle_ns`` (the device
idle with nothing to do before the step's first activity) ≥ `input_stall` × ``input_ns``. Found
when every rank's median input share ≥ `input_share` and the median rank-step is starved.

A loader the trace does not name (a plain Python generator, no ``DataLoader`` or ``dataloader``
annotation) leaves only the starvation: when no rank records data loading but every rank's device
idles before each step's first activity for at least `input_share` of the step (median over
steps) — idle, not communicating, so not a peer or an FSDP gather — the host is preparing the step
in code the profiler does not show; this is reported as input_bound with half the confidence and
a hint to annotate the loader.

The share is of the step's *own time*: the step less the rank's waiting for late peers in collectives
(``wait_ns``), median over the ranks of that step. A straggler stretches every rank's step with waiting
(and its own with its extra compute), which another finding explains; against the stretched step the
same loader shrinks below the threshold although it costs every rank as much (held-out round 6: a
300 ms loader at 18–23% of a step a straggler doubled, 25–42% of its own time).

Steps: those where the median over ranks of the share reaches `step_share` × `input_share`.
time_lost_ns = Σ over them of the median over ranks of the starvation (capped by the loading time
when it is known): device time spent waiting for the batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Finding
from tracediag.units import NS_PER_MS, count

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.detect.thresholds import Thresholds


def own_time() -> pl.Expr:
    """The step's own time on ``steps`` rows: the step less the rank's waiting for late peers, median over
    the ranks of the step (what the shares are of)."""
    return (pl.col("dur_ns") - pl.col("wait_ns")).clip(lower_bound=1).median().over("step")


def detect(facts: Facts, *, thresholds: Thresholds) -> list[Finding]:
    """An input_bound finding when data loading starves every rank's device."""
    th = thresholds
    steps = facts.steps
    if not steps.height:
        return []
    annotated = steps.select(pl.col("input_ns").max()).item() > 0
    own = own_time()
    s = steps.with_columns(
        share=(pl.col("input_ns") if annotated else pl.col("lead_idle_ns")) / own,
        starved=pl.col("lead_idle_ns") >= th.input_stall * pl.col("input_ns"),
        lost=pl.min_horizontal("lead_idle_ns", "input_ns") if annotated else pl.col("lead_idle_ns"),
    )
    per_rank = s.group_by("rank").agg(share=pl.col("share").median(), starved=pl.col("starved").mean()).sort("rank")
    if per_rank["share"].min() < th.input_share or per_rank["starved"].median() < th.input_starved_share:
        return []
    per_step = s.group_by("step").agg(share=pl.col("share").median(), lost=pl.col("lost").median())
    hit = per_step.filter(pl.col("share") >= th.step_share * th.input_share).sort("step")
    ranks = tuple(per_rank["rank"].to_list())
    share = float(per_rank["share"].median())
    lead = s["lead_idle_ns"].median() / NS_PER_MS
    if annotated:
        summary = (
            f"every rank's device waits for data: loading takes {share:.0%} of the step's own time (less the "
            f"waiting for late peers; median over "
            f"{count(len(ranks), 'rank')}, min {per_rank['share'].min():.0%}) and the device sits idle {lead:.1f} ms "
            "before each step's first work"
        )
    else:
        summary = (
            f"every rank's device sits idle {share:.0%} of the step's own time (less the waiting for late peers; "
            f"{lead:.1f} ms) before each step's first "
            "work, with no communication to wait for: the host prepares the step in code the trace does "
            "not name, most often the data loader (wrap it in record_function('dataloader') to confirm)"
        )
    evidence = {
        "input_share_median": round(share, 3),
        "input_share_by_rank": {str(r): round(float(v), 3) for r, v, _ in per_rank.iter_rows()},
        "input_ms_median": round(float(s["input_ns"].median()) / NS_PER_MS, 3),
        "lead_idle_ms_median": round(float(s["lead_idle_ns"].median()) / NS_PER_MS, 3),
        "loader_annotated": annotated,
        "step_ms_median": round(float(s["dur_ns"].median()) / NS_PER_MS, 3),
    }
    confidence = min(1.0, float(per_rank["share"].min()) / (2 * th.input_share)) * float(per_rank["starved"].median())
    confidence *= 1.0 if annotated else 0.5
    return [
        Finding(
            cause="input_bound",
            ranks=ranks,
            steps=tuple(hit["step"].to_list()),
            time_lost_ns=int(hit["lost"].sum()),
            confidence=min(1.0, confidence),
            summary=summary,
            evidence=evidence,
        )
    ]

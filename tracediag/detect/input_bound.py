"""input_bound: every rank's device idles at step start while its host loads data.

Per (rank, step): input share = ``input_ns`` / step, and starvation = ``stall_ns`` (step start to
first compute) ≥ `input_stall` × ``input_ns``. Found when every rank's median input share ≥
`input_share` and the median rank-step is starved. Steps: those where the median over ranks of
the input share reaches `input_share`. time_lost_ns = Σ over them of the median over ranks of
min(stall, input): device time spent waiting for the batch.
"""

from __future__ import annotations

import polars as pl

from tracediag.analysis import Finding
from tracediag.detect.facts import Facts
from tracediag.detect.thresholds import Thresholds

MS = 1e6


def detect(facts: Facts, *, thresholds: Thresholds) -> list[Finding]:
    """An input_bound finding when data loading starves every rank's device."""
    th = thresholds
    steps = facts.steps
    if not steps.height:
        return []
    s = steps.with_columns(
        share=pl.col("input_ns") / pl.col("dur_ns").clip(lower_bound=1),
        starved=pl.col("stall_ns") >= th.input_stall * pl.col("input_ns"),
        lost=pl.min_horizontal("stall_ns", "input_ns"),
    )
    per_rank = s.group_by("rank").agg(share=pl.col("share").median(), starved=pl.col("starved").mean()).sort("rank")
    if per_rank["share"].min() < th.input_share or per_rank["starved"].median() < 0.5:
        return []
    per_step = s.group_by("step").agg(share=pl.col("share").median(), lost=pl.col("lost").median())
    hit = per_step.filter(pl.col("share") >= th.input_share).sort("step")
    ranks = tuple(per_rank["rank"].to_list())
    share = float(per_rank["share"].median())
    summary = (
        f"every rank's device waits for data: loading takes {share:.0%} of the step (median over "
        f"{len(ranks)} ranks, min {per_rank['share'].min():.0%}) and the step's first compute starts "
        f"{s['stall_ns'].median() / MS:.1f} ms after the step begins"
    )
    evidence = {
        "input_share_median": round(share, 3),
        "input_share_by_rank": {str(r): round(float(v), 3) for r, v, _ in per_rank.iter_rows()},
        "input_ms_median": round(float(s["input_ns"].median()) / MS, 3),
        "stall_ms_median": round(float(s["stall_ns"].median()) / MS, 3),
        "step_ms_median": round(float(s["dur_ns"].median()) / MS, 3),
    }
    confidence = min(1.0, float(per_rank["share"].min()) / (2 * th.input_share)) * float(per_rank["starved"].median())
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

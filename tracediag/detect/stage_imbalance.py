"""stage_imbalance: one pipeline stage computes more per micro-batch than the others, which wait for it.

Per pipeline (`derive.p2p`: ranks in stage order, m = the first stage's sends per step), per step
each stage's compute; the *heavy* stage is the one with the most compute, median over steps. Found
when its median compute is at least `stage_ratio` × the median of the other stages' medians, it is
the heaviest stage on at least `stage_heavy_share` of the steps, and the other stages wait for it:
their median bubble (send/recv waits + idle) is at least `stage_wait` × the heavy stage's excess over
them (a heavier stage whose excess the schedule hides costs nothing). Per micro-batch = per step / m.

How it relates to ``pipeline_bubble``: a synchronous schedule idles (p−1)/(m+p−1) of the step even
with equal stages; an unequal pipeline runs at its slowest stage's pace, and every other stage's
idle grows by its shortfall. When this detector fires on a pipeline, that pipeline's bubble is its
effect and is reported in this finding (``idle_share_by_stage``, ``expected_bubble_share``), not as a
separate ``pipeline_bubble`` finding; a pipeline of balanced stages keeps ``pipeline_bubble``.

Which operators make the difference: per operator (CPU traces) or kernel (GPU traces) name, its
time per step on the heavy stage minus the median over the other stages (`Facts.kernel_steps`); the
largest differences are listed, those the other stages never run marked as such.

time_lost_ns (the detector's estimate; the what-if replaces it): a synchronous schedule runs its m
micro-batches at the heavy stage's pace plus p−1 fill/drain slots at the other stages' pace, so per
step (C = a stage's compute per step) C_heavy − C_mean + (p−1)/m × (C_light − C_mean), C_light the
other stages' median. The what-if sets every stage's compute to the mean stage compute
of the step (the same work, rebalanced).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Finding
from tracediag.derive.p2p import stage_order
from tracediag.detect.pipeline import bubble_formula
from tracediag.units import NS_PER_MS

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.detect.thresholds import Thresholds

TOP_OPS = 5
"""Operator differences listed in the evidence."""


def _ops_difference(facts: Facts, heavy: int, light: list[int], n_steps: int) -> list[dict]:
    """The operators whose time per step differs most between the heavy stage and the median light stage."""
    ks = facts.kernel_steps
    if ks is None or not ks.height:
        return []
    keys = facts.steps.select("rank", "step")
    per_rank = (
        ks.filter(pl.col("category") == "compute")
        .join(keys, on=["rank", "step"], how="semi")
        .group_by("rank", "name")
        .agg(ms=pl.col("total_ns").sum() / NS_PER_MS / n_steps)
    )
    names = per_rank.select("name").unique()
    grid = names.join(pl.DataFrame({"rank": [heavy, *light]}, schema={"rank": pl.Int32}), how="cross")
    full = grid.join(per_rank, on=["rank", "name"], how="left").with_columns(pl.col("ms").fill_null(0.0))
    diff = (
        full.group_by("name")
        .agg(
            heavy_ms=pl.col("ms").filter(pl.col("rank") == heavy).first(),
            others_ms=pl.col("ms").filter(pl.col("rank") != heavy).median(),
            others_max=pl.col("ms").filter(pl.col("rank") != heavy).max(),
        )
        .with_columns(diff_ms=pl.col("heavy_ms") - pl.col("others_ms"))
        .filter(pl.col("diff_ms") > 0)
        .sort(["diff_ms", "name"], descending=[True, False])
        .head(TOP_OPS)
    )
    return [
        {
            "name": name,
            "ms_per_step": round(h, 3),
            "others_ms_per_step": round(o, 3),
            "only_this_stage": bool(mx == 0),
        }
        for name, h, o, mx in diff.select("name", "heavy_ms", "others_ms", "others_max").iter_rows()
    ]


def detect(facts: Facts, *, thresholds: Thresholds) -> list[Finding]:
    """One stage_imbalance finding per pipeline with a heavy stage that the others wait for."""
    th = thresholds
    findings = []
    s = facts.steps.with_columns(bubble_ns=pl.col("exposed_p2p_ns") + pl.col("idle_ns"))
    n_steps = s["step"].n_unique()
    for ranks in facts.pipelines:
        order = stage_order(facts.p2p, ranks)
        p = len(order)
        m = int(facts.p2p.filter(pl.col("rank") == order[0])["sends"].median() or 0) if p else 0
        if p < 2 or m < 1 or not n_steps:
            continue
        mine = s.filter(pl.col("rank").is_in(order))
        per_stage = mine.group_by("rank").agg(
            compute=pl.col("compute_ns").median(),
            bubble=pl.col("bubble_ns").median(),
            share=(pl.col("bubble_ns") / pl.col("dur_ns").clip(lower_bound=1)).median(),
        )
        comp = dict(per_stage.select("rank", "compute").iter_rows())
        heavy = max(order, key=lambda r: (comp.get(r) or 0, -r))
        light = [r for r in order if r != heavy]
        light_compute = float(pl.Series([comp.get(r) or 0 for r in light]).median())
        ratio = (comp.get(heavy) or 0) / max(light_compute, 1.0)
        top = mine.with_columns(_top=pl.col("compute_ns") == pl.col("compute_ns").max().over("step"))
        heavy_share = float(top.filter(pl.col("rank") == heavy)["_top"].mean() or 0.0)
        bubble = dict(per_stage.select("rank", "bubble").iter_rows())
        light_bubble = float(pl.Series([bubble.get(r) or 0 for r in light]).median())
        excess = (comp.get(heavy) or 0) - light_compute
        if ratio < th.stage_ratio or heavy_share < th.stage_heavy_share or light_bubble < th.stage_wait * excess:
            continue
        per_step = mine.group_by("step").agg(
            heavy=pl.col("compute_ns").filter(pl.col("rank") == heavy).first(),
            light=pl.col("compute_ns").filter(pl.col("rank") != heavy).median(),
            mean=pl.col("compute_ns").mean(),
        )
        # a synchronous schedule runs m micro-batches at the slowest stage's pace plus p-1 fill and drain
        # slots of the others: balanced, all m + p - 1 slots at the mean
        saved = (pl.col("heavy") - pl.col("mean")) + (p - 1) / m * (pl.col("light") - pl.col("mean"))
        lost = int(per_step.select(saved.clip(lower_bound=0).sum()).item())
        dur = mine.group_by("step").agg(pl.col("dur_ns").median())
        balanced = per_step.join(dur, on="step").select(pl.col("dur_ns") - saved.clip(lower_bound=0))
        balanced_ms = float(balanced.to_series().median()) / NS_PER_MS
        stage = order.index(heavy)
        shares = dict(per_stage.select("rank", "share").iter_rows())
        per_mb = {str(i): round((comp.get(r) or 0) / m / NS_PER_MS, 3) for i, r in enumerate(order)}
        ops = _ops_difference(facts, heavy, light, n_steps)
        expected = round(bubble_formula(p, m), 4)
        what = "the last stage" if stage == p - 1 else "the first stage" if stage == 0 else f"stage {stage}"
        top_ops = ", ".join(
            f"{o['name']} +{o['ms_per_step'] - o['others_ms_per_step']:.1f} ms"
            + (" (only this stage)" if o["only_this_stage"] else "")
            for o in ops[:3]
        )
        summary = (
            f"pipeline stage {stage} (rank {heavy}, {what} of {p}) computes {ratio:.1f}x the other stages' median "
            f"per micro-batch ({per_mb[str(stage)]:.1f} ms against {light_compute / m / NS_PER_MS:.1f} ms, m={m}); the "
            f"other stages wait {light_bubble / NS_PER_MS:.0f} ms per step for it"
            + (f"; the difference: {top_ops} per step" if top_ops else "")
        )
        evidence = {
            "stage": stage,
            "rank": heavy,
            "stage_ranks": list(order),
            "p": p,
            "m": m,
            "compute_ratio": round(ratio, 3),
            "heaviest_on_share": round(heavy_share, 3),
            "compute_ms_per_microbatch_by_stage": per_mb,
            "mean_stage_compute_ms_per_microbatch": round(sum(comp.get(r) or 0 for r in order) / p / m / NS_PER_MS, 3),
            "others_wait_ms_median": round(light_bubble / NS_PER_MS, 3),
            "idle_share_by_stage": {str(i): round(float(shares.get(r) or 0), 4) for i, r in enumerate(order)},
            "expected_bubble_share": expected,
            "ops_difference": ops,
            "balanced_step_ms_schedule_estimate": round(balanced_ms, 3),
        }
        findings.append(
            Finding(
                cause="stage_imbalance",
                ranks=(heavy,),
                steps=tuple(sorted(mine["step"].unique().to_list())),
                time_lost_ns=lost,
                confidence=min(1.0, (ratio - 1) / (2 * (th.stage_ratio - 1))) * heavy_share,
                summary=summary,
                evidence=evidence,
            )
        )
    return findings

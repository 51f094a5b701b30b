"""pipeline_bubble: pipeline stages idle waiting on each other.

Stages and their order come from the send/recv traffic (`derive.p2p`): p = the pipeline's ranks,
m = the first stage's sends per step (one activation per micro-batch; median over steps). The
interleaving degree v is not visible in CPU traces without peers and is taken as 1. Per stage and
step, the bubble is the time the stage neither computes nor runs a collective: waiting in
send/recv (``exposed_p2p_ns``) plus idle (``idle_ns``). Its share of the step is reported next to
the ideal (p−1)/(m+p−1) (÷ v when interleaved; Narayanan et al. 2021). Found when the median
over stages of each stage's median share ≥ `bubble_share`, the stages exchange traffic (a send or a
recv on every stage) in every analysed step, and the share reaches `bubble_of_ideal` × the ideal
(a 2-rank DDP job that sends one tensor per step and idles 21% against an ideal of 50% is not
a pipeline schedule). Steps: those whose median share over
stages reaches `step_share` × `bubble_share`. time_lost_ns = Σ over them of the median bubble time
over stages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Finding, Pipeline, StageIdle
from tracediag.derive.p2p import stage_order
from tracediag.units import NS_PER_MS

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.detect.thresholds import Thresholds


def bubble_formula(p: int, m: int, v: int = 1) -> float:
    """Ideal bubble share of a synchronous pipeline: (p−1)/(m+p−1), divided by v when interleaved."""
    return (p - 1) / (m + p - 1) / v


def pipeline_stages(facts: Facts) -> list[Pipeline]:
    """Per pipeline: ranks in stage order, p, m, v, the ideal bubble share and per stage the idle
    share (median over steps) — `Analysis.pipelines`."""
    out = []
    s = facts.steps.with_columns(
        bubble_ns=pl.col("exposed_p2p_ns") + pl.col("idle_ns"),
    ).with_columns(share=pl.col("bubble_ns") / pl.col("dur_ns").clip(lower_bound=1))
    for ranks in facts.pipelines:
        order = stage_order(facts.p2p, ranks)
        first = facts.p2p.filter(pl.col("rank") == order[0])
        m = int(first["sends"].median() or 0)
        p = len(order)
        if p < 2 or m < 1:
            continue
        per_stage = (
            s.filter(pl.col("rank").is_in(order))
            .group_by("rank")
            .agg(share=pl.col("share").median(), bubble_ms=pl.col("bubble_ns").median() / NS_PER_MS)
        )
        shares = dict(per_stage.select("rank", "share").iter_rows())
        out.append(
            Pipeline(
                ranks=tuple(order),
                p=p,
                m=m,
                v=1,
                expected_bubble_share=round(bubble_formula(p, m), 4),
                stages=tuple(
                    StageIdle(stage=i, rank=r, idle_share=round(float(shares.get(r) or 0.0), 4))
                    for i, r in enumerate(order)
                ),
            )
        )
    return out


def detect(facts: Facts, *, thresholds: Thresholds) -> list[Finding]:
    """One pipeline_bubble finding per pipeline whose stages idle more than `bubble_share`."""
    th = thresholds
    findings = []
    s = facts.steps.with_columns(
        bubble_ns=pl.col("exposed_p2p_ns") + pl.col("idle_ns"),
    ).with_columns(share=pl.col("bubble_ns") / pl.col("dur_ns").clip(lower_bound=1))
    for pipe in pipeline_stages(facts):
        shares = [st.idle_share for st in pipe.stages]
        median_share = float(pl.Series(shares).median())
        if median_share < th.bubble_share or median_share < th.bubble_of_ideal * pipe.expected_bubble_share:
            continue
        traffic = facts.p2p.filter(pl.col("rank").is_in(list(pipe.ranks)), (pl.col("sends") + pl.col("recvs")) > 0)
        n_steps = facts.steps["step"].n_unique()
        if traffic.select("rank", "step").unique().height < len(pipe.ranks) * n_steps:
            continue
        per_step = (
            s.filter(pl.col("rank").is_in(pipe.ranks))
            .group_by("step")
            .agg(share=pl.col("share").median(), lost=pl.col("bubble_ns").median())
        )
        hit = per_step.filter(pl.col("share") >= th.step_share * th.bubble_share).sort("step")
        expected = pipe.expected_bubble_share
        p, m = pipe.p, pipe.m
        stage_text = ", ".join(f"stage {st.stage} (rank {st.rank}) {st.idle_share:.0%}" for st in pipe.stages)
        summary = (
            f"{p} pipeline stages idle {median_share:.0%} of each step waiting on each other "
            f"(ideal bubble (p-1)/(m+p-1) = {expected:.0%} for p={p}, m={m}): {stage_text}"
        )
        evidence = {
            "p": p,
            "m": m,
            "v": 1,
            "expected_bubble_share": expected,
            "idle_share_median": round(median_share, 4),
            "idle_share_by_stage": {str(st.stage): st.idle_share for st in pipe.stages},
            "stage_ranks": list(pipe.ranks),
            "excess_over_ideal": round(median_share - expected, 4),
        }
        findings.append(
            Finding(
                cause="pipeline_bubble",
                ranks=tuple(sorted(pipe.ranks)),
                steps=tuple(hit["step"].to_list()),
                time_lost_ns=int(hit["lost"].sum()),
                confidence=min(1.0, median_share / (2 * th.bubble_share)),
                summary=summary,
                evidence=evidence,
            )
        )
    return findings

"""Detectors: one module per cause, each `detect(facts, *, thresholds) -> list[Finding]`.

`detect_all` runs them, ranks the findings by time lost, and returns a single ``healthy`` finding
when none fires.
"""

from __future__ import annotations

import polars as pl

from tracediag.analysis import Finding, Lateness
from tracediag.detect import comm_bound, host_bound, input_bound, pipeline, straggler
from tracediag.detect import lateness as lateness_detect
from tracediag.detect.facts import Facts
from tracediag.detect.thresholds import Thresholds
from tracediag.words import count

__all__ = ["Facts", "Thresholds", "detect_all"]

MS = 1e6
LATE_CAUSES = ("compute_straggler", "host_straggler", "input_straggler")
"""Causes that name a rank everyone waits for."""


def _closest(s, th: Thresholds, ratios: pl.DataFrame) -> str:
    """The cause whose run-level measure came nearest its threshold, as a clause (or ""); `ratios`:
    `straggler.rank_step_ratios` of `s`."""
    share = (pl.col("exposed_comm_ns") - pl.col("exposed_p2p_ns")) / pl.col("dur_ns").clip(1)
    comm = s.group_by("rank").agg(share.median())["exposed_comm_ns"].median()
    ratio = ratios.group_by("rank").agg(pl.col("ratio").median())["ratio"].max()
    lead = s.group_by("rank").agg((pl.col("lead_idle_ns") / pl.col("dur_ns").clip(1)).median())["lead_idle_ns"].min()
    idle = host_bound.idle_share(s) or 0.0
    near = [
        (idle / th.host_idle_share, f"device idle {idle:.0%} of the step (host_bound from {th.host_idle_share:.0%})"),
        (comm / th.comm_share, f"exposed communication {comm:.0%} of the step (comm_bound from {th.comm_share:.0%})"),
        (
            (ratio - 1) / (th.straggler_persistent_ratio - 1),
            f"the slowest rank computes {ratio:.2f}x its peers (compute_straggler from "
            f"{th.straggler_persistent_ratio}x, or {th.straggler_min_ratio}x when it is last on most steps)",
        ),
        (
            lead / th.input_share,
            f"device idle before each step's first work {lead:.0%} (input_bound from {th.input_share:.0%})",
        ),
    ]
    score, text = max(near, key=lambda x: x[0] if x[0] == x[0] else -1)
    return f"; closest: {text}" if score >= 0.5 else ""


def _healthy(facts: Facts, th: Thresholds, ratios: pl.DataFrame | None) -> Finding:
    s = facts.steps
    ranks = tuple(sorted(s["rank"].unique().to_list())) if s.height else ()
    evidence = {}
    if ratios is not None:
        ratio = ratios["ratio"]
        evidence = {
            "step_ms_median": round(float(s["dur_ns"].median()) / MS, 3),
            "exposed_comm_share_median": round(float((s["exposed_comm_ns"] / s["dur_ns"].clip(1)).median()), 3),
            "compute_ratio_max": round(float(ratio.max()), 3),
            "input_share_median": round(float((s["input_ns"] / s["dur_ns"].clip(1)).median()), 3),
            "idle_share_median": round(host_bound.idle_share(s) or 0.0, 3),
        }
    summary = (
        f"no cause found over {count(s['step'].n_unique() if s.height else 0, 'step')} on {count(len(ranks), 'rank')}: "
        "no rank computes persistently longer than its peers, exposed communication, pipeline idle, "
        "data loading and device idle stay below their thresholds"
        + (_closest(s, th, ratios) if ratios is not None else "")
    )
    return Finding(
        cause="healthy", ranks=ranks, steps=(), time_lost_ns=0, confidence=1.0, summary=summary, evidence=evidence
    )


def detect_all(
    facts: Facts, *, thresholds: Thresholds | None = None, lateness: Lateness | None = None
) -> tuple[Finding, ...]:
    """All findings, most time lost first; a single ``healthy`` finding when no cause is found.
    `lateness`: who everyone waits for (`detect.lateness.assess` of `facts`); its ranks get a
    finding with the reason they are late (`detect.lateness.detect`), and comm_bound does not fire
    while someone is waited for (the exposed communication is waiting for them)."""
    th = thresholds or Thresholds()
    # read by the straggler detector and, when nothing is found, by the healthy finding: derived once
    ratios = straggler.rank_step_ratios(facts.steps, th) if facts.steps.height else None
    found = straggler.detect(facts, thresholds=th, ratios=ratios)
    found = lateness_detect.detect(facts, lateness, th, found)
    found += pipeline.detect(facts, thresholds=th)
    persistent = tuple(
        r for f in found if f.cause == "compute_straggler" and f.evidence["kind"] == "persistent" for r in f.ranks
    )
    if lateness is not None and any(f.cause in LATE_CAUSES for f in found):
        persistent += lateness.waited_for
    found += comm_bound.detect(facts, thresholds=th, straggler_ranks=persistent)
    found += input_bound.detect(facts, thresholds=th)
    explained = any(f.cause in ("input_bound", "pipeline_bubble") for f in found)
    found += host_bound.detect(facts, thresholds=th, explained=explained)
    if not found:
        return (_healthy(facts, th, ratios),)
    return tuple(sorted(found, key=lambda f: (-f.time_lost_ns, f.cause)))

"""Detectors: one module per cause, each `detect(facts, *, thresholds) -> list[Finding]`.

`detect_all` runs them, ranks the findings by time lost, and returns a single ``healthy`` finding
when none fires.
"""

from __future__ import annotations

from tracediag.analysis import Finding
from tracediag.detect import comm_bound, input_bound, pipeline, straggler
from tracediag.detect.facts import Facts
from tracediag.detect.thresholds import Thresholds

__all__ = ["Facts", "Thresholds", "detect_all"]

MS = 1e6


def _healthy(facts: Facts) -> Finding:
    s = facts.steps
    ranks = tuple(sorted(s["rank"].unique().to_list())) if s.height else ()
    evidence = {}
    if s.height:
        ratio = straggler.rank_step_ratios(s, Thresholds())["ratio"]
        evidence = {
            "step_ms_median": round(float(s["dur_ns"].median()) / MS, 3),
            "exposed_comm_share_median": round(float((s["exposed_comm_ns"] / s["dur_ns"].clip(1)).median()), 3),
            "compute_ratio_max": round(float(ratio.max()), 3),
            "input_share_median": round(float((s["input_ns"] / s["dur_ns"].clip(1)).median()), 3),
        }
    summary = (
        f"no cause found over {s['step'].n_unique() if s.height else 0} steps on {len(ranks)} ranks: "
        "no rank computes persistently longer than its peers, exposed communication, pipeline idle "
        "and data loading stay below their thresholds"
    )
    return Finding(
        cause="healthy", ranks=ranks, steps=(), time_lost_ns=0, confidence=1.0, summary=summary, evidence=evidence
    )


def detect_all(facts: Facts, *, thresholds: Thresholds | None = None) -> tuple[Finding, ...]:
    """All findings, most time lost first; a single ``healthy`` finding when no cause is found."""
    th = thresholds or Thresholds()
    found = straggler.detect(facts, thresholds=th)
    found += pipeline.detect(facts, thresholds=th)
    persistent = tuple(
        r for f in found if f.cause == "compute_straggler" and f.evidence["kind"] == "persistent" for r in f.ranks
    )
    found += comm_bound.detect(facts, thresholds=th, straggler_ranks=persistent)
    found += input_bound.detect(facts, thresholds=th)
    if not found:
        return (_healthy(facts),)
    return tuple(sorted(found, key=lambda f: (-f.time_lost_ns, f.cause)))

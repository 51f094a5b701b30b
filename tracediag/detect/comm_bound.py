"""comm_bound: communication that no compute hides takes a large share of every rank's step.

Per (rank, step): share = exposed collective communication (``exposed_comm_ns`` − ``exposed_p2p_ns``:
pipeline send/recv waits are the bubble's, not the wire's) / step. The time spent waiting inside
collectives for late peers stays in: on a loaded or congested job arrivals scatter on every
collective, and that scatter is part of what communication costs (measured: subtracting it lost
two of four held-out communication-bound runs); a single late rank is caught instead by requiring
no compute straggler and a high share on *every* rank. Found when the median over ranks of each
rank's median share ≥ `comm_share`, every rank's ≥ `comm_share_min_rank`, and no rank is a compute
outlier (no compute_straggler finding). Steps: those whose median share over ranks reaches
`step_share` × `comm_share`. time_lost_ns = Σ over them of the median exposed collective time.

Bus bandwidth: the median over matched instances with a known size (nccl-tests busbw). With the
link's peak (``--link-gbps`` or a preset) it says whether the link is saturated (≥ `comm_near_peak`
of peak: too much traffic for the link) or slow (≤ `comm_far_below`: a slow or degraded link).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Finding
from tracediag.units import NS_PER_MS, count

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.detect.thresholds import Thresholds


def _bandwidth_verdict(busbw: float | None, link_gbps: float | None, th: Thresholds) -> tuple[str, dict]:
    if busbw is None:
        return "bus bandwidth unknown (the trace records no message sizes)", {"busbw_gbps_median": None}
    fields = {"busbw_gbps_median": round(busbw, 3), "link_gbps": link_gbps}
    if link_gbps is None:
        return f"achieved bus bandwidth {busbw:.2f} GB/s (give --link-gbps to compare with the link)", fields
    share = busbw / link_gbps
    fields["busbw_share_of_peak"] = round(share, 3)
    if share >= th.comm_near_peak:
        verdict = "near the link's peak: too much traffic for the link"
    elif share <= th.comm_far_below:
        verdict = "far below the link's peak: a slow or degraded link"
    else:
        verdict = "below the link's peak"
    fields["bandwidth_verdict"] = verdict
    return f"bus bandwidth {busbw:.2f} GB/s = {share:.0%} of {link_gbps:g} GB/s, {verdict}", fields


def _traffic(collectives: pl.DataFrame) -> dict:
    """What the wire carries per step: matched collectives and their median size (when recorded),
    so a reader can tell many small messages (latency, bucketing) from a few large ones."""
    if not collectives.height:
        return {}
    per_step = collectives.group_by("step").len()["len"].median()
    sizes = collectives["bytes"].drop_nulls()
    return {
        "collectives_per_step_median": float(per_step),
        "message_bytes_median": int(sizes.median()) if sizes.len() else None,
    }


def detect(facts: Facts, *, thresholds: Thresholds, straggler_ranks: tuple[int, ...] = ()) -> list[Finding]:
    """A comm_bound finding when exposed collective communication dominates every rank's steps."""
    th = thresholds
    steps = facts.steps
    if not steps.height or straggler_ranks:
        return []
    s = steps.with_columns(
        exposed_coll_ns=pl.col("exposed_comm_ns") - pl.col("exposed_p2p_ns"),
    ).with_columns(share=pl.col("exposed_coll_ns") / pl.col("dur_ns").clip(lower_bound=1))
    per_rank = s.group_by("rank").agg(share=pl.col("share").median()).sort("rank")
    median_share = per_rank["share"].median()
    if median_share < th.comm_share or per_rank["share"].min() < th.comm_share_min_rank:
        return []
    per_step = s.group_by("step").agg(share=pl.col("share").median(), exposed=pl.col("exposed_coll_ns").median())
    hit = per_step.filter(pl.col("share") >= th.step_share * th.comm_share).sort("step")
    sized = facts.collectives.filter(pl.col("busbw_gbps").is_not_null())
    busbw = float(sized["busbw_gbps"].median()) if sized.height else None
    bw_text, bw_fields = _bandwidth_verdict(busbw, facts.link_gbps, th)
    ranks = tuple(per_rank["rank"].to_list())
    summary = (
        f"exposed communication takes {median_share:.0%} of the step (median over {count(len(ranks), 'rank')}, "
        f"{per_rank['share'].min():.0%}..{per_rank['share'].max():.0%}) and no rank is an outlier; {bw_text}"
    )
    confidence = min(1.0, median_share / (2 * th.comm_share) + 0.5) * min(1.0, per_rank["share"].min() / th.comm_share)
    if facts.world_size and len(ranks) < facts.world_size:
        # exposed time includes waiting for peers: an untraced slow rank would look the same
        summary += (
            f"; only {len(ranks)} of {facts.world_size} ranks traced, so waiting for an untraced slow rank "
            "cannot be ruled out"
        )
        confidence *= 0.5
    evidence = {
        "exposed_comm_share_median": round(float(median_share), 3),
        "exposed_comm_share_by_rank": {str(r): round(float(v), 3) for r, v in per_rank.iter_rows()},
        "exposed_comm_ms_median": round(float(s["exposed_coll_ns"].median()) / NS_PER_MS, 3),
        "wait_for_peers_ms_median": round(float(s["wait_ns"].median()) / NS_PER_MS, 3),
        "step_ms_median": round(float(s["dur_ns"].median()) / NS_PER_MS, 3),
        "compute_ms_median": round(float(s["compute_ns"].median()) / NS_PER_MS, 3),
        **_traffic(facts.collectives),
        **bw_fields,
    }
    return [
        Finding(
            cause="comm_bound",
            ranks=ranks,
            steps=tuple(hit["step"].to_list()),
            time_lost_ns=int(hit["exposed"].sum()),
            confidence=confidence,
            summary=summary,
            evidence=evidence,
        )
    ]

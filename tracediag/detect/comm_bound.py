"""comm_bound: communication that no compute hides takes a large share of every rank's step.

Per (rank, step): share = exposed collective communication (``exposed_comm_ns`` − ``exposed_p2p_ns``:
pipeline send/recv waits are the bubble's, not the wire's) / step. The time spent waiting inside
collectives for late peers stays in: on a loaded or congested job arrivals scatter on every collective,
and that scatter is part of what communication costs (measured: subtracting it lost two of four held-out
communication-bound runs). The waiting an outlier found before causes (a straggler that arrives last) is
not the wire's: it is taken out of the exposed time and of the step (``outlier_wait_ns``: at each
instance, how much later the last outlier arrived than the last other rank, as far as the rank waited),
so the share is the one the job would have with the outlier on time — a straggler alone leaves its peers
waiting, not communicating, and a job that is both straggling and communication-bound keeps both
findings. Where every traced rank is an outlier (a straggler that moves between ranks, unbalanced
batches) no rank's steps show the communication alone, and comm_bound is not judged. Found when the
median over ranks (but the outliers) of each rank's median share ≥ `comm_share` and every rank's ≥
`comm_share_min_rank`. Steps: those whose median share over ranks reaches `step_share` × `comm_share`.
time_lost_ns = Σ over them of the median exposed collective time.

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


def _ranks_text(ranks: tuple[int, ...]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in sorted(set(ranks)))


def _without_outlier_wait(steps: pl.DataFrame, late: pl.DataFrame | None, outliers: tuple[int, ...]) -> pl.DataFrame:
    """`steps` with ``outlier_wait_ns``: the part of each rank-step's wait that the `outliers` add, summed over
    the collective instances: at each, how much later the last outlier arrived than the last other rank
    (the wait that would remain with the outliers on time is the job's own scatter, and stays)."""
    if not outliers or late is None or not late.height:
        return steps.with_columns(outlier_wait_ns=pl.lit(0, pl.Int64))
    is_out = pl.col("rank").is_in(list(outliers))
    waits = (
        late.with_columns(
            _excess=(pl.col("arrival").filter(is_out).max() - pl.col("arrival").filter(~is_out).max()).over("iid")
        )
        .filter(~is_out)
        .group_by("rank", "step")
        .agg(outlier_wait_ns=pl.min_horizontal(pl.col("wait_ns"), pl.col("_excess").fill_null(0).clip(0)).sum())
        .with_columns(pl.col("rank").cast(steps.schema["rank"]), pl.col("step").cast(steps.schema["step"]))
    )
    return steps.join(waits, on=["rank", "step"], how="left").with_columns(
        pl.col("outlier_wait_ns").fill_null(0).clip(upper_bound=pl.col("exposed_comm_ns") - pl.col("exposed_p2p_ns"))
    )


def detect(facts: Facts, *, thresholds: Thresholds, straggler_ranks: tuple[int, ...] = ()) -> list[Finding]:
    """A comm_bound finding when exposed collective communication dominates every rank's steps."""
    th = thresholds
    steps = facts.steps
    if not steps.height:
        return []
    if straggler_ranks and (facts.late is None or set(steps["rank"].unique()) <= set(straggler_ranks)):
        return []  # every rank sets the pace in turn (a moving straggler): no rank shows the wire alone
    s = (
        _without_outlier_wait(steps, facts.late, straggler_ranks)
        .with_columns(
            exposed_coll_ns=pl.col("exposed_comm_ns") - pl.col("exposed_p2p_ns") - pl.col("outlier_wait_ns"),
            paced_ns=pl.col("dur_ns") - pl.col("outlier_wait_ns"),
        )
        .with_columns(share=pl.col("exposed_coll_ns") / pl.col("paced_ns").clip(lower_bound=1))
    )
    per_rank = s.group_by("rank").agg(share=pl.col("share").median()).sort("rank")
    # the outliers' own steps hold their extra time: the job's share is its other ranks'
    others = per_rank.filter(~pl.col("rank").is_in(list(straggler_ranks)))
    median_share = (others if others.height else per_rank)["share"].median()
    if median_share < th.comm_share or per_rank["share"].min() < th.comm_share_min_rank:
        return []
    per_step = s.group_by("step").agg(share=pl.col("share").median(), exposed=pl.col("exposed_coll_ns").median())
    hit = per_step.filter(pl.col("share") >= th.step_share * th.comm_share).sort("step")
    sized = facts.collectives.filter(pl.col("busbw_gbps").is_not_null())
    busbw = float(sized["busbw_gbps"].median()) if sized.height else None
    bw_text, bw_fields = _bandwidth_verdict(busbw, facts.link_gbps, th)
    ranks = tuple(per_rank["rank"].to_list())
    outlier_wait_ms = float(s["outlier_wait_ns"].median()) / NS_PER_MS
    paced = (
        f"with the {outlier_wait_ms:,.1f} ms per step waited for {_ranks_text(straggler_ranks)} taken out"
        if straggler_ranks
        else "and no rank is an outlier"
    )
    summary = (
        f"exposed communication takes {median_share:.0%} of the step (median over {count(len(ranks), 'rank')}, "
        f"{per_rank['share'].min():.0%}..{per_rank['share'].max():.0%}) {paced}; {bw_text}"
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
        **({"outlier_wait_ms_median": round(outlier_wait_ms, 3)} if straggler_ranks else {}),
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

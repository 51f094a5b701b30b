"""Per-operator overhead on CPU-only ranks: extra operators too small to be arithmetic.

A late CPU-only rank whose window holds more compute may run more *work* (extra matmuls: each extra
operator as long as its peers' operators or longer) or many more *tiny* operators: a per-element loop of
scalar ops and ``.item()`` reads, each a few microseconds of dispatch with nothing to compute. The second
is host time (on a GPU the device would sit idle while the host dispatches and synchronises, the
lateness rule's ``host`` reason), though a CPU trace files it under operators. Told apart by the mean
duration of the extra operators against the peers' mean operator (held-out round 10's host_item_sync:
4,000 ``.item()`` reads a step, 102× its peers' operators at 0.3% of their mean each; extra matmuls run
at least as long as the peers' mean operator).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracediag.derive.ranked import rank_slices

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.detect.thresholds import Thresholds


def _per_rank_step(k: pl.DataFrame, steps: tuple[int, ...]) -> pl.DataFrame:
    """``rank, step, n, t``: the compute operators each rank of the kernel table `k` runs in `steps`, and their
    summed self time."""
    return pl.concat(
        [
            rows.lazy()
            .filter(pl.col("category") == "compute", pl.col("step").is_in(list(steps)))
            .group_by("rank", "step")
            .agg(n=pl.col("count").cast(pl.Int64).sum(), t=pl.col("total_ns").sum())
            .collect()
            for rows in rank_slices(k)
        ]
    )


def tiny_extra_ops(facts: Facts, ranks: tuple[int, ...], steps: tuple[int, ...], th: Thresholds) -> bool:
    """Whether `ranks` (CPU-only ranks) run at least `lateness_more_ops` × their peers' compute operators over
    `steps`, and their extra operators average at most `lateness_small_op_share` × the peers' mean operator:
    dispatch, not arithmetic. False on GPU ranks or without the kernel table."""
    k = facts.kernel_steps
    cpu = facts.steps.filter(pl.col("device") < 0)["rank"].unique().to_list()
    if k is None or not k.height or not set(ranks) <= set(cpu) or not steps:
        return False
    rows = _per_rank_step(k, steps).filter(pl.col("rank").is_in(cpu))
    mine = pl.col("rank").is_in(list(ranks))
    peers = rows.filter(~mine).group_by("step").agg(_n=pl.col("n").median(), _t=pl.col("t").median())
    own = rows.filter(mine).join(peers, on="step")
    if not own.height:
        return False
    n, t, pn, pt = (float(own[c].sum()) for c in ("n", "t", "_n", "_t"))
    if pn <= 0 or pt <= 0 or n < th.lateness_more_ops * pn:
        return False
    return (t - pt) / (n - pn) <= th.lateness_small_op_share * pt / pn

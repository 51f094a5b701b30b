"""Replay a `Graph` with (edited) durations: step times per rank and step.

Rules (What-if analysis, Lin et al., OSDI'25, on a finer op model):

- a rank advances through its local segments at their (edited) durations (each category's time
  in a segment scaled by its own factor);
- it arrives at a sync operation at its local progress there;
- the operation ends for a participant at the last participant's arrival + that participant's
  (edited) transfer time (a participant whose observed end precedes the last arrival — clocks that
  disagree — ends at its own arrival + its own duration);
- at a block the rank resumes at max(its own progress, the operation's end + the block's lag).

Per rank the state after each block is (replayed time, local progress); any mark's time is the state
of the last block before it on that rank + the local progress since. Operations are replayed in the
order of their observed end, so the blocks a mark depends on are replayed before it. The loop runs
once per operation (numpy over its participants), never per event.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracediag.whatif.graph import Graph
from tracediag.whatif.rank import LOCAL_CATEGORIES, LOCAL_COLUMNS


def _progress(graph: Graph, factors: pl.DataFrame | None) -> pl.DataFrame:
    """Marks with ``L``: the rank's edited local progress at the mark (ns since its window start).

    A segment's edited length is the sum over categories of its time in that category times the
    category's factor on its (rank, step). Marks lie on segment edges, so a mark inside a segment
    (none by construction) would read the segment's share by elapsed time."""
    seg = graph.segments
    length = pl.lit(0.0)
    for cat, col in zip(LOCAL_CATEGORIES, LOCAL_COLUMNS):
        f = pl.lit(1.0)
        if factors is not None and factors.height:
            mine = factors.filter(pl.col("cat") == cat).select("rank", "step", **{f"_f_{cat}": "factor"})
            seg = seg.join(mine, on=["rank", "step"], how="left")
            f = pl.col(f"_f_{cat}").fill_null(1.0).clip(lower_bound=0.0)
        length = length + pl.col(col) * f
    seg = (
        seg.sort("rank", "ts")
        .with_columns(_len=length)
        .with_columns(_before=pl.col("_len").cum_sum().over("rank") - pl.col("_len"))
        .select("rank", _sts="ts", _send="end", _before="_before", _len="_len")
        .sort("_sts")
    )
    m = graph.marks.with_row_index("mid").sort("t")
    m = m.join_asof(seg, left_on="t", right_on="_sts", by="rank", check_sortedness=False)
    share = (pl.min_horizontal(pl.col("t"), pl.col("_send")) - pl.col("_sts")).clip(lower_bound=0) / (
        pl.col("_send") - pl.col("_sts")
    )
    return m.with_columns(L=(pl.col("_before") + share * pl.col("_len")).fill_null(0.0)).sort("mid")


def replay(
    graph: Graph,
    *,
    factors: pl.DataFrame | None = None,
    transfer: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Per (rank, step): ``dur_ns`` (observed) and ``replay_ns`` (replayed step time).

    `factors`: ``rank, step, cat, factor`` multiplying local segment durations (missing: 1).
    `transfer`: ``op, rank, transfer_ns`` replacing transfer times (missing: observed).
    """
    marks = _progress(graph, factors)
    ops = graph.ops
    if transfer is not None and transfer.height:
        ops = ops.join(transfer.rename({"transfer_ns": "_t"}), on=["op", "rank"], how="left").with_columns(
            transfer_ns=pl.coalesce("_t", "transfer_ns")
        )
    ranks = sorted(graph.steps["rank"].unique().to_list())
    rank_ix = {r: i for i, r in enumerate(ranks)}
    c0 = np.zeros(len(ranks))
    for r, s in graph.steps.group_by("rank").agg(pl.col("start_ns").min()).iter_rows():
        c0[rank_ix[r]] = s
    # the governing block of each mark: the last block that ended before it on its rank
    blocks = marks.filter(pl.col("kind") == "block").select("rank", _bmid="mid", _bend="t_end").sort("_bend")
    marks = (
        marks.sort("t")
        .join_asof(blocks, left_on="t", right_on="_bend", by="rank", strategy="backward", check_sortedness=False)
        .with_columns(
            _gov=pl.when(pl.col("_bmid") != pl.col("mid")).then(pl.col("_bmid")),
            _ri=pl.col("rank").replace_strict(rank_ix, return_dtype=pl.Int64),
        )
        .sort("mid")
    )
    L = marks["L"].to_numpy().astype(float)
    gov = marks["_gov"].fill_null(-1).to_numpy()
    ri = marks["_ri"].to_numpy()
    lag = marks["lag_ns"].to_numpy().astype(float)
    is_block = (marks["kind"] == "block").to_numpy()
    # replayed time at which each block releases its rank; observed until replayed
    after_t = np.where(is_block, marks["t_end"].to_numpy().astype(float), np.nan)

    def time_at(idx: np.ndarray) -> np.ndarray:
        g = gov[idx]
        has = g >= 0
        gi = np.where(has, g, 0)
        return np.where(has, after_t[gi], c0[ri[idx]]) + L[idx] - np.where(has, L[gi], 0.0)

    # one row per participation: its arrival mark, its block mark (or -1), the stream predecessor
    ids = marks.filter(pl.col("op").is_not_null()).select("mid", "op", "rank", "kind")
    parts = (
        ops.select("op", "rank", "order", "transfer_ns", "prev_op", "dep")
        .join(ids.filter(pl.col("kind") == "arrive").select("op", "rank", _a="mid"), on=["op", "rank"])
        .join(ids.filter(pl.col("kind") == "block").select("op", "rank", _b="mid"), on=["op", "rank"], how="left")
        .sort("order", "rank")
        .with_row_index("pid")
    )
    prev = parts.select("rank", "prev_op").join(
        parts.select("rank", prev_op="op", _pp="pid"), on=["rank", "prev_op"], how="left"
    )["_pp"]
    order = parts["order"].to_numpy()
    arr_mid = parts["_a"].to_numpy()
    blk_mid = parts["_b"].fill_null(-1).to_numpy()
    prev_pid = prev.fill_null(-1).to_numpy()
    tr = parts["transfer_ns"].to_numpy().astype(float)
    dep = parts["dep"].to_numpy()
    end_of = np.full(parts.height, np.nan)
    cuts = np.flatnonzero(np.diff(order)) + 1
    for a, b in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(order)]])):
        if b <= a:
            continue
        arrive = time_at(arr_mid[a:b])
        pp = prev_pid[a:b]
        if (pp >= 0).any():
            arrive = np.where(pp >= 0, np.fmax(arrive, end_of[np.where(pp >= 0, pp, 0)]), arrive)
        end = np.where(dep[a:b], arrive.max(), arrive) + tr[a:b]
        end_of[a:b] = end
        bm = blk_mid[a:b]
        sel = bm >= 0
        if sel.any():
            after_t[bm[sel]] = np.maximum(time_at(bm[sel]), end[sel] + lag[bm[sel]])
    bmask = (marks["kind"] == "boundary").to_numpy()
    b_idx = np.flatnonzero(bmask)
    t_b = time_at(b_idx)
    times = marks.filter(pl.col("kind") == "boundary").select("rank", "step").with_columns(T=pl.Series(t_b))
    per = times.sort("rank", "step").with_columns(replay_ns=pl.col("T").shift(-1).over("rank") - pl.col("T"))
    return (
        graph.steps.select("rank", "step", "dur_ns")
        .join(per.select("rank", "step", "replay_ns"), on=["rank", "step"], how="left")
        .with_columns(pl.col("replay_ns").round(0).cast(pl.Int64))
        .sort("rank", "step")
    )


def step_times(per_rank: pl.DataFrame) -> pl.DataFrame:
    """Per step: ``dur_ns`` and ``replay_ns``, medians over ranks (the step time of the job)."""
    return (
        per_rank.group_by("step")
        .agg(pl.col("dur_ns").median().cast(pl.Int64), pl.col("replay_ns").median().cast(pl.Int64))
        .sort("step")
    )

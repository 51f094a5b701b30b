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
once per operation (numpy over its participants), never per event. What no edit changes (which
segment each mark lies on, the governing blocks, the participations) is found once per graph
(`Plan`), so pricing many findings replays the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from tracediag.whatif.rank import LOCAL_CATEGORIES, LOCAL_COLUMNS

if TYPE_CHECKING:
    from tracediag.whatif.graph import Graph


@dataclass(frozen=True)
class Plan:
    """What every replay of one graph shares, computed once (`Graph.plan`): an edit changes only the
    segments' lengths and the transfer times, so the marks' segments, the governing blocks and the
    participations are found here, and a replay is numpy over these arrays plus the operation loop."""

    seg_ns: np.ndarray
    """Per segment (sorted by rank, ts), its time per category (`rank.LOCAL_COLUMNS`)."""
    seg_key: np.ndarray
    """Per segment, the row of its (rank, step) in `keys`."""
    keys: pl.DataFrame
    """``rank, step, _k``: the segments' (rank, step) pairs."""
    rank_cuts: np.ndarray
    """Where each rank's segments start, and the end (one running sum per rank)."""
    mark_seg: np.ndarray
    """Per mark (by ``mid``), the last segment of its rank starting at or before it (-1: none)."""
    mark_share: np.ndarray
    """Per mark, the share of that segment elapsed at the mark (0 or 1: marks lie on segment edges)."""
    gov: np.ndarray
    ri: np.ndarray
    lag: np.ndarray
    is_block: np.ndarray
    t_end: np.ndarray
    c0: np.ndarray
    parts: pl.DataFrame
    """Per participation (``pid`` order): ``op, rank, pid``, to apply transfer edits."""
    order: np.ndarray
    arr_mid: np.ndarray
    blk_mid: np.ndarray
    prev_pid: np.ndarray
    transfer: np.ndarray
    dep: np.ndarray
    bounds: pl.DataFrame
    """The boundary marks: ``rank, step, mid``."""


def plan(graph: Graph) -> Plan:
    """The replay plan of `graph` (see `Plan`)."""
    seg = graph.segments.sort("rank", "ts").with_row_index("_j")
    keys = seg.select("rank", "step").unique(maintain_order=True).with_row_index("_k")
    seg_key = seg.join(keys, on=["rank", "step"], how="left").sort("_j")["_k"].to_numpy()
    firsts = seg.group_by("rank").agg(pl.col("_j").min())["_j"].sort().to_numpy()
    marks = graph.marks.with_row_index("mid")
    at = (
        marks.sort("t")
        .join_asof(
            seg.select("rank", "_j", _sts="ts", _send="end").sort("_sts"),
            left_on="t",
            right_on="_sts",
            by="rank",
            check_sortedness=False,
        )
        .with_columns(
            _share=(pl.min_horizontal(pl.col("t"), pl.col("_send")) - pl.col("_sts")).clip(lower_bound=0)
            / (pl.col("_send") - pl.col("_sts"))
        )
        .sort("mid")
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
    is_block = (marks["kind"] == "block").to_numpy()
    # one row per participation: its arrival mark, its block mark (or -1), the stream predecessor
    ids = marks.filter(pl.col("op").is_not_null()).select("mid", "op", "rank", "kind")
    parts = (
        graph.ops.select("op", "rank", "order", "transfer_ns", "prev_op", "dep")
        .join(ids.filter(pl.col("kind") == "arrive").select("op", "rank", _a="mid"), on=["op", "rank"])
        .join(ids.filter(pl.col("kind") == "block").select("op", "rank", _b="mid"), on=["op", "rank"], how="left")
        .sort("order", "rank")
        .with_row_index("pid")
    )
    prev = parts.select("rank", "prev_op").join(
        parts.select("rank", prev_op="op", _pp="pid"), on=["rank", "prev_op"], how="left", maintain_order="left"
    )["_pp"]
    return Plan(
        seg_ns=seg.select(LOCAL_COLUMNS).to_numpy().astype(float).reshape(seg.height, len(LOCAL_COLUMNS)),
        seg_key=seg_key,
        keys=keys,
        rank_cuts=np.append(firsts, seg.height).astype(np.int64),
        mark_seg=at["_j"].fill_null(-1).to_numpy().astype(np.int64),
        mark_share=at["_share"].fill_null(0.0).to_numpy().astype(float),
        gov=marks["_gov"].fill_null(-1).to_numpy(),
        ri=marks["_ri"].to_numpy(),
        lag=marks["lag_ns"].to_numpy().astype(float),
        is_block=is_block,
        t_end=marks["t_end"].to_numpy().astype(float),
        c0=c0,
        parts=parts.select("op", "rank", "pid"),
        order=parts["order"].to_numpy(),
        arr_mid=parts["_a"].to_numpy(),
        blk_mid=parts["_b"].fill_null(-1).to_numpy(),
        prev_pid=prev.fill_null(-1).to_numpy(),
        transfer=parts["transfer_ns"].to_numpy().astype(float),
        dep=parts["dep"].to_numpy(),
        bounds=marks.filter(pl.col("kind") == "boundary").select("rank", "step", "mid"),
    )


def _progress(p: Plan, factors: pl.DataFrame | None) -> np.ndarray:
    """Per mark, ``L``: the rank's edited local progress at the mark (ns since its window start).

    A segment's edited length is the sum over categories of its time in that category times the
    category's factor on its (rank, step) (missing: 1, never below 0). Marks lie on segment edges,
    so a mark inside a segment (none by construction) would read the segment's share by elapsed time."""
    f = np.ones((p.keys.height, len(LOCAL_CATEGORIES)))
    if factors is not None and factors.height:
        cats = {c: i for i, c in enumerate(LOCAL_CATEGORIES)}
        on = factors.filter(pl.col("cat").is_in(list(cats))).join(p.keys, on=["rank", "step"], how="inner")
        ci = on["cat"].replace_strict(cats, return_dtype=pl.Int64).to_numpy()
        f[on["_k"].to_numpy(), ci] = np.clip(on["factor"].fill_null(1.0).to_numpy(), 0.0, None)
    length = np.zeros(len(p.seg_key))
    for c in range(len(LOCAL_CATEGORIES)):
        length = length + p.seg_ns[:, c] * f[p.seg_key, c]
    before = np.empty_like(length)
    for a, b in zip(p.rank_cuts[:-1], p.rank_cuts[1:]):
        before[a:b] = np.cumsum(length[a:b]) - length[a:b]
    j = np.where(p.mark_seg >= 0, p.mark_seg, 0)
    return np.where(p.mark_seg >= 0, before[j] + p.mark_share * length[j], 0.0)


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
    p = graph.plan
    L = _progress(p, factors)
    tr = p.transfer
    if transfer is not None and transfer.height:
        new = p.parts.join(transfer, on=["op", "rank"], how="inner").filter(pl.col("transfer_ns").is_not_null())
        tr = tr.copy()
        tr[new["pid"].to_numpy()] = new["transfer_ns"].to_numpy().astype(float)
    gov, ri, lag = p.gov, p.ri, p.lag
    # replayed time at which each block releases its rank; observed until replayed
    after_t = np.where(p.is_block, p.t_end, np.nan)

    def time_at(idx: np.ndarray) -> np.ndarray:
        g = gov[idx]
        has = g >= 0
        gi = np.where(has, g, 0)
        return np.where(has, after_t[gi], p.c0[ri[idx]]) + L[idx] - np.where(has, L[gi], 0.0)

    order, arr_mid, blk_mid, prev_pid, dep = p.order, p.arr_mid, p.blk_mid, p.prev_pid, p.dep
    end_of = np.full(len(order), np.nan)
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
    times = p.bounds.select("rank", "step").with_columns(T=pl.Series(time_at(p.bounds["mid"].to_numpy())))
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

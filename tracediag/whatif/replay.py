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
of the last block before it on that rank + the local progress since. The replay walks two kinds of
node in observed time: an operation's *completion* (its participants' ends, once every participant
arrived: at its last arrival) and a block's *release* (at the block's end, and never before its
operation's completion), so what a node reads was replayed before it — also where a rank waits for
an operation long after it completed (a send waited for at the end of a step). The loop runs once
per operation and once per run of releases on distinct ranks (Series arithmetic), never per event.
What no edit changes (which segment each mark lies on, the governing blocks, the participations) is found once per graph
(`Plan`), so pricing many findings replays the same plan.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from tracediag.derive.intervals import in_time_order
from tracediag.derive.ranked import rank_slices
from tracediag.derive.sync_segments import LOCAL_CATEGORIES, LOCAL_COLUMNS

if TYPE_CHECKING:
    from tracediag.whatif.graph import Graph


@dataclass(frozen=True, eq=False)
class Plan:
    """What every replay of one graph shares, computed once per graph (`plan_of`): an edit changes only the
    segments' lengths and the transfer times, so the marks' segments, the governing blocks and the
    participations are found here, and a replay is Series arithmetic over these plus the operation loop.
    (polars, not numpy: a replay is small next to numpy's start-up, whose BLAS threads alone cost more.)"""

    seg: pl.DataFrame
    """Per segment (sorted by rank, ts): ``rank``, ``_k`` (the row of its (rank, step) in `keys`) and its
    time per category (`sync_segments.LOCAL_COLUMNS`: the graph's Int64 columns, read as Float64)."""
    keys: pl.DataFrame
    """``rank, step, _k``: the segments' (rank, step) pairs."""
    mark_seg: pl.Series
    """Per mark (by ``mid``), the last segment of its rank starting at or before it (null: none)."""
    mark_share: pl.Series
    """Per mark, the share of that segment elapsed at the mark (0 or 1: marks lie on segment edges)."""
    gov: pl.Series
    """Per mark, its governing block's ``mid`` (-1: none)."""
    c0: pl.Series
    """Per mark, its rank's window start (where a mark without a governing block counts from)."""
    lag: pl.Series
    is_block: pl.Series
    t_end: pl.Series
    parts: pl.DataFrame
    """Per participation (``pid`` order): ``op, rank, pid``, to apply transfer edits."""
    cuts: tuple[int, ...]
    """Where each operation's participations start (they are sorted by operation order), and the end."""
    sched: tuple[tuple[bool, int, int], ...]
    """The replay's nodes in order: ``(True, a, n)`` completes the operation of participations
    ``a..a+n``; ``(False, a, n)`` releases the blocks ``r_pid[a..a+n]`` (distinct ranks)."""
    r_pid: pl.Series
    """The participations with a block, in release order."""
    arr_mid: pl.Series
    blk_mid: pl.Series
    prev_pid: pl.Series
    transfer: pl.Series
    dep: pl.Series
    bounds: pl.DataFrame
    """The boundary marks: ``rank, step, mid``."""


def plan(graph: Graph) -> Plan:
    """The replay plan of `graph` (see `Plan`)."""
    # the graph's own columns (no sort, no join copying them): a plan lives beside its graph
    seg = graph.segments if in_time_order(graph.segments, "rank", "ts") else graph.segments.sort("rank", "ts")
    seg = seg.with_row_index("_j")
    k, keys = _step_keys(seg)
    seg = seg.with_columns(k)
    marks = graph.marks.with_row_index("mid")
    at = _on_segments(marks, seg)
    starts = dict(graph.steps.group_by("rank").agg(pl.col("start_ns").min().cast(pl.Float64)).iter_rows())
    # the governing block of each mark: the last block that ended before it on its rank
    blocks = marks.filter(pl.col("kind") == "block").select("rank", _bmid="mid", _bend="t_end").sort("_bend")
    marks = (
        marks.sort("t")
        .join_asof(blocks, left_on="t", right_on="_bend", by="rank", strategy="backward", check_sortedness=False)
        .with_columns(
            _gov=pl.when(pl.col("_bmid") != pl.col("mid")).then(pl.col("_bmid")),
            _c0=pl.col("rank").replace_strict(starts, return_dtype=pl.Float64),  # a rank without steps: an error
        )
        .sort("mid")
    )
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
    firsts = parts.select(pl.arg_where(pl.col("order").diff().fill_null(1) != 0))
    cuts = (*firsts.to_series().to_list(), parts.height)
    sched, r_pid = _schedule(parts, marks, graph.ops, cuts)
    return Plan(
        seg=seg.select("rank", "_k", *LOCAL_COLUMNS),
        keys=keys,
        mark_seg=at["_j"],
        mark_share=at["_share"].fill_null(0.0).cast(pl.Float64),
        gov=marks["_gov"].fill_null(-1).cast(pl.Int64),
        c0=marks["_c0"],
        lag=marks["lag_ns"].cast(pl.Float64),
        is_block=marks["kind"] == "block",
        t_end=marks["t_end"].cast(pl.Float64),
        parts=parts.select("op", "rank", "pid"),
        cuts=cuts,
        sched=sched,
        r_pid=r_pid,
        arr_mid=parts["_a"].cast(pl.Int64),
        blk_mid=parts["_b"].fill_null(-1).cast(pl.Int64),
        prev_pid=prev.fill_null(-1).cast(pl.Int64),
        transfer=parts["transfer_ns"].cast(pl.Float64),
        dep=parts["dep"],
        bounds=marks.filter(pl.col("kind") == "boundary").select("rank", "step", "mid"),
    )


def _on_segments(marks: pl.DataFrame, seg: pl.DataFrame) -> pl.DataFrame:
    """Per mark (``mid`` order): ``_j``, the last segment of its rank starting at or before it, and ``_share``,
    the share of that segment elapsed at the mark. `marks` and `seg` are sorted by rank: a rank slice of
    the marks at a time, with its ranks' segments (2.2 million at 16,384 ranks), never a sorted copy of
    every segment; a mark's segment is of its rank, so the slices' rows are the whole tables'."""
    ranks = seg.get_column("rank")
    out = []
    for part in rank_slices(marks):
        lo = int(ranks.search_sorted(part.get_column("rank").min(), side="left"))
        hi = int(ranks.search_sorted(part.get_column("rank").max(), side="right"))
        out.append(
            part.sort("t")
            .join_asof(
                seg.slice(lo, hi - lo).select("rank", "_j", _sts="ts", _send="end").sort("_sts"),
                left_on="t",
                right_on="_sts",
                by="rank",
                check_sortedness=False,
            )
            .with_columns(
                _share=(pl.min_horizontal(pl.col("t"), pl.col("_send")) - pl.col("_sts")).clip(lower_bound=0)
                / (pl.col("_send") - pl.col("_sts"))
            )
        )
    return pl.concat(out).sort("mid")


def _step_keys(seg: pl.DataFrame) -> tuple[pl.Series, pl.DataFrame]:
    """``_k`` of each segment (sorted by rank, ts), the number of its (rank, step) pair in order of their
    first segment, and the pairs (``_k, rank, step``). A step's segments follow each other on its rank,
    so the pairs are numbered by their runs (no join of 2.2 million segments, at 16,384 ranks, with
    their distinct pairs); by that join where they do not."""
    rank, step = pl.col("rank"), pl.col("step")
    first = ((rank != rank.shift(1)) | (step != step.shift(1))).fill_null(True)
    keys = seg.filter(first).select("rank", "step")
    if keys.height == keys.n_unique():
        k = seg.select(_k=first.cum_sum().cast(pl.UInt32) - 1).to_series()
        return k, keys.with_row_index("_k")
    keys = seg.select("rank", "step").unique(maintain_order=True).with_row_index("_k")
    return seg.select("rank", "step").join(keys, on=["rank", "step"], how="left", maintain_order="left")["_k"], keys


def _schedule(
    parts: pl.DataFrame, marks: pl.DataFrame, ops: pl.DataFrame, cuts: tuple[int, ...]
) -> tuple[tuple[tuple[bool, int, int], ...], pl.Series]:
    """The replay's nodes (`Plan.sched`) and the release order (`Plan.r_pid`): completions at their
    operation's last observed arrival, releases at max(the block's observed end, that arrival) —
    before completions at the same time, except their own operation's. Consecutive releases on
    distinct ranks form one node (none reads another)."""
    last = ops.group_by("op").agg(_last=pl.col("arrival").max())
    p = parts.select("op", "rank", "pid", "_b", "order").join(last, on="op", how="left", maintain_order="left")
    t_end = marks.select("mid", _bend="t_end")
    rel = (
        p.filter(pl.col("_b").is_not_null())
        .join(t_end, left_on="_b", right_on="mid", how="left", maintain_order="left")
        .select(
            "rank",
            "pid",
            key=pl.max_horizontal("_bend", "_last"),
            k=pl.when(pl.col("_bend") > pl.col("_last")).then(0).otherwise(2),
        )
    )
    first = pl.Series(cuts[:-1], dtype=pl.Int64)
    comp = p[first].select(rank=pl.lit(-1, pl.Int32), pid=pl.col("pid").cast(pl.Int64), key="_last", k=pl.lit(1))
    nodes = pl.concat([rel.cast(comp.schema), comp]).sort("key", "k", "pid")
    r_pid = nodes.filter(pl.col("k") != 1)["pid"]
    sched: list[tuple[bool, int, int]] = []
    size = {a: b - a for a, b in itertools.pairwise(cuts)}
    seen: set[int] = set()
    r = 0  # position in r_pid
    start = 0
    for rank, pid, k in zip(nodes["rank"].to_list(), nodes["pid"].to_list(), nodes["k"].to_list()):
        if k == 1 or rank in seen:
            if r > start:
                sched.append((False, start, r - start))
            start, seen = r, set()
        if k == 1:
            sched.append((True, pid, size[pid]))
        else:
            seen.add(rank)
            r += 1
    if r > start:
        sched.append((False, start, r - start))
    return tuple(sched), r_pid


def _progress(p: Plan, factors: pl.DataFrame | None) -> pl.Series:
    """Per mark, ``L``: the rank's edited local progress at the mark (ns since its window start).

    A segment's edited length is the sum over categories of its time in that category times the
    category's factor on its (rank, step) (missing: 1, never below 0). Marks lie on segment edges,
    so a mark inside a segment (none by construction) would read the segment's share by elapsed time."""
    length = pl.Series(values=[0.0] * p.seg.height, dtype=pl.Float64)
    on = None
    if factors is not None and factors.height:
        on = (
            factors.filter(pl.col("cat").is_in(list(LOCAL_CATEGORIES)))
            .join(p.keys, on=["rank", "step"], how="inner")
            .unique(["_k", "cat"], keep="last", maintain_order=True)  # the last edit of a (rank, step, cat) holds
            .with_columns(pl.col("factor").fill_null(1.0).clip(lower_bound=0.0).cast(pl.Float64))
        )
    for cat, col in zip(LOCAL_CATEGORIES, LOCAL_COLUMNS):
        f = pl.Series(values=[1.0] * p.keys.height, dtype=pl.Float64)
        if on is not None:
            mine = on.filter(pl.col("cat") == cat)
            f = f.scatter(mine["_k"], mine["factor"])
        length = length + p.seg[col] * f.gather(p.seg["_k"])
    before = pl.DataFrame({"rank": p.seg["rank"], "x": length}).select(
        pl.col("x").cum_sum().over("rank") - pl.col("x")
    )["x"]
    return (before.gather(p.mark_seg) + p.mark_share * length.gather(p.mark_seg)).fill_null(0.0)


def _where(mask: pl.Series, yes: pl.Series, no: pl.Series) -> pl.Series:
    return yes.zip_with(mask, no)


_PLANS: dict[int, Plan] = {}
"""Plans of live graphs, by ``id``: each entry leaves with its graph (a frozen graph holds frames, so
it cannot key a dict by value)."""


def plan_of(graph: Graph) -> Plan:
    """The plan of `graph`, computed on its first replay and shared by the later ones."""
    key = id(graph)
    found = _PLANS.get(key)
    if found is None:
        found = _PLANS[key] = plan(graph)
        weakref.finalize(graph, _PLANS.pop, key, None)
    return found


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
    p = plan_of(graph)
    L = _progress(p, factors)
    tr = p.transfer
    if transfer is not None and transfer.height:
        new = p.parts.join(transfer, on=["op", "rank"], how="inner").filter(pl.col("transfer_ns").is_not_null())
        tr = tr.clone().scatter(new["pid"], new["transfer_ns"].cast(pl.Float64))
    # replayed time at which each block releases its rank; observed until replayed (null: not a block)
    after_t = p.t_end.clone().set(~p.is_block, None)
    # A mark's time is `x` at `xi` + its local progress - `lg`: with a governing block, the block's
    # release + L - L at the block; without, its rank's window start + L - 0. `x` holds the release
    # times (updated as blocks are replayed) and then the window starts, so each time is one gather
    # of `x`; everything else is gathered once per replay, for all participations (Series methods
    # are queries: few per operation)
    m = p.gov.len()
    has = p.gov >= 0
    gov = _where(has, p.gov, pl.Series([0] * m, dtype=pl.Int64))
    x = pl.concat([after_t, p.c0.cast(pl.Float64)], rechunk=True)
    xi = _where(has, p.gov, pl.Series(range(m, 2 * m), dtype=pl.Int64))
    lg = _where(has, L.gather(gov), pl.Series([0.0] * m, dtype=pl.Float64))
    marks = pl.DataFrame({"xi": xi, "L": L, "lg": lg})
    n_parts = p.parts.height
    blk = p.blk_mid
    at_arrival = marks[p.arr_mid]
    prev0 = _where(p.prev_pid >= 0, p.prev_pid, pl.Series([0] * n_parts, dtype=pl.Int64))
    pids = pl.Series(range(n_parts), dtype=pl.Int64)

    def time_of(xi: pl.Series, progress: pl.Series, lg: pl.Series) -> pl.Series:
        """The replayed time of marks from their ``xi, L, lg``."""
        return x.gather(xi) + progress - lg

    end_of = pl.Series([None] * n_parts, dtype=pl.Float64)
    r_blk = blk.gather(p.r_pid)
    at_release = marks[r_blk].with_columns(lag=p.lag.gather(r_blk)).get_columns()
    for completes, a, n in p.sched:
        if not completes:  # releases: max(own progress, the operation's end + the block's lag)
            bxi, bl, blg, lag = (c.slice(a, n) for c in at_release)
            resume = end_of.gather(p.r_pid.slice(a, n)) + lag
            own = time_of(bxi, bl, blg)
            x.scatter(r_blk.slice(a, n), _where(own >= resume, own, resume))
            continue
        arrive = time_of(*at_arrival.slice(a, n).get_columns())
        pp = p.prev_pid.slice(a, n)
        waits = pp >= 0
        if waits.any():  # after its stream predecessor's end (none yet: its own arrival)
            before = end_of.gather(prev0.slice(a, n)).set(~waits, None)
            if arrive.has_nulls():  # the larger of the two, nulls ignored
                arrive = pl.select(pl.max_horizontal(pl.lit(arrive), pl.lit(before))).to_series()
            else:  # the same without a query (no predecessor: a null `before`, a null test, `arrive`)
                arrive = _where(before > arrive, before, arrive)
        last = arrive.max()
        end = arrive.clone().set(p.dep.slice(a, n), last) + tr.slice(a, n)
        end_of.scatter(pids.slice(a, n), end)
    bounds = marks[p.bounds["mid"].cast(pl.Int64)]
    times = p.bounds.select("rank", "step").with_columns(T=time_of(*bounds.get_columns()))
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

"""One edit of durations per cause, and what replaying the run with it gives.

An `Edit` scales local segments (``factors``: rank, step, category → factor) and replaces transfer
times (``transfer``: op, rank → ns). Per cause:

- compute_straggler: the rank's compute in its steps scaled to its peers' median compute;
- comm_bound: every collective's transfer at the bus bandwidth the link reaches — ``link_gbps`` when
  given, else the 90th percentile of the run's own bus bandwidths; without message sizes, the
  fastest transfer the same operation (same name, same position in the step) reached in any step;
- input_bound: data loading removed (``input`` segments → 0); with no loader in the trace, the
  device's idle before each step's first work (what the detector reads as the loading) removed;
- host_bound: the device's waits on its host removed (``idle_host_ns`` of each step taken out of
  its idle), the rest of the idle (queued work held by events, syncs, another device) kept;
- stage_imbalance: every stage's compute set to the step's mean stage compute (the same work,
  rebalanced over the stages: the heavy stage's falls, the light stages' rises);
- sequence_imbalance: every data-parallel rank's compute set to the step's mean (balanced batches);
- pipeline_bubble: stages balanced (compute → the median stage's), idle closed and send/recv
  transfers free: what is left is the bubble of the schedule itself;
- host_straggler: the late rank's idle cut to its peers' median, and on CPU-only ranks its framework time
  between operators (the own time of non-ATen compute operators over its peers') taken out of its compute;
- slow_link: the slow rank's (or pair's) transfers at the other links' median transfer of the same
  class (`transfers_to`), never slower than observed, and the collectives through it (every one of its
  ranks a member) faster by the same ratio (`collectives_through`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from tracediag.derive.collectives import bus_factor
from tracediag.derive.sync_segments import BLOCK_TOLERANCE_NS
from tracediag.whatif.replay import replay, step_times

if TYPE_CHECKING:
    from tracediag.whatif.graph import Graph

BUSBW_QUANTILE = 0.9
"""Without ``link_gbps``, the bus bandwidth the link reaches = this quantile of the run's own
instances (the best it did, not a single lucky one)."""

_FACTOR_SCHEMA = {"rank": pl.Int32, "step": pl.Int32, "cat": pl.String, "factor": pl.Float64}
_TRANSFER_SCHEMA = {"op": pl.String, "rank": pl.Int32, "transfer_ns": pl.Float64}


@dataclass(frozen=True, eq=False)
class Edit:
    """Durations to change before a replay."""

    factors: pl.DataFrame
    """``rank, step, cat, factor``: local segments of that category scaled by factor."""
    transfer: pl.DataFrame
    """``op, rank, transfer_ns``: transfer times replaced."""

    @staticmethod
    def empty() -> Edit:
        """An edit that changes nothing."""
        return Edit(pl.DataFrame(schema=_FACTOR_SCHEMA), pl.DataFrame(schema=_TRANSFER_SCHEMA))


def _on(graph: Graph, ranks: tuple[int, ...], steps: tuple[int, ...]) -> pl.DataFrame:
    """The kept (rank, step) pairs of `ranks` × `steps` (all steps when `steps` is empty)."""
    s = graph.steps.select("rank", "step").filter(pl.col("rank").is_in(list(ranks)))
    return s.filter(pl.col("step").is_in(list(steps))) if steps else s


def has_ops(graph: Graph, ranks: tuple[int, ...], kind: str) -> bool:
    """Whether the graph holds sync operations of `kind` (``collective``, ``p2p``) on `ranks`: an edit
    of their transfers needs them (communication no operation was matched for cannot be sped up)."""
    return graph.ops.filter(pl.col("rank").is_in(list(ranks)), pl.col("kind") == kind).height > 0


def _factor(rows: pl.DataFrame, cat: str, factor: pl.Expr | float) -> pl.DataFrame:
    f = factor if isinstance(factor, pl.Expr) else pl.lit(factor)
    return rows.select("rank", "step", cat=pl.lit(cat), factor=f).cast(_FACTOR_SCHEMA)


def stragglers(graph: Graph, steps: pl.DataFrame, ranks: tuple[int, ...], on_steps: tuple[int, ...]) -> Edit:
    """Each of `ranks`' compute in `on_steps` set to the median compute of its peers, every other rank
    (`steps`: `Facts.steps`). One pass for any number of ranks, not one per rank: the median of a
    step's values without the rank's own is read from the step's sorted values at the one or two
    positions it falls on once that value is taken out."""
    s = steps.select("rank", "step", "compute_ns")
    known = (
        s.filter(pl.col("compute_ns").is_not_null())
        .sort("step", "compute_ns", "rank")
        .with_columns(_i=pl.int_range(pl.len(), dtype=pl.Int64).over("step"))
    )
    i, n = pl.col("_i"), pl.col("_n")
    rows = (
        s.join(_on(graph, ranks, on_steps), on=["rank", "step"], how="semi")
        .join(known.select("rank", "step", "_i"), on=["rank", "step"], how="left")
        .join(s.group_by("step").agg(_all=pl.len()).filter(pl.col("_all") > 1), on="step", how="semi")  # peers
        .join(known.group_by("step").agg(_n=pl.len().cast(pl.Int64)), on="step", how="left")
        .with_columns(n.fill_null(0))
        # the peers' known values: the step's but the rank's own (a null own value is none of them)
        .with_columns(_peers=n - i.is_not_null().cast(pl.Int64), _i=i.fill_null(n))
        .with_columns(_a=(pl.col("_peers") - 1) // 2, _b=pl.col("_peers") // 2)  # the middle one or two
        .with_columns([pl.when(pl.col(c) >= i).then(pl.col(c) + 1).otherwise(pl.col(c)).alias(c) for c in ("_a", "_b")])
        .join(known.select("step", _a="_i", _va="compute_ns"), on=["step", "_a"], how="left")
        .join(known.select("step", _b="_i", _vb="compute_ns"), on=["step", "_b"], how="left")
        .with_columns(peer=pl.when(pl.col("_peers") > 0).then((pl.col("_va") + pl.col("_vb")) / 2))
    )
    factor = (pl.col("peer") / pl.col("compute_ns").clip(lower_bound=1)).clip(upper_bound=1.0)
    return Edit(_factor(rows, "compute", factor), Edit.empty().transfer)


def no_input(graph: Graph, ranks: tuple[int, ...], on_steps: tuple[int, ...]) -> Edit:
    """Data loading removed on `ranks` in `on_steps`."""
    return Edit(_factor(_on(graph, ranks, on_steps), "input", 0.0), Edit.empty().transfer)


def idle_removed(
    graph: Graph, steps: pl.DataFrame, column: str, ranks: tuple[int, ...], on_steps: tuple[int, ...]
) -> Edit:
    """`column` of `steps` (ns per rank and step, e.g. ``idle_host_ns``) taken out of the idle of
    `ranks` in `on_steps`: each step's idle pieces scaled by 1 − removed / their sum (never below 0).
    The replay's pieces carry how long the device idles, not which gap is which, so the removed time
    is spread over the step's idle; what a step removes is exactly its `column` (at most its idle)."""
    idle = graph.segments.group_by("rank", "step").agg(pl.col("idle_ns").sum().alias("_idle"))
    rows = (
        _on(graph, ranks, on_steps)
        .join(steps.select("rank", "step", _rm=pl.col(column)), on=["rank", "step"])
        .join(idle, on=["rank", "step"])
        .filter(pl.col("_idle") > 0)
    )
    factor = (1 - pl.col("_rm") / pl.col("_idle")).clip(lower_bound=0.0)
    return Edit(_factor(rows, "idle", factor), Edit.empty().transfer)


def compute_removed(graph: Graph, removed: pl.DataFrame, ranks: tuple[int, ...], on_steps: tuple[int, ...]) -> Edit:
    """``removed`` (``rank, step, removed_ns``) taken out of the compute of `ranks` in `on_steps`: each step's
    compute pieces scaled by 1 − removed / their sum (never below 0), as `idle_removed` does the idle."""
    compute = graph.segments.group_by("rank", "step").agg(pl.col("compute_ns").sum().alias("_c"))
    rows = (
        _on(graph, ranks, on_steps)
        .join(removed.select("rank", "step", _rm="removed_ns"), on=["rank", "step"])
        .join(compute, on=["rank", "step"])
        .filter(pl.col("_c") > 0)
    )
    factor = (1 - pl.col("_rm") / pl.col("_c")).clip(lower_bound=0.0)
    return Edit(_factor(rows, "compute", factor), Edit.empty().transfer)


def input_to_peers(graph: Graph, steps: pl.DataFrame, ranks: tuple[int, ...], on_steps: tuple[int, ...]) -> Edit:
    """`ranks`' data loading in `on_steps` scaled to their peers' median loading in that step: a late
    rank's extra loading removed, the loading every rank does kept."""
    peers = steps.filter(~pl.col("rank").is_in(list(ranks))).group_by("step").agg(_peer=pl.col("input_ns").median())
    rows = (
        _on(graph, ranks, on_steps)
        .join(steps.select("rank", "step", "input_ns"), on=["rank", "step"])
        .join(peers, on="step", how="left")
    )
    factor = (pl.col("_peer").fill_null(0) / pl.col("input_ns").clip(lower_bound=1)).clip(upper_bound=1.0)
    return Edit(_factor(rows, "input", factor), Edit.empty().transfer)


def idle_over_peers(graph: Graph, steps: pl.DataFrame, ranks: tuple[int, ...], on_steps: tuple[int, ...]) -> Edit:
    """`ranks`' idle in `on_steps` cut to their peers' median idle in that step (`idle_removed` of the
    excess): a late rank's host on time, its lateness removed and nothing more."""
    peers = steps.filter(~pl.col("rank").is_in(list(ranks))).group_by("step").agg(_peer=pl.col("idle_ns").median())
    excess = steps.join(peers, on="step", how="left").with_columns(
        _excess_idle_ns=(pl.col("idle_ns") - pl.col("_peer").fill_null(pl.col("idle_ns"))).clip(lower_bound=0)
    )
    return idle_removed(graph, excess, "_excess_idle_ns", ranks, on_steps)


def link_transfer(graph: Graph, collectives: pl.DataFrame, link_gbps: float | None) -> pl.DataFrame:
    """Per collective participation, the transfer time at the link's bus bandwidth (never slower
    than observed): ``op, rank, transfer_ns``."""
    ops = graph.ops.filter(pl.col("kind") == "collective")
    sized = ops.filter(pl.col("bytes").fill_null(0) > 0)
    bw = link_gbps
    if bw is None and collectives.height:
        bw = collectives["busbw_gbps"].drop_nulls().quantile(BUSBW_QUANTILE)
    parts = []
    if sized.height and bw:
        ideal = pl.col("bytes") * bus_factor(pl.col("name"), pl.col("n")) / bw
        parts.append(sized.select("op", "rank", transfer_ns=pl.min_horizontal(ideal, pl.col("transfer_ns"))))
    unsized = ops.join(sized.select("op", "rank"), on=["op", "rank"], how="anti")
    if unsized.height:
        # the fastest the same operation (name, position in the step on the rank) went in any step
        marks = graph.marks.filter(pl.col("kind") == "arrive").select("op", "rank", "step")
        u = unsized.join(marks, on=["op", "rank"]).sort("arrival")
        u = u.with_columns(_k=pl.int_range(pl.len()).over("rank", "step", "name"))
        best = pl.col("transfer_ns").min().over("rank", "name", "_k")
        parts.append(u.select("op", "rank", transfer_ns=best))
    if not parts:
        return Edit.empty().transfer
    return pl.concat([p.cast(_TRANSFER_SCHEMA) for p in parts])


def comm(graph: Graph, collectives: pl.DataFrame, link_gbps: float | None) -> Edit:
    """Collective transfers at the link's bus bandwidth (`link_transfer`)."""
    return Edit(Edit.empty().factors, link_transfer(graph, collectives, link_gbps))


def pipeline(graph: Graph, steps: pl.DataFrame, ranks: tuple[int, ...], on_steps: tuple[int, ...]) -> Edit:
    """Pipeline stages balanced, idle closed and send/recv free on `ranks` in `on_steps`."""
    on = _on(graph, ranks, on_steps)
    comp = (
        steps.join(on, on=["rank", "step"], how="semi")
        .with_columns(_med=pl.col("compute_ns").median().over("step"))
        .select("rank", "step", f=(pl.col("_med") / pl.col("compute_ns").clip(lower_bound=1)).clip(upper_bound=1.0))
    )
    factors = pl.concat([_factor(comp, "compute", pl.col("f")), _factor(on, "idle", 0.0), _factor(on, "other", 0.0)])
    p2p = graph.ops.filter(pl.col("kind") == "p2p", pl.col("rank").is_in(list(ranks)))
    return Edit(factors, p2p.select("op", "rank", transfer_ns=pl.lit(0.0)).cast(_TRANSFER_SCHEMA))


def balance(graph: Graph, steps: pl.DataFrame, ranks: tuple[int, ...], on_steps: tuple[int, ...]) -> Edit:
    """Compute of `ranks` in `on_steps` set to the mean over `ranks` in that step: the same total work,
    spread evenly (factors above 1 on the ranks that had less)."""
    on = _on(graph, ranks, on_steps)
    comp = (
        steps.filter(pl.col("rank").is_in(list(ranks)))
        .join(on, on=["rank", "step"], how="semi")
        .with_columns(_mean=pl.col("compute_ns").mean().over("step"))
        .select("rank", "step", f=pl.col("_mean") / pl.col("compute_ns").clip(lower_bound=1))
    )
    return Edit(_factor(comp, "compute", pl.col("f")), Edit.empty().transfer)


def transfers_to(graph: Graph, target: pl.DataFrame) -> Edit:
    """The sync operations of `target` (``op`` as in `Graph.ops`, ``transfer_ns``) with every
    participant's transfer at most that (a slow link's transfers at its peers' pace)."""
    rows = graph.ops.join(target.select("op", _t="transfer_ns"), on="op").select(
        "op", "rank", transfer_ns=pl.min_horizontal(pl.col("transfer_ns").cast(pl.Float64), "_t")
    )
    return Edit(Edit.empty().factors, rows.cast(_TRANSFER_SCHEMA))


def collectives_through(graph: Graph, ranks: tuple[int, ...], factor: float) -> pl.DataFrame:
    """The collectives every one of `ranks` takes part in, each participant's transfer scaled by `factor`
    (≤ 1): ``op, rank, transfer_ns``. A ring or tree collective moves its data over each member's links
    and runs at the pace of the slowest one, so a slow link's collectives speed up with it."""
    coll = graph.ops.filter(pl.col("kind") == "collective")
    through = coll.filter(pl.col("rank").is_in(list(ranks))).group_by("op").agg(_n=pl.col("rank").n_unique())
    mine = through.filter(pl.col("_n") == len(set(ranks))).select("op")
    return coll.join(mine, on="op", how="semi").select(
        "op", "rank", transfer_ns=pl.col("transfer_ns").cast(pl.Float64) * min(factor, 1.0)
    )


def closed_by(graph: Graph, ops: pl.DataFrame) -> pl.DataFrame:
    """The send/recv operations whose end on a rank was closed by the wait for one of `ops` (``op``):
    it ends on that rank within `BLOCK_TOLERANCE_NS` after one of them (gloo closes an operation
    where the host waits for it, in the order it waits), so its own end there says when that wait
    returned. ``op, transfer_ns``: the faster of its sides (its data was over by then)."""
    p2p = graph.ops.filter(pl.col("kind") == "p2p")
    ends = p2p.join(ops.select("op"), on="op", how="semi").select("rank", _e="end").sort("_e")
    if not ends.height:
        return pl.DataFrame(schema={"op": pl.String, "transfer_ns": pl.Float64})
    near = (
        p2p.join(ops.select("op"), on="op", how="anti")
        .sort("end")
        .join_asof(ends, left_on="end", right_on="_e", by="rank", strategy="backward", check_sortedness=False)
        .filter(pl.col("end") - pl.col("_e") <= BLOCK_TOLERANCE_NS)
        .select("op")
        .unique()
    )
    return (
        p2p.join(near, on="op", how="semi").group_by("op").agg(transfer_ns=pl.col("transfer_ns").min().cast(pl.Float64))
    )


def combine(edits: list[Edit]) -> Edit:
    """All edits at once: factors multiply, the shortest transfer wins."""
    if not edits:
        return Edit.empty()
    f = pl.concat([e.factors for e in edits]).group_by("rank", "step", "cat").agg(pl.col("factor").product())
    t = pl.concat([e.transfer for e in edits]).group_by("op", "rank").agg(pl.col("transfer_ns").min())
    return Edit(f.cast(_FACTOR_SCHEMA), t.cast(_TRANSFER_SCHEMA))


def whatif(graph: Graph, edit: Edit, base: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per step: ``dur_ns`` (observed), ``replay_ns`` (observed durations replayed), ``edited_ns``
    (the edit replayed), ``lost_ns`` = replay − edited (≥ 0: what the edit saves, the replay's own
    bias cancelled) and ``without_ns`` = observed − lost.

    `base`: `replay.step_times` of the unedited graph, when already computed.
    """
    base = base if base is not None else step_times(replay(graph))
    edited = step_times(replay(graph, factors=edit.factors, transfer=edit.transfer))
    return (
        base.join(edited.select("step", edited_ns="replay_ns"), on="step", how="left")
        .with_columns(lost_ns=(pl.col("replay_ns") - pl.col("edited_ns")).clip(lower_bound=0))
        .with_columns(without_ns=pl.col("dur_ns") - pl.col("lost_ns"))
        .sort("step")
    )

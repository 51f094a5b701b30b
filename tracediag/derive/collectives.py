"""Collective instances per rank, matched across ranks, on aligned clocks.

Per rank, one row per collective instance: NCCL/RCCL kernels on GPU traces, ``gloo:*`` work on CPU
traces (else collective CPU operators). Point-to-point traffic (send/recv) and unnamed kernels
(``SendRecv`` without arguments) are not matched: they have no group-wide instance.

Matching key: (process group, ``Seq``) when the trace has a sequence number, else (group, op, k) for
the k-th occurrence of that op in that group on the rank. Clock alignment: ranks leave a collective
together, so each clock's offset is the median over its instances of (its end − the median end of
the instance over ranks); a clock is a host where the traces name it (ranks of one host share one
clock: a one-host job needs no offset), else a rank. Then, on aligned clocks: arrival = start, last
arriver, skew, a rank's wait = last arrival − its arrival (capped by its duration), transfer = end −
last arrival, and the nccl-tests bandwidths: algbw = bytes / transfer, busbw = algbw × factor(op, n).

Without group names (gloo), a k-th occurrence may mix instances of different groups (tensor- and
data-parallel all-reduces in the same order on every rank). When the run has several process groups
and the events name none, a matched key is split where the ranks' aligned ends are more than
`SPLIT_GAP_NS` apart (the ranks of one instance leave it together), one instance per cluster; the
offsets are then recomputed on the split instances (`align_and_match`).
"""

from __future__ import annotations

import polars as pl

from tracediag.derive.host_comm import ready_times
from tracediag.derive.intervals import union_intervals
from tracediag.schema import COLL_OPS
from tracediag.vocab import distinct_names

MATCHED_OPS = tuple(op for op in COLL_OPS if op not in ("send", "recv", "other"))
"""Operations with a group-wide instance to match across ranks."""

SPLIT_GAP_NS = 1_000_000
"""Aligned ends of the ranks of one instance lie within this (1 ms); a larger gap separates
instances of different groups matched by occurrence. Ends of one collective differ by the
completion skew (µs on NCCL, ~0.1 ms on gloo/TCP), while different groups' instances differ by
the compute between them (ms)."""

LATE_SHARE = 0.1
"""A rank counts among an instance's last arrivers when it arrives within this share of the
instance's skew of the last one (a slow node's ranks arrive last together)."""

INSTANCE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "group": pl.String(),
    "op": pl.String(),
    "seq": pl.Int64(),
    "step": pl.Int32(),
    "bytes": pl.Int64(),
    "group_size": pl.Int32(),
    "ts": pl.Int64(),
    "end": pl.Int64(),
}
"""Per rank and instance, on the rank's own clock."""


def bus_factor(op: pl.Expr, n: pl.Expr) -> pl.Expr:
    """nccl-tests bus-bandwidth factor: all_reduce 2(n−1)/n; all_gather, reduce_scatter and
    all_to_all (n−1)/n; broadcast, reduce and the rest 1."""
    n = n.cast(pl.Float64)
    return (
        pl.when(op == "all_reduce")
        .then(2 * (n - 1) / n)
        .when(op.is_in(["all_gather", "reduce_scatter", "all_to_all"]))
        .then((n - 1) / n)
        .otherwise(1.0)
    )


def collective_instances(events: pl.DataFrame, *, names: pl.Series | None = None) -> pl.DataFrame:
    """Per rank and instance: ``rank, group, op, seq, step, bytes, group_size, ts, end`` (own clock).

    ``events`` must have ``step`` filled (`derive.steps.assign_steps`). ``seq`` is the trace's
    ``Seq`` or the k-th occurrence (0-based) of ``op`` in ``group`` on the rank. Each rank's instances
    come from its first source that has any: collective kernels on a device, the host's collective work
    (``gloo:*``; its ``ts`` is when its data was ready: `derive.host_comm.ready_times`), collective
    operators. A device annotation (gloo's ``gpu_user_annotation`` over the copies a host collective
    issued) is no collective kernel. `names`: `vocab.distinct_names` of `events`, when the caller has them.
    """
    names = distinct_names(events) if names is None else names
    lf = events.lazy().filter(pl.col("coll_op").is_in(list(MATCHED_OPS)))  # on the Enum: no string per row
    ready = ready_times(events, names)
    if ready.height:
        lf = (
            lf.join(
                ready.lazy().select("rank", "tid", "ts", "ready").unique(["rank", "tid", "ts"], keep="first"),
                on=["rank", "tid", "ts"],
                how="left",
            )
            .with_columns(
                pl.coalesce("ready", "ts").alias("ts"), dur=pl.col("ts") + pl.col("dur") - pl.coalesce("ready", "ts")
            )
            .drop("ready")
        )
    source = (
        pl.when((pl.col("device") >= 0) & (pl.col("kind") != "annotation"))
        .then(0)
        .when(pl.col("kind") == "comm")
        .then(1)
        .when(pl.col("kind") == "cpu_op")
        .then(2)
    )
    lf = lf.with_columns(_src=source).filter(pl.col("_src").is_not_null())
    lf = lf.filter(pl.col("_src") == pl.col("_src").min().over("rank"))
    group = pl.col("coll_group").fill_null("")
    op = pl.col("coll_op").cast(pl.String)
    return (
        lf.sort("rank", "ts")
        .with_columns(
            group=group,
            op=op,
            seq=pl.coalesce(pl.col("coll_seq"), pl.int_range(pl.len()).over("rank", group, op).cast(pl.Int64)),
            bytes=pl.col("coll_bytes"),
            group_size=pl.col("coll_group_size"),
            end=pl.col("ts") + pl.col("dur"),
        )
        .select(list(INSTANCE_SCHEMA))
        .collect(engine="in-memory")
        .cast(INSTANCE_SCHEMA)
    )


def clock_offsets(
    instances: pl.DataFrame, key: tuple[str, ...] = ("group", "op", "seq"), *, hosts: dict[int, str] | None = None
) -> pl.DataFrame:
    """Per rank: ``offset_ns`` to subtract from its timestamps (median of end − instance median end).

    `hosts`: each rank's host, where its trace names one. Ranks of one host share one clock, so the
    median is taken over the instances of all the host's ranks and every one of them gets it, relative
    to the host of the lowest rank (0: a one-host job is not shifted at all, however unevenly its ranks
    leave a collective: gloo's ring with a slow link does not release them together). A rank whose host
    is unknown is its own clock. Ranks with no instance shared with another rank get their host's
    offset, else 0.
    """
    key = list(key)
    clock = _clock(hosts)
    shared = instances.lazy().filter(pl.len().over(key) > 1)
    off = (
        shared.with_columns(_d=pl.col("end") - pl.col("end").median().over(key), _clock=clock)
        .group_by("_clock")
        .agg(offset_ns=pl.col("_d").median().round(0).cast(pl.Int64))
    )
    ranks = instances.lazy().select("rank").unique().with_columns(_clock=clock)
    out = ranks.join(off, on="_clock", how="left").with_columns(pl.col("offset_ns").fill_null(0)).sort("rank")
    if hosts:
        out = out.with_columns(pl.col("offset_ns") - pl.col("offset_ns").first())
    return out.drop("_clock").collect(engine="in-memory")


def _clock(hosts: dict[int, str] | None) -> pl.Expr:
    """Each row's clock: its rank's host (`hosts`), else the rank itself (``"rank N"``)."""
    own = pl.format("rank {}", pl.col("rank"))
    if not hosts:
        return own
    host = pl.col("rank").replace_strict(hosts, default=None, return_dtype=pl.String)
    return pl.coalesce(pl.format("host {}", host), own)


def match_instances(instances: pl.DataFrame, offsets: pl.DataFrame, *, split_gap_ns: int | None = None) -> pl.DataFrame:
    """Per rank and matched instance, aligned: adds ``iid`` (instance id), ``arrival``, ``aligned_end``,
    ``last_arrival``, ``wait_ns``, ``is_last`` (among the last arrivers, `LATE_SHARE`) and ``n_ranks``.

    `split_gap_ns`: split a key's ranks into separate instances where consecutive aligned ends are
    further apart than this (None: never split).
    """
    key = ["group", "op", "seq"]
    gap = split_gap_ns if split_gap_ns is not None else 2**62
    lf = (
        instances.lazy()
        .join(offsets.lazy(), on="rank", how="left")
        .with_columns(
            arrival=pl.col("ts") - pl.col("offset_ns").fill_null(0),
            aligned_end=pl.col("end") - pl.col("offset_ns").fill_null(0),
        )
        .sort(*key, "aligned_end")
        .with_columns(_part=(pl.col("aligned_end").diff().over(key) > gap).fill_null(False).cum_sum().over(key))
    )
    inst = [*key, "_part"]
    return (
        lf.with_columns(
            n_ranks=pl.len().over(inst).cast(pl.Int32),
            last_arrival=pl.col("arrival").max().over(inst),
        )
        .with_columns(
            wait_ns=pl.min_horizontal(pl.col("last_arrival") - pl.col("arrival"), pl.col("end") - pl.col("ts")).clip(
                lower_bound=0
            ),
            is_last=pl.col("arrival")
            >= pl.col("last_arrival") - LATE_SHARE * (pl.col("last_arrival") - pl.col("arrival").min().over(inst)),
            iid=pl.struct(inst).hash(),
        )
        .drop("_part")
        .collect(engine="in-memory")
    )


ALL_INPUT_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier")
"""Collectives no rank can leave before every rank has entered: on one clock, none of them ends on a rank
before it starts on another."""

BROKEN_CLOCK_SHARE = 0.1
"""A host whose ranks break that order at more than this share of their matched instances does not
keep one clock (copies of traces, containers that all report one host name): its ranks are aligned
one by one. A few breaks are instances matched wrongly by occurrence, not the clock."""


def broken_clocks(matched: pl.DataFrame, hosts: dict[int, str] | None) -> tuple[str, ...]:
    """The hosts of `hosts` whose ranks, on their own timestamps, end a collective of `ALL_INPUT_OPS`
    before another of them starts it (beyond `MATCH_TOLERANCE_NS`) at more than `BROKEN_CLOCK_SHARE`
    of their instances of `matched` (`match_instances`): they do not share one clock."""
    if not hosts:
        return ()
    host = pl.col("rank").replace_strict(hosts, default=None, return_dtype=pl.String)
    broken = (
        matched.lazy()
        .filter(pl.col("op").cast(pl.String).is_in(ALL_INPUT_OPS))
        .with_columns(_host=host)
        .filter(pl.col("_host").is_not_null())
        .group_by("iid", "_host")
        .agg(n=pl.len(), first_end=pl.col("end").min(), last_start=pl.col("ts").max())
        .filter(pl.col("n") > 1)
        .group_by("_host")
        .agg(share=(pl.col("first_end") < pl.col("last_start") - MATCH_TOLERANCE_NS).mean())
        .filter(pl.col("share") > BROKEN_CLOCK_SHARE)
        .sort("_host")
        .collect(engine="in-memory")
    )
    return tuple(broken["_host"])


def align_and_match(
    instances: pl.DataFrame, *, split: bool = False, hosts: dict[int, str] | None = None
) -> tuple[pl.DataFrame, pl.DataFrame, tuple[str, ...]]:
    """Clock offsets, matched instances (`clock_offsets`, one clock per host of `hosts`, then
    `match_instances`) and the hosts that keep no one clock (`broken_clocks`), whose ranks are aligned
    each on its own.

    With `split`, instances are split by `SPLIT_GAP_NS` on the first offsets, and the offsets are
    recomputed on the split instances before the final match.
    """
    offsets, matched = _align_and_match(instances, split, hosts)
    refused = broken_clocks(matched, hosts)
    if not refused:
        return offsets, matched, ()
    return (*_align_and_match(instances, split, {r: h for r, h in hosts.items() if h not in refused}), refused)


def _align_and_match(
    instances: pl.DataFrame, split: bool, hosts: dict[int, str] | None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    offsets = clock_offsets(instances, hosts=hosts)
    if not split:
        return offsets, match_instances(instances, offsets)
    first = match_instances(instances, offsets, split_gap_ns=SPLIT_GAP_NS)
    offsets = clock_offsets(first.select(*INSTANCE_SCHEMA, "iid"), key=("iid",), hosts=hosts)
    return offsets, match_instances(instances, offsets, split_gap_ns=SPLIT_GAP_NS)


MATCH_TOLERANCE_NS = 100_000
"""Clock alignment error allowed when checking that a match is one collective (100 µs, or 10% of
the instance's median duration when larger)."""


def plausible_matches(matched: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Drop matched instances that cannot be one collective among the traced ranks.

    In a collective every member leaves after the last one arrives, so on aligned clocks no rank ends
    before the last arrival. When one does (beyond `MATCH_TOLERANCE_NS` or 10% of the median duration),
    the k-th occurrences are different instances (sampled ranks of a large job in different groups)
    or asynchronous enqueue operators that do not wait; matching them would invent waits and skews.
    Returns the kept rows and how many instances were dropped.
    """
    if not matched.height:
        return matched, 0
    tol = pl.max_horizontal(pl.lit(MATCH_TOLERANCE_NS), 0.1 * (pl.col("end") - pl.col("ts")).median().over("iid"))
    multi = pl.col("n_ranks") > 1
    bad = multi & (pl.col("last_arrival") > pl.col("aligned_end").min().over("iid") + tol)
    flagged = matched.with_columns(_bad=bad)
    dropped = flagged.filter("_bad")["iid"].n_unique()
    return flagged.filter(~pl.col("_bad")).drop("_bad"), dropped


def summarize_instances(matched: pl.DataFrame) -> pl.DataFrame:
    """One row per instance seen on at least two ranks: `analysis.COLLECTIVE_SCHEMA` columns."""
    n = pl.coalesce(pl.col("group_size").max(), pl.len()).cast(pl.Int32)
    out = (
        matched.lazy()
        .group_by("iid")
        .agg(
            pl.col("group").first(),
            pl.col("seq").first(),
            pl.col("op").first(),
            pl.col("bytes").max(),
            pl.col("step").min(),
            n_ranks=pl.len().cast(pl.Int32),
            _n=n,
            first_arrival_ns=pl.col("arrival").min(),
            last_arrival_ns=pl.col("arrival").max(),
            # the last to arrive; among ranks arriving at the same time, the lowest (not whichever row came last)
            last_rank=pl.col("rank").sort_by(["arrival", "rank"], descending=[False, True]).last(),
            end_ns=pl.col("aligned_end").median().round(0).cast(pl.Int64),
        )
        .filter(pl.col("n_ranks") > 1)
        .with_columns(
            skew_ns=pl.col("last_arrival_ns") - pl.col("first_arrival_ns"),
            transfer_ns=(pl.col("end_ns") - pl.col("last_arrival_ns")).clip(lower_bound=0),
        )
        .with_columns(
            algbw_gbps=pl.when(pl.col("transfer_ns") > 0).then(pl.col("bytes") / pl.col("transfer_ns")),
        )
        .with_columns(busbw_gbps=pl.col("algbw_gbps") * bus_factor(pl.col("op"), pl.col("_n")))
        .sort("first_arrival_ns", "group", "seq", "iid")  # ties in a fixed order, whatever order the groups came in
        .drop("iid", "_n")
    )
    return out.collect(engine="in-memory")


def wait_per_step(matched: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step): ``wait_ns`` (time in collectives waiting for the last peer: the union of
    [arrival, last arrival] over the step's instances, so concurrent buckets count once), ``late_n``
    (instances where the rank was among the last arrivers) and ``coll_n`` (instances)."""
    lf = matched.lazy().filter(pl.col("n_ranks") > 1, pl.col("step").is_not_null())
    waiting = lf.filter(pl.col("wait_ns") > 0).select(
        "rank", "step", ts="arrival", end=pl.col("arrival") + pl.col("wait_ns")
    )
    waits = (
        union_intervals(waiting, ["rank", "step"])
        .group_by("rank", "step")
        .agg(wait_ns=(pl.col("end") - pl.col("ts")).sum())
    )
    counts = lf.group_by("rank", "step").agg(
        late_n=pl.col("is_last").sum().cast(pl.Int32),
        coll_n=pl.len().cast(pl.Int32),
    )
    return (
        counts.join(waits, on=["rank", "step"], how="left")
        .with_columns(pl.col("wait_ns").fill_null(0))
        .select("rank", "step", "wait_ns", "late_n", "coll_n")
        .collect(engine="in-memory")
    )

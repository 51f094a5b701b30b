"""Per (rank, step) time breakdown: compute, communication, exposed communication, idle, host gaps.

Two timelines per rank are cut into elementary segments (`intervals.sweep`) and each segment is
classified by what covers it.

*Device timeline* (what the accelerator does; the step span is the device span):

- GPU ranks: kernels on the rank's main device are compute, NCCL/RCCL kernels communication,
  memcpy/memset copies.
- CPU-only ranks (gloo): the host is the device. Compute is the time a host thread is inside a
  CPU operator that is neither communication (``c10d::*``, ``record_param_comms``, ``wait``, or any
  op with a collective) nor data loading, counted per thread and then united over threads.
  Communication is the union of ``gloo:*`` work (on ``pt_gloo_runloop`` threads or the training
  thread) and of the communication operators. So DDP's all-reduce on the gloo thread that runs
  during backward is communication hidden by compute; the training thread waiting for it at the
  end of backward (no operator on the thread) is exposed communication. When a trace records only
  the enqueue operators (``c10d::allreduce_``) and no ``gloo:*`` work, the host's wait from the
  enqueue to its next operator on that thread is communication too (`_in_flight`).

Then ``exposed_comm`` = communication and no compute; ``exposed_p2p`` = the part of it where only
point-to-point traffic (send/recv: pipeline stages waiting on each other) is active;
``idle`` = no compute, communication or copy.

*Host timeline* (the training thread, i.e. the thread holding the step markers, over the host step
span): ``host_gap`` = the training thread in no CPU operator or runtime call; ``input`` = data
loading (any host row whose name contains ``DataLoader``/``dataloader``, on any thread).
``stall_ns`` = from the step start to its first compute (the device starved at step start).
``lead_idle_ns`` = the device idle with nothing at all to do (no compute, communication or copy)
right before the step's first activity: on CPU-only ranks the idle from the step start to the first
activity that starts in the step (the tail of the previous step's work running over the marker — a
gloo all-reduce's worker row ends tens of µs after the training thread went on — is no activity of
this step), on GPU ranks from the previous step's last activity (a GPU step span starts at its first
activity, so the wait for the next batch is the gap between steps). A host that prepares the batch
starves the device this way.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracediag.derive.host_comm import ready_times
from tracediag.derive.intervals import TimeKeys, asof_by_rank, covered, rank_time, sweep, union_intervals
from tracediag.derive.ranked import keep_ranked
from tracediag.derive.steps import Launches, launches
from tracediag.vocab import ATEN_OP, HOST_COMM_OP, INPUT_OP, distinct_names, name_matches

P2P_OPS = ("send", "recv")
"""Point-to-point operations (pipeline traffic), kept apart so a bubble is not read as comm_bound."""

KERNEL_WAIT_NS = 30_000
"""Device idle after the host has launched the next work, up to this long, is launch latency or a
dependency between consecutive kernels (HTA's ``consecutive_kernel_delay``, 30 µs)."""

BREAKDOWN_COLUMNS = (
    "compute_ns",
    "comm_ns",
    "exposed_comm_ns",
    "exposed_p2p_ns",
    "copy_ns",
    "idle_ns",
    "idle_host_ns",
    "idle_kernel_ns",
    "idle_other_ns",
    "host_gap_ns",
    "input_ns",
    "stall_ns",
    "lead_idle_ns",
)


@dataclass(frozen=True, eq=False)
class _Names:
    """The name tests of the breakdown, evaluated once per distinct name (`tracediag.vocab`)."""

    comm_op: pl.Expr
    input: pl.Expr
    kernel_op: pl.Expr
    """ATen operators (`aten::*`): their own time is compute (the work happens in their bodies)."""


def _end() -> pl.Expr:
    return pl.col("ts") + pl.col("dur")


def _host_compute(events: pl.LazyFrame, names: _Names, comm: pl.LazyFrame) -> pl.LazyFrame:
    """CPU-only ranks: intervals where some host thread computes (rank, ts, end).

    A thread computes inside an operator; but the own time of an operator that is no ATen operator and
    has operators nested in it (an autograd node, a hook, a Python function: its time outside the
    operators nested in it) is waiting, not compute, while a collective of the rank is in flight (`comm`:
    rank, ts, end). FSDP1/FSDP2 wait for their all-gathers and reduce-scatters there: `work.wait()` in
    the pre- and post-backward hooks records no operator of its own, and shows as the own time of
    `RegisterPostBackwardFunctionBackward` or of the `autograd::engine::evaluate_function: ...` around
    the hook. ATen operators (`aten::mm`, whose own time is its work) and operators with none nested in
    them compute all along.
    """
    ops = events.filter(pl.col("device") == -1, pl.col("kind") == "cpu_op")
    # an operator is a parent when the next operator of its thread (in start order, longer first) starts
    # before it ends: operators of one thread nest
    nested = (pl.col("ts").shift(-1).over("rank", "tid") < _end()).fill_null(False)
    cat = (
        pl.when(pl.col("coll_op").is_not_null() | names.comm_op)
        .then(pl.lit("commop"))
        .when(names.input)
        .then(pl.lit("input"))
        .when(nested & ~names.kernel_op)
        .then(pl.lit("parent"))
        .otherwise(pl.lit("op"))
    )
    loaders = events.filter(pl.col("device") == -1, pl.col("kind") != "cpu_op", names.input)
    # the communication work's own rows on a thread of its own (``gloo:all_gather`` on gloo's worker
    # thread, which runs no step): the operators inside them there are the collective copying its data
    # (``aten::copy_`` of the gathered shards), communication, not the rank's compute. On a thread that
    # runs the steps (gloo's send/recv rows, open while the rank computes) they stay compute.
    stepping = events.filter(pl.col("kind") == "step").select("rank", "tid").unique()
    work = events.filter(pl.col("device") == -1, pl.col("kind") == "comm", pl.col("tid").is_not_null()).join(
        stepping, on=["rank", "tid"], how="anti"
    )
    per_thread = pl.concat(
        [
            ops.sort("rank", "tid", "ts", "dur", descending=[False, False, False, True]).select(
                "rank", "tid", "ts", end=_end(), cat=cat
            ),
            loaders.select("rank", "tid", "ts", end=_end(), cat=pl.lit("input")),
            work.select("rank", "tid", "ts", end=_end(), cat=pl.lit("commop")),
        ]
    )
    segs = sweep(per_thread, ["rank", "tid"], ["op", "parent", "commop", "input"])
    free = (pl.col("n_commop") == 0) & (pl.col("n_input") == 0)
    busy = segs.filter(free, pl.col("n_op") > 0).select("rank", "ts", "end", cat=pl.lit("op"))
    gaps = segs.filter(free, pl.col("n_op") == 0, pl.col("n_parent") > 0).select("rank", "ts", "end", cat=pl.lit("gap"))
    in_flight = comm.select("rank", "ts", "end", cat=pl.lit("comm"))
    per_rank = sweep(pl.concat([busy, gaps, in_flight]), ["rank"], ["op", "gap", "comm"])
    computing = (pl.col("n_op") > 0) | ((pl.col("n_gap") > 0) & (pl.col("n_comm") == 0))
    return union_intervals(per_rank.filter(computing).select("rank", "ts", "end"), ["rank"])


def _in_flight(host: pl.LazyFrame, names: _Names) -> pl.LazyFrame:
    """CPU-only ranks whose trace records no collective work (no ``gloo:*`` rows, only the enqueue
    operators): the host blocked with its own collective in flight, as (rank, ts, end).

    From each collective operator's start (``c10d::allreduce_``, ``record_param_comms``, ... with a
    collective) to the start of the next operator on the same thread: DDP's reducer and
    ``work.wait()`` block there without a profiler range. Ranks that record the work itself are
    left alone (the work rows are the communication).
    """
    with_work = host.filter(pl.col("kind") == "comm").select("rank").unique()
    ops = host.filter(pl.col("kind") == "cpu_op").join(with_work, on="rank", how="anti")
    enqueue = ops.filter(pl.col("coll_op").is_not_null(), ~pl.col("coll_op").is_in(P2P_OPS)).select(
        "rank", "tid", "ts", _e=_end()
    )
    nxt = ops.filter(pl.col("coll_op").is_null(), ~names.comm_op).select("rank", "tid", _next="ts").sort("_next")
    return (
        enqueue.sort("_e")
        .join_asof(nxt, left_on="_e", right_on="_next", by=["rank", "tid"], strategy="forward", check_sortedness=False)
        .filter(pl.col("_next").is_not_null())
        .select("rank", "ts", end=pl.max_horizontal("_e", "_next"))
    )


DEVICE_CATEGORIES = ("compute", "comm", "p2p", "copy", "step", "input", "complete")
"""The counts of `device_sweep`: ``n_<cat>`` for each."""

_CATEGORY = pl.Enum([*DEVICE_CATEGORIES, "cut"])
"""The device timeline's ``cat``: an Enum, so the sweep's tests of each category compare small
integers, not strings."""


def _cat(name: str) -> pl.Expr:
    return pl.lit(name, dtype=_CATEGORY)


def _device_timeline(events: pl.LazyFrame, spans: pl.DataFrame, names: _Names, ready: pl.LazyFrame) -> pl.LazyFrame:
    """(rank, ts, end, cat) with cat in compute/comm/p2p/copy/step on each rank's device timeline
    (the parts of GPU ranks and of CPU-only ranks planned only when `spans` has such ranks).

    On GPU ranks the host's collective work (gloo over CUDA tensors: `ready`, `host_comm.ready_times`)
    is communication from when its data was ready: the device that idles meanwhile waits for it."""
    has_gpu, has_cpu = spans.select(
        (pl.col("device") >= 0).any().alias("gpu"), (pl.col("device") < 0).any().alias("cpu")
    ).row(0)
    dev = keep_ranked(events.filter(pl.col("device") >= 0), spans.filter(pl.col("device") >= 0), "device")
    spans = spans.lazy()
    dev_cat = (
        pl.when(pl.col("kind") == "kernel")
        .then(_cat("compute"))
        .when((pl.col("kind") == "comm") & pl.col("coll_op").is_in(P2P_OPS))
        .then(_cat("p2p"))
        .when(pl.col("kind") == "comm")
        .then(_cat("comm"))
        .when(pl.col("kind").is_in(["memcpy", "memset"]))
        .then(_cat("copy"))
    )
    cpu_ranks = spans.filter(pl.col("device") < 0).select("rank").unique()
    host = events.filter(pl.col("device") == -1).join(cpu_ranks, on="rank", how="semi")
    host_comm = host.filter(
        (pl.col("kind") == "comm") | ((pl.col("kind") == "cpu_op") & (pl.col("coll_op").is_not_null() | names.comm_op))
    )
    gpu_ranks = spans.filter(pl.col("device") >= 0).select("rank").unique()
    host_work = ready.join(gpu_ranks, on="rank", how="semi").select(
        "rank",
        ts="ready",
        end="end",
        cat=pl.when(pl.col("coll_op").is_in(P2P_OPS)).then(_cat("p2p")).otherwise(_cat("comm")),
    )
    on_gpu = [dev.select("rank", "ts", end=_end(), cat=dev_cat).filter(pl.col("cat").is_not_null()), host_work]
    in_flight = _in_flight(host, names)
    # planned only when some rank is CPU-only: its sweep reads the host rows when planned
    on_cpu = (
        [
            _host_compute(host, names, pl.concat([host_comm.select("rank", "ts", end=_end()), in_flight])).with_columns(
                cat=_cat("compute")
            ),
            host_comm.select(
                "rank",
                "ts",
                end=_end(),
                cat=pl.when(pl.col("coll_op").is_in(P2P_OPS)).then(_cat("p2p")).otherwise(_cat("comm")),
            ),
            in_flight.with_columns(cat=_cat("comm")),
        ]
        if has_cpu
        else []
    )
    parts = [
        *(on_gpu if has_gpu else []),
        *on_cpu,
        spans.filter(pl.col("start").is_not_null()).select("rank", ts="start", end="end", cat=_cat("step")),
    ]
    return pl.concat([p.select("rank", "ts", "end", "cat") for p in parts])


def device_sweep(
    events: pl.DataFrame,
    spans: pl.DataFrame,
    sync: pl.DataFrame | None = None,
    *,
    names: pl.Series | None = None,
    keys: TimeKeys | None = None,
) -> pl.DataFrame:
    """Each rank's device timeline over `spans`, swept once (`intervals.sweep`) for both its readers:
    the breakdown and the what-if replay's timeline pieces (`derive.sync_segments.segments`).

    Counts ``n_<cat>`` of `DEVICE_CATEGORIES`: the device timeline's compute/comm/p2p/copy, ``step``
    (every span with a start), ``input`` (data loading on the host, any thread) and ``complete``
    (spans not partial); cut also at the start of each of `sync`'s rows (`derive.sync_segments.sync_ends`).
    ``breakdown_cut``: true where a segment starts at a cut of the breakdown's own timeline (the
    device categories and ``step``); the other cuts split its segments into pieces of equal counts.
    `names`: `vocab.distinct_names` of `events`, when the caller has them; `keys`: their
    `intervals.time_keys`.
    """
    names = distinct_names(events) if names is None else names
    lf, sp = events.lazy(), spans.lazy()
    own = _device_timeline(lf, spans, _names(names), ready_times(events, names).lazy())
    parts = [
        own.with_columns(breakdown_cut=pl.lit(True)),
        lf.filter(pl.col("device") == -1, name_matches(names, INPUT_OP)).select(
            "rank", "ts", end=_end(), cat=_cat("input"), breakdown_cut=pl.lit(False)
        ),
        sp.filter(~pl.col("partial"), pl.col("start").is_not_null()).select(
            "rank", ts="start", end="end", cat=_cat("complete"), breakdown_cut=pl.lit(False)
        ),
    ]
    if sync is not None:
        # a zero-length interval of no counted category only adds a cut point to the sweep
        parts.append(sync.lazy().select("rank", "ts", end="ts", cat=_cat("cut"), breakdown_cut=pl.lit(False)))
    return (
        sweep(pl.concat(parts), ["rank"], DEVICE_CATEGORIES, mark="breakdown_cut", keys=keys)
        .filter(pl.col("n_step") > 0)  # complete spans are spans with a start
        .collect(engine="in-memory")
    )


def _names(names: pl.DataFrame | pl.Series) -> _Names:
    if isinstance(names, pl.DataFrame):
        names = distinct_names(names)
    return _Names(
        comm_op=name_matches(names, HOST_COMM_OP),
        input=name_matches(names, INPUT_OP),
        kernel_op=name_matches(names, ATEN_OP),
    )


def _host_agg(events: pl.LazyFrame, spans: pl.DataFrame, names: _Names, ordered: bool) -> pl.LazyFrame:
    """Per (rank, step) of `spans`, on the host step span: ``host_gap_ns``, the training thread (the
    marker thread) in no CPU operator or runtime call, and ``input_ns``, data loading on any thread
    (`ordered`: `events` are sorted by rank then ts)."""
    host = events.filter(pl.col("device") == -1)
    busy = keep_ranked(host.filter(pl.col("kind").is_in(["cpu_op", "runtime"])), spans, "tid").select(
        "rank", "ts", end=_end()
    )
    loading = host.filter(names.input).select("rank", "ts", end=_end())
    windows = spans.lazy().select("rank", "step", ts="host_start", end="host_end")
    inputs = covered(loading, windows, "rank", ordered=ordered).select("rank", "step", input_ns="covered")
    return (
        covered(busy, windows, "rank", ordered=ordered)
        .select("rank", "step", host_gap_ns=pl.col("end") - pl.col("ts") - pl.col("covered"))
        .join(inputs, on=["rank", "step"])
    )


def _next_work(
    links: pl.LazyFrame, spans: pl.DataFrame, *, ordered: bool = False, keys: TimeKeys | None = None
) -> pl.LazyFrame:
    """GPU ranks: per start time of device work on the main device, the earliest return of a host
    launch call of the work starting then (``next_ts``, ``next_launch``; launch null when the trace
    links none). `links`: `derive.steps.Launches.links`, in the event table's order; `ordered`: that
    order is by rank then ts; `keys`: the events' `intervals.TimeKeys`."""
    work = links.filter(pl.col("kind").is_in(["kernel", "comm", "memcpy", "memset"]))
    # every launch call of the work (the minimum is taken once, over the work starting at each time)
    work = keep_ranked(work, spans.filter(pl.col("device") >= 0), "device")
    if ordered and keys is not None:
        # rows by rank then ts: the Int64 key of (rank, ts) is sorted, each start time a run of rows
        return (
            work.with_columns(_k=rank_time("ts", keys).set_sorted())
            .group_by("_k")
            .agg(pl.col("rank").first(), next_ts=pl.col("ts").first(), next_launch=pl.col("_call_end").min())
            .select("rank", "next_ts", "next_launch")
        )
    return (
        work.group_by("rank", "ts")
        .agg(next_launch=pl.col("_call_end").min())
        .select("rank", next_ts="ts", next_launch="next_launch")
    )


def _split_idle(idle: pl.LazyFrame, nxt: pl.LazyFrame, keys: TimeKeys | None = None) -> pl.LazyFrame:
    """Split idle device segments (rank, ts, end, len; sorted by ts within each rank, so by end too:
    they are disjoint) into waiting on the host / on kernels / other.

    The device waits on the host from the start of a gap until the host's call that launches the work
    ending the gap returns (nothing is queued); after that launch, up to `KERNEL_WAIT_NS` is launch latency between
    consecutive kernels; the rest (queued work held by an event, a sync or another device, or work
    the trace does not link to a launch) is other. A gap with no device work after it (the end of
    the window) waits on the host.
    """
    j = asof_by_rank(idle, nxt, "end", "next_ts", strategy="forward", ordered=True, keys=keys)
    host = (
        pl.when(pl.col("next_ts").is_null())
        .then(pl.col("len"))
        .when(pl.col("next_launch").is_null())
        .then(0)
        .otherwise((pl.col("next_launch") - pl.col("ts")).clip(0, pl.col("len")))
    )
    rest = pl.col("len") - pl.col("_host")
    return (
        j.with_columns(_host=host)
        .with_columns(
            _kernel=pl.when(rest <= KERNEL_WAIT_NS).then(rest).otherwise(0),
        )
        .with_columns(_other=pl.col("len") - pl.col("_host") - pl.col("_kernel"))
    )


def _per_step(dev: pl.LazyFrame, aggs: list[pl.Expr], keys: TimeKeys | None) -> pl.LazyFrame:
    """``group_by("rank", "step").agg(aggs)`` of `_by_step`'s rows, with `keys` on one sorted key.

    In `_by_step`'s order (by rank, then time) the start of each row's span (``_s``, the as-of
    match: the latest start at or before the row) never decreases within a rank, so the Int64 key
    of (rank, ``_s``) is sorted: its groups are runs of rows, found without hashing (the rank and
    the start of a span decide its step; rows in no span have no step and are left out, as no span's
    row would join them)."""
    if keys is None:
        return dev.group_by("rank", "step").agg(*aggs)
    return (
        dev.filter(pl.col("_s").is_not_null())
        .with_columns(_k=rank_time("_s", keys).set_sorted())
        .group_by("_k")
        .agg(pl.col("rank").first(), pl.col("step").first(), *aggs)
        .drop("_k")
    )


def _by_step(segments: pl.LazyFrame, spans: pl.LazyFrame, start: str, keys: TimeKeys | None = None) -> pl.LazyFrame:
    """Attach the step whose span (starting at column `start`) holds each in-step segment (`segments`:
    a `intervals.sweep`, whose order, by rank then ts, is what the as-of join asks for and is kept)."""
    starts = spans.filter(pl.col(start).is_not_null()).select("rank", pl.col(start).alias("_s"), "step")
    return asof_by_rank(
        segments.filter(pl.col("n_step") > 0), starts, "ts", "_s", ordered=True, keys=keys
    ).with_columns(len=pl.col("end") - pl.col("ts"))


def breakdown(
    events: pl.DataFrame,
    spans: pl.DataFrame,
    *,
    names: pl.Series | None = None,
    device: pl.DataFrame | None = None,
    ordered: bool = False,
    launched: Launches | None = None,
    keys: TimeKeys | None = None,
) -> pl.DataFrame:
    """Per (rank, step) of `spans` (see `derive.steps.step_spans`): the breakdown columns, in ns.

    Returns ``rank, step, device, start_ns, dur_ns`` and `BREAKDOWN_COLUMNS` (Int64), one row per
    span, partial steps included (the caller drops them). `names`:
    `vocab.distinct_names` of `events`, when the caller has them; `device`: their
    `device_sweep`, when the caller has it; `ordered`: `events` are sorted by rank then ts
    (`intervals.in_time_order`), which spares a sort; `launched`: their `derive.steps.launches`;
    `keys`: their `intervals.time_keys`.
    """
    lf, sp = events.lazy(), spans.lazy()
    names = distinct_names(events) if names is None else names
    if device is None:
        device = device_sweep(events, spans, names=names, keys=keys)
    if launched is None:
        launched = launches(events, spans.select("rank", "step", "host_start", "host_end"), names=names, keys=keys)
    names = _names(names)
    dev = _by_step(device.lazy(), sp, "start", keys)
    on = pl.col("len")
    copying = pl.col("n_copy") > 0
    computing = pl.col("n_compute") > 0
    collective = pl.col("n_comm") > 0
    p2p = pl.col("n_p2p") > 0
    communicating = collective | p2p
    active = computing | communicating | copying
    # per row, then summed per step: plain sums and extremes, no filter inside the aggregation
    per_row = {
        "compute_ns": computing,
        "comm_ns": communicating,
        "exposed_comm_ns": communicating & ~computing,
        "exposed_p2p_ns": p2p & ~collective & ~computing,
        "copy_ns": copying & ~computing & ~communicating,
        "idle_ns": ~active,
    }
    # a segment where some interval starts (a count rises over the rank's previous segment): the idle before
    # the first of them in a step is its lead idle; activity before it only carries on from the step before
    n_active = pl.col("n_compute") + pl.col("n_comm") + pl.col("n_p2p") + pl.col("n_copy")
    starts = n_active > n_active.shift(1).over("rank").fill_null(0)
    dev_agg = _per_step(
        dev.with_columns(
            **{c: pl.when(test).then(on).otherwise(0) for c, test in per_row.items()},
            _first_compute=pl.when(computing).then(pl.col("ts")),
            _first_active=pl.when(active).then(pl.col("ts")),
            _first_start=pl.when(active & starts).then(pl.col("ts")),
            _last_active=pl.when(active).then(pl.col("end")),
            _idle_at=pl.when(~active).then(pl.col("ts")),
            _idle_len=pl.when(~active).then(on),
        ),
        [pl.col(c).sum() for c in per_row]
        + [pl.col("_first_compute").min(), pl.col("_first_active").min(), pl.col("_last_active").max()]
        + [pl.col("_idle_len").filter(pl.col("_idle_at") < pl.col("_first_start").min()).sum().alias("_lead_cpu")],
        keys,
    )
    # the idle gaps of the breakdown's own timeline: its segments are cut into pieces at the other
    # cuts of the sweep, which the split of a gap must not see (its launch latency is of the whole gap).
    # A gap is a run of consecutive idle rows (a rank's rows are in time order): its step and start
    # are its first row's, its end its last row's; shifts, no group_by
    gap, rank = pl.col("_gap"), pl.col("rank")
    opens = (gap.ne_missing(gap.shift(1)) | rank.ne_missing(rank.shift(1))).fill_null(True)
    gaps = (
        dev.filter(~computing, ~communicating, ~copying)
        .with_columns(_gap=pl.col("breakdown_cut").cum_sum())
        .with_columns(_open=opens)
        .with_columns(_close=pl.col("_open").shift(-1).fill_null(True))
        # only the first and the last row of each gap (one row when it has one): the last's step and
        # start are the row before it
        .filter(pl.col("_open") | pl.col("_close"))
        .with_columns(
            _step=pl.when("_open").then(pl.col("step")).otherwise(pl.col("step").shift(1)),
            _ts=pl.when("_open").then(pl.col("ts")).otherwise(pl.col("ts").shift(1)),
        )
        .filter("_close")
        .select("rank", step="_step", ts="_ts", end="end", len=pl.col("end") - pl.col("_ts"))
    )
    idle = _split_idle(gaps, _next_work(launched.links.lazy(), spans, ordered=ordered, keys=keys), keys)
    cpu = sp.filter(pl.col("device") < 0).select("rank").unique()
    idle_agg = (
        idle.join(cpu, on="rank", how="anti")
        .group_by("rank", "step")
        .agg(idle_host_ns=pl.col("_host").sum(), idle_kernel_ns=pl.col("_kernel").sum())
    )
    host_agg = _host_agg(lf, spans, names, ordered)
    out = (
        sp.join(dev_agg, on=["rank", "step"], how="left")
        .join(host_agg, on=["rank", "step"], how="left")
        .join(idle_agg, on=["rank", "step"], how="left")
        .with_columns(
            start_ns=pl.col("start"),
            dur_ns=pl.col("end") - pl.col("start"),
            stall_ns=(pl.col("_first_compute") - pl.col("start")).fill_null(pl.col("end") - pl.col("start")),
            lead_idle_ns=pl.when(pl.col("device") >= 0)
            .then(pl.col("_first_active") - pl.col("_last_active").shift(1).over("rank", order_by="step"))
            .otherwise(pl.col("_lead_cpu"))
            .fill_null(0)
            .clip(lower_bound=0),
        )
        .with_columns(pl.col(c).fill_null(0).cast(pl.Int64) for c in BREAKDOWN_COLUMNS if c != "idle_other_ns")
        .with_columns(idle_other_ns=pl.col("idle_ns") - pl.col("idle_host_ns") - pl.col("idle_kernel_ns"))
        .select("rank", "step", "device", "start_ns", "dur_ns", *BREAKDOWN_COLUMNS)
        .sort("rank", "step")
    )
    return out.collect(engine="in-memory")  # less CPU than the streaming engine on this plan (as derive.sync_segments)

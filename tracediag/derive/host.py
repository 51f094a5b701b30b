"""Per (rank, step) on GPU ranks: how the host feeds the device — syncs, launches, queue depth.

What `detect.host_bound` reads to say *why* a device waits on its host:

- ``sync_n`` / ``sync_ns``: host runtime calls that block until the device catches up
  (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, a synchronous
  ``cudaMemcpy``, the HIP equivalents) plus asynchronous copies that held the host longer than
  `BLOCKING_COPY_NS` (a device-to-host copy into pageable memory, what ``.item()`` and ``.cpu()`` do);
  ``item_n``: ``aten::item`` / ``aten::_local_scalar_dense`` calls (a Python scalar read from the device).
- ``launch_n`` / ``launch_ns``: kernel launch calls and the host time they take.
- ``small_kernel_n``: kernels that ran for less time than their own launch call took: the device
  finishes them faster than the host can issue them, so it idles between them whatever else happens.
- ``queue_depth``: median over launches of the device work queued but not finished at the launch
  (1 = the device ran dry before each launch; a host that runs ahead keeps many queued).

All from the host rows and the main device's activities already in the event table (``step`` filled
by `derive.steps.assign_steps`); CPU-only ranks get no rows. A launch is a host runtime call (the
calls `derive.steps.launches` links to the device rows).
"""

from __future__ import annotations

import polars as pl

from tracediag.derive.grouping import per_rank_step
from tracediag.derive.host_comm import inside_host_comm
from tracediag.derive.intervals import TimeKeys, time_order
from tracediag.derive.ranked import keep_ranked
from tracediag.derive.steps import Launches, launches
from tracediag.vocab import BLOCKING_CALL, COPY_CALL, ITEM_OP, KERNEL_LAUNCH, distinct_names, name_matches

BLOCKING_COPY_NS = 100_000
"""An asynchronous copy call that holds the host this long (100 µs: far above the ~5 µs of a true
asynchronous enqueue) waited for the device: pageable memory or a device-to-host read."""

HOST_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "step": pl.Int32(),
    "sync_n": pl.Int64(),
    "sync_ns": pl.Int64(),
    "item_n": pl.Int64(),
    "launch_n": pl.Int64(),
    "launch_ns": pl.Int64(),
    "kernel_n": pl.Int64(),
    "small_kernel_n": pl.Int64(),
    "kernel_ns_median": pl.Float64(),
    "queue_depth": pl.Float64(),
}


def host_feed(
    events: pl.DataFrame,
    spans: pl.DataFrame,
    *,
    names: pl.Series | None = None,
    launched: Launches | None = None,
    keys: TimeKeys | None = None,
) -> pl.DataFrame:
    """Per (rank, step) of GPU ranks: `HOST_SCHEMA` (see the module docstring). `names`:
    `vocab.distinct_names` of `events`, when the caller has them; `launched`: their
    `derive.steps.launches` (over the spans' markers), when the caller has them; `keys`: their
    `intervals.time_keys`."""
    gpu = spans.filter(pl.col("device") >= 0).select("rank", "device").unique()
    if not gpu.height:
        return pl.DataFrame(schema=HOST_SCHEMA)
    lf = events.lazy()
    names = distinct_names(events) if names is None else names
    # the aggregates of CPU-only ranks' rows find no GPU step to join below: no filter by rank here
    host = lf.filter(pl.col("device") == -1, pl.col("step").is_not_null())
    runtime = host.filter(pl.col("kind").is_in(["runtime", "sync"]))
    blocking = name_matches(names, BLOCKING_CALL) | (
        name_matches(names, COPY_CALL) & (pl.col("dur") >= BLOCKING_COPY_NS)
    )
    launch = name_matches(names, KERNEL_LAUNCH)
    # only the rows counted below take part (a (rank, step) with none gets zeros from the join)
    # the tests made columns first: the aggregations are plain sums (a test inside an aggregation is
    # evaluated group by group)
    # (every group_by here is per (rank, step) on one Int64 key: `grouping.per_rank_step`)
    # a host collective's own synchronisations (gloo waiting for its CUDA input) are the collective's
    calls = inside_host_comm(
        runtime.filter(blocking | launch).select("rank", "tid", "ts", "step", "dur", _sync=blocking, _launch=launch),
        events,
    ).with_columns(pl.col("_sync") & ~pl.col("in_comm"))
    host_agg = per_rank_step(
        calls.select("rank", "step", "dur", "_sync", "_launch"),
        pl.col("_sync").sum().alias("sync_n"),
        pl.when("_sync").then("dur").otherwise(0).sum().alias("sync_ns"),
        pl.col("_launch").sum().alias("launch_n"),
        pl.when("_launch").then("dur").otherwise(0).sum().alias("launch_ns"),
    )
    items = per_rank_step(
        host.filter(pl.col("kind") == "cpu_op", name_matches(names, ITEM_OP)), pl.len().alias("item_n")
    )
    if launched is None:
        launched = launches(events, spans.select("rank", "step", "host_start", "host_end"), names=names, keys=keys)
    links = launched.links
    # the device rows' own steps, by position; their launch calls (runtime calls with a step)
    # come joined already
    is_launch = launch.fill_null(False) & pl.col("_launch_step").is_not_null()
    steps_of = links.lazy().with_columns(step=events.get_column("step").gather(links.get_column("_row")))
    work = (
        keep_ranked(steps_of.filter(pl.col("kind").is_in(["kernel", "comm", "memcpy", "memset"])), gpu, "device")
        .with_columns(pl.col("_call").alias("name"))
        .with_columns(
            lts=pl.when(is_launch).then(pl.col("_call_ts")),
            ldur=pl.when(is_launch).then(pl.col("_call_end") - pl.col("_call_ts")),
        )
    )
    kernels = work.filter(pl.col("kind") == "kernel", pl.col("step").is_not_null())
    kern_agg = per_rank_step(
        kernels.select("rank", "step", "dur", _small=pl.col("dur") < pl.col("ldur")),
        pl.len().alias("kernel_n"),
        pl.col("_small").sum().alias("small_kernel_n"),
        pl.col("dur").median().cast(pl.Float64).alias("kernel_ns_median"),
    )
    # queue depth: +1 at each launch call, -1 at the end of its device work, read at the launches
    linked = work.filter(pl.col("lts").is_not_null())
    points = pl.concat(
        [
            linked.select("rank", "step", t="lts", d=pl.lit(1, pl.Int64), at=pl.lit(True)),
            linked.select("rank", "step", t=pl.col("ts") + pl.col("dur"), d=pl.lit(-1, pl.Int64), at=pl.lit(False)),
        ]
    )
    queue = per_rank_step(
        # by rank, t, then d (ties are points of one call's work: one step, one median)
        points.sort(time_order("rank", "t", pl.col("d") > 0, keys))
        # one running sum over all ranks: each launch's +1 and -1 lie in its rank, so it is back at 0
        # where each rank starts
        .with_columns(depth=pl.col("d").cum_sum())
        .filter("at", pl.col("step").is_not_null()),
        pl.col("depth").median().cast(pl.Float64).alias("queue_depth"),
    )
    steps = spans.lazy().join(gpu.lazy(), on=["rank", "device"], how="semi").select("rank", "step")
    out = (
        steps.join(host_agg, on=["rank", "step"], how="left")
        .join(items, on=["rank", "step"], how="left")
        .join(kern_agg, on=["rank", "step"], how="left")
        .join(queue, on=["rank", "step"], how="left")
        .with_columns(
            pl.col(c).fill_null(0)
            for c in ("sync_n", "sync_ns", "item_n", "launch_n", "launch_ns", "kernel_n", "small_kernel_n")
        )
        .select(list(HOST_SCHEMA))
        .sort("rank", "step")
        .collect(engine="in-memory")  # less CPU than the streaming engine on this plan (8-rank A100 trace)
    )
    return out.cast(HOST_SCHEMA)

"""Kernel view: per rank, the kernels (GPU) or operators (CPU-only) that take the most time.

Over the analysed steps only. GPU ranks: device rows of the rank's main device, by name, split
``compute`` (kernels), ``communication`` (NCCL/RCCL kernels) and ``memory`` (memcpy/memset); totals
are sums of durations (concurrent kernels each count). CPU-only ranks: host operators (``cpu_op``,
and ``gloo:*`` work) by name, ``communication`` for c10d/gloo/wait operators, else ``compute``; totals
are *self* time (an operator's duration minus its direct children's on the same thread).

Totals are *summed* time: two streams or threads running the same kernel at once count twice, so a
total can pass the wall time (two gloo threads each in ``gloo:all_reduce`` for most of a step).
``wall_ns`` is the wall time instead: the union of the rows' spans over the rank's streams and
threads (per name, and per category), and ``share`` is that over the step time, never above 100%.
"""

from __future__ import annotations

import polars as pl

from tracediag.analysis import KERNEL_CATEGORY_SCHEMA, KERNEL_SCHEMA
from tracediag.derive.ranked import keep_ranked, rank_slices
from tracediag.vocab import HOST_COMM_OP, distinct_names, name_matches

TOP_STORED = 50
"""Rows kept per rank in the analysis (the JSON stays small on traces with thousands of kernels)."""


def _self_time(ops: pl.LazyFrame) -> pl.LazyFrame:
    """Replace ``dur`` by self time: minus the durations of the directly nested ops on the thread.

    Depth from a sweep over the thread's starts and ends (a parent starting with its child counts
    first; of two identical spans the first by name is the parent, so the result is deterministic);
    a child's parent is the latest op one level up that started no later (`join_asof`).
    """
    ops = ops.sort("rank", "tid", "ts", "dur", "name", descending=[False, False, False, True, False]).with_row_index(
        "_id"
    )
    points = pl.concat(
        [
            ops.select("rank", "tid", "_id", t="ts", _o=pl.lit(1), _k=-(pl.col("ts") + pl.col("dur")), _d=pl.lit(1)),
            ops.select(
                "rank",
                "tid",
                "_id",
                t=pl.col("ts") + pl.col("dur"),
                _o=pl.lit(0),
                _k=pl.lit(0, pl.Int64),
                _d=pl.lit(-1),
            ),
        ]
    )
    depth = (
        points.sort("rank", "tid", "t", "_o", "_k", "_id")
        .with_columns(_depth=pl.col("_d").cum_sum().over("rank", "tid") - 1)
        .filter(pl.col("_d") == 1)
        .select("_id", "_depth")
    )
    ops = ops.join(depth, on="_id")
    parents = ops.select("rank", "tid", _pd="_depth", _pts="ts", _pid="_id").sort("_pts", "_pid")
    children = (
        ops.filter(pl.col("_depth") > 0)
        .with_columns(_pd=pl.col("_depth") - 1)
        .sort("ts")
        .join_asof(parents, left_on="ts", right_on="_pts", by=["rank", "tid", "_pd"], check_sortedness=False)
        .group_by("_pid")
        .agg(_child=pl.col("dur").sum())
    )
    return (
        ops.join(children, left_on="_id", right_on="_pid", how="left")
        .with_columns(dur=(pl.col("dur") - pl.col("_child").fill_null(0)).clip(lower_bound=0))
        .drop("_id", "_depth", "_child")
    )


CATEGORY = pl.Enum(["communication", "compute", "memory"])
"""The kernel categories, in string order (so a sort on the Enum is the sort on the names): one byte a
row in the per-step tables a run's driver holds for every rank and step."""


def _category(name: str) -> pl.Expr:
    """A category as the Enum the rows are grouped and stored on (no string per row)."""
    return pl.lit(name, dtype=CATEGORY)


def _wall(rows: pl.LazyFrame, by: list[str], *, ordered: bool) -> pl.LazyFrame:
    """Per group of `by` (``rank`` among them): ``wall_ns``, the length of the union of the rows' spans
    (``ts``, ``dur``).

    One pass and no merge: in start order, a row adds the part of its span past the furthest end of
    its group's earlier rows. `ordered`: the rows are sorted by rank then ``ts`` (a `Run`'s events,
    filtered), so each group's rows are in start order already and nothing is sorted (a sort by the
    Categorical names would compare their strings: 3.5x the CPU of this on 8 A100 ranks).
    """
    if not ordered:
        rows = rows.sort("rank", "ts")
    end = pl.col("ts") + pl.col("dur")
    reach = end.shift(1).cum_max().over(by)
    added = (end - pl.max_horizontal("ts", reach)).clip(lower_bound=0)
    return rows.group_by(by).agg(wall_ns=added.sum().cast(pl.Int64))


KERNEL_STEP_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "step": pl.Int32(),
    "name": pl.Categorical(),
    "category": CATEGORY,
    "count": pl.Int32(),
    "total_ns": pl.Int64(),
    "wall_ns": pl.Int64(),
}
"""`kernel_steps`: per (rank, step, name, category), how many rows, their summed (self) time and
their wall time (the union of their spans over streams and threads). ``name`` is Categorical (4 bytes
a row, sorted as strings), ``category`` the `CATEGORY` Enum (1 byte) and ``count`` Int32 (rows of one
name in one step of one rank; summed as Int64): every rank repeats the same few hundred names, and a
run's driver holds this table for every rank and step (`RankSummary.kernels`: 7.2 million rows at
16,384 ranks)."""

CATEGORY_STEP_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "step": pl.Int32(),
    "category": CATEGORY,
    "wall_ns": pl.Int64(),
}
"""`kernel_steps`' second table: per (rank, step, category), the wall time of the category's rows."""


def kernel_steps(
    events: pl.DataFrame, devices: pl.DataFrame, *, names: pl.Series | None = None, ordered: bool = False
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per (rank, step, name, category): ``count``, ``total_ns`` and ``wall_ns`` of the kernels (GPU
    ranks) or operators (CPU-only ranks) of the rows with a step, `KERNEL_STEP_SCHEMA`; and per
    (rank, step, category) their ``wall_ns``, `CATEGORY_STEP_SCHEMA`.

    The per-rank half of the kernel view (`kernel_view` sums it over the analysed steps). `events`
    has ``step`` filled (`derive.steps.assign_steps`); `devices` holds ``rank`` and its main
    ``device`` (-1: CPU-only). `names`:
    `vocab.distinct_names` of `events`, when the caller has them; `ordered`: `events` are sorted by
    rank then ts (`intervals.in_time_order`), which spares the sorts of the wall times.
    """
    names = distinct_names(events) if names is None else names
    lf = events.lazy().filter(pl.col("step").is_not_null())
    main = devices.lazy().select("rank", "device")
    # the rows of each rank's main device (GPU ranks) or of the host (CPU-only ranks), filtered
    # before the join to the few ranks: no column of the main device on every row
    gpu = keep_ranked(
        lf.filter(pl.col("device") >= 0, pl.col("kind").is_in(["kernel", "comm", "memcpy", "memset"])),
        devices.filter(pl.col("device") >= 0),
        "device",
    ).with_columns(
        category=pl.when(pl.col("kind") == "kernel")
        .then(_category("compute"))
        .when(pl.col("kind") == "comm")
        .then(_category("communication"))
        .otherwise(_category("memory"))
    )
    cpu = (
        lf.filter(pl.col("device") == -1, pl.col("kind").is_in(["cpu_op", "comm"]))
        .join(main.filter(pl.col("device") < 0), on="rank", how="semi", maintain_order="left")
        .with_columns(
            category=pl.when(
                (pl.col("kind") == "comm") | pl.col("coll_op").is_not_null() | name_matches(names, HOST_COMM_OP)
            )
            .then(_category("communication"))
            .otherwise(_category("compute"))
        )
    )
    cpu = cpu.select("rank", "step", "tid", "ts", "dur", "name", "category")
    # grouped on the Categorical names and the Enum categories; the names made Categorical of the global
    # string cache once per group (the two parts hold different ranks)
    keys = ["rank", "step", "name", "category"]
    has_gpu, has_cpu = devices.select(
        (pl.col("device") >= 0).any().alias("gpu"), (pl.col("device") < 0).any().alias("cpu")
    ).row(0)
    parts = [(gpu, gpu), (_self_time(cpu), cpu)]  # (rows to sum, rows whose spans make the wall time)
    present = [p for p, keep in zip(parts, (has_gpu, has_cpu), strict=True) if keep]
    # a part of no rank is not planned (each costs a pass over the events)
    if not present:
        return pl.DataFrame(schema=KERNEL_STEP_SCHEMA), pl.DataFrame(schema=CATEGORY_STEP_SCHEMA)
    per_name = pl.concat(
        [
            summed.group_by(keys)
            .agg(count=pl.len().cast(pl.Int32), total_ns=pl.col("dur").sum().cast(pl.Int64))
            .join(_wall(spans, keys, ordered=ordered), on=keys, how="left")
            for summed, spans in present
        ]
    )
    per_category = pl.concat([_wall(spans, ["rank", "step", "category"], ordered=ordered) for _, spans in present])
    per_name, per_category = pl.collect_all(
        [
            per_name.with_columns(pl.col("name").cast(pl.String).cast(pl.Categorical))
            .sort("rank", "step", "name", "category")
            .select(list(KERNEL_STEP_SCHEMA)),
            per_category.sort("rank", "step", "category").select(list(CATEGORY_STEP_SCHEMA)),
        ],
        engine="in-memory",
    )
    return per_name.cast(KERNEL_STEP_SCHEMA), per_category.cast(CATEGORY_STEP_SCHEMA)


def kernel_view(
    per_step: pl.DataFrame, steps: pl.DataFrame, *, top: int | None = TOP_STORED, strings: bool = True
) -> pl.DataFrame:
    """Per rank, the `top` kernels/operators by total time over the (rank, step) pairs of `steps`
    (all of them when `top` is None): `KERNEL_SCHEMA`, from a `kernel_steps` table.

    `steps` holds ``rank``, ``step`` and ``dur_ns`` (the breakdown); ``share`` is the wall time over
    their total. Without `strings`, ``name`` and ``category`` stay Categorical (4 bytes a row, not a
    string: the reduce keeps the view of every rank and casts the rows it stores).
    """
    if not steps.height:
        return pl.DataFrame(schema=KERNEL_SCHEMA)
    keys = steps.select("rank", "step").unique()
    total_step = steps.group_by("rank").agg(_step=pl.col("dur_ns").sum())
    schema = KERNEL_SCHEMA if strings else {**KERNEL_SCHEMA, "name": pl.Categorical(), "category": pl.Categorical()}

    def view(rows: pl.DataFrame) -> pl.DataFrame:
        out = (
            rows.lazy()
            .join(keys.lazy(), on=["rank", "step"], how="semi")
            .group_by("rank", "name", "category")
            .agg(pl.col("count").cast(pl.Int64).sum(), pl.col("total_ns").sum(), pl.col("wall_ns").sum())
            .join(total_step.lazy(), on="rank")
            .with_columns(
                mean_ns=(pl.col("total_ns") // pl.col("count")).cast(pl.Int64),
                share=pl.col("wall_ns") / pl.col("_step").clip(lower_bound=1),
            )
            .sort(["rank", "total_ns", "name"], descending=[False, True, False])
        )
        if top is not None:
            out = out.group_by("rank", maintain_order=True).head(top)
        # streamed, the sums of integers: the engine changes no value
        return out.select(list(KERNEL_SCHEMA)).collect(engine="streaming").cast(schema)

    # a rank slice at a time (the per-step table: 7.2 million rows at 16,384 ranks): the group-by's
    # tables are a slice's, and every row is a rank's own, so the slices' views are the view
    return pl.concat([view(rows) for rows in rank_slices(per_step)])


def top_kernels(events: pl.DataFrame, steps: pl.DataFrame, *, top: int | None = TOP_STORED) -> pl.DataFrame:
    """Per rank, the `top` kernels/operators by total time over the (rank, step) pairs of `steps`
    (all of them when `top` is None), from the events of those steps alone.

    `events` has ``step`` filled (`derive.steps.assign_steps`); `steps` holds ``rank``, ``step``,
    ``device`` and ``dur_ns`` (the breakdown).
    """
    if not steps.height:
        return pl.DataFrame(schema=KERNEL_SCHEMA)
    keys = steps.select("rank", "step").unique()
    devices = steps.group_by("rank").agg(pl.col("device").first())
    per_name, _ = kernel_steps(events.join(keys, on=["rank", "step"], how="semi"), devices)
    return kernel_view(per_name, steps, top=top)


def by_category(kernels: pl.DataFrame, per_category: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, category) of a `kernel_view(..., top=None)` table (either `strings`): ``count`` and ``total_ns``
    (summed), ``wall_ns`` over the (rank, step) pairs of `steps` (from `kernel_steps`' category
    table) and ``share`` = wall / the steps' total."""
    total_step = steps.group_by("rank").agg(_step=pl.col("dur_ns").sum())
    wall = (
        per_category.join(steps.select("rank", "step").unique(), on=["rank", "step"], how="semi")
        .group_by("rank", "category")
        .agg(pl.col("wall_ns").sum())
        .with_columns(pl.col("category").cast(pl.String))
    )
    return (
        kernels.group_by("rank", "category")
        .agg(pl.col("count").sum(), pl.col("total_ns").sum())
        .with_columns(pl.col("category").cast(pl.String))
        .join(wall, on=["rank", "category"], how="left")
        .join(total_step, on="rank", how="left")
        .with_columns(share=pl.col("wall_ns").fill_null(0) / pl.col("_step").clip(lower_bound=1))
        .sort("rank", "category")
        .select(list(KERNEL_CATEGORY_SCHEMA))
        .cast(KERNEL_CATEGORY_SCHEMA)
    )

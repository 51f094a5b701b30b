"""Run sanity: are these files ranks of one run? Checked before any cross-rank analysis.

Comparing ranks of two unrelated runs (an A100 rank 3 of 8 next to a V100 rank 1 of 2) would invent
cross-rank waits and a straggler. Files are refused as one run when they disagree on what a run
fixes: the stated world size, the device type, the communication backend, when they ran (time spans
that do not overlap, on traces with epoch timestamps), or which collectives they run (both record
collectives and share no operation). `split_by_file` gives the per-file runs `--allow-mixed` analyses.
"""

from __future__ import annotations

import itertools
import os
import re

import polars as pl

from tracediag.api_types import checked
from tracediag.errors import MixedRunError, shown
from tracediag.run import Run, RunMeta
from tracediag.units import NS_PER_S

SPAN_SLACK_NS = 60_000_000_000
"""Host clocks of one job differ by milliseconds and profilers start a little apart; recorded windows
more than a minute apart are different runs."""


def _name(path: str) -> str:
    """The file and its folder (rank files of different runs often share a base name)."""
    path = path.rstrip("/")
    return shown(os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path)) or path)


def _device_type(name: str) -> str:
    """A device's type without its index ("cpu:2048", "cpu:0" and "gpu0" are "cpu", "cpu", "gpu"); GPU
    model names stay whole ("NVIDIA A100-PG509-200", "Tesla T4": no separator or lower-case letter
    before their last digits)."""
    return re.sub(r"(?:[:_#/ ]+|(?<=[a-z]))\d+$", "", name.strip())


def _differ(label: str, values: dict[str, object]) -> str | None:
    """'label differ: a: X, b: Y' when the known values are not all equal."""
    known = {p: v for p, v in values.items() if v not in (None, (), "")}
    if len(set(known.values())) <= 1:
        return None
    shown = ", ".join(f"{_name(p)}: {v}" for p, v in known.items())
    return f"{label} differ ({shown})"


def rank_extents(events: pl.DataFrame) -> pl.DataFrame:
    """Per rank: the recorded window (``lo``, ``hi``: first start, last end) and the collective
    operations it runs (``coll_ops``, sorted): what the run checks read from the events. Per rank,
    so workers compute it where the files lie (`derive.per_rank.rank_tables`)."""
    coll = pl.col("coll_op")  # tested on the Enum, made strings once per distinct value
    is_coll = coll.is_not_null() & ~coll.is_in(["other", "send", "recv"])
    lf = events.lazy()
    rank = events.get_column("rank")
    if not rank.null_count() and rank.is_sorted():
        # a `Run`'s rows are in rank order: each rank's rows are one run, grouped without hashing
        # (a pass to check it, about a thirtieth of the group_by's hashing of 600k rows)
        lf = lf.with_columns(pl.col("rank").set_sorted())
    return (
        lf.group_by("rank")
        .agg(
            lo=pl.col("ts").min(),
            hi=(pl.col("ts") + pl.col("dur")).max(),
            coll_ops=coll.filter(is_coll).unique().cast(pl.String).sort(),
        )
        .sort("rank")
        .collect()
    )


def _time_spans(meta: RunMeta, extents: pl.DataFrame) -> str | None:
    epoch = {f.rank: f.path for f in meta.files if f.time_base == "epoch"}
    if len(epoch) < 2:
        return None
    spans = extents.filter(pl.col("rank").is_in(list(epoch)), pl.col("lo").is_not_null()).sort("lo")
    if spans.height < 2:
        return None
    rows = spans.rows(named=True)
    latest_end = rows[0]["hi"]
    for prev, row in itertools.pairwise(rows):
        if row["lo"] > latest_end + SPAN_SLACK_NS:
            gap = (row["lo"] - latest_end) / NS_PER_S
            return (
                f"recorded time spans do not overlap ({_name(epoch[row['rank']])} starts {gap:,.0f} s after "
                f"{_name(epoch[prev['rank']])} and the files before it end)"
            )
        latest_end = max(latest_end, row["hi"])
    return None


def _collectives(meta: RunMeta, extents: pl.DataFrame) -> str | None:
    ops = {r: set(o) for r, o in extents.select("rank", "coll_ops").iter_rows() if o}
    if len(ops) < 2 or set.intersection(*ops.values()):
        return None
    path = {f.rank: f.path for f in meta.files}
    shown = ", ".join(f"{_name(path.get(r, str(r)))}: {'/'.join(sorted(o))}" for r, o in sorted(ops.items()))
    return f"collectives do not match ({shown})"


def run_problems(meta: RunMeta, extents: pl.DataFrame) -> list[str]:
    """Why the files of `meta` are not one run (empty when they may be), from their metadata and
    the per-rank `rank_extents`: what the driver checks from summaries (`tracediag.execute`)."""
    files = meta.files
    if len(files) < 2:
        return []
    checks = [
        _differ("world sizes", {f.path: f.world_size for f in files}),
        _differ("device types", {f.path: "/".join(sorted({_device_type(d) for d in f.devices})) for f in files}),
        _differ("backends", {f.path: f.backend for f in files}),
        _time_spans(meta, extents),
        _collectives(meta, extents),
    ]
    return [c for c in checks if c]


def mixed_run_problems(run: Run) -> list[str]:
    """Why the files of `run` are not one run (empty when they may be)."""
    if len(run.meta.files) < 2:
        return []
    return run_problems(run.meta, rank_extents(run.events))


def check_problems(meta: RunMeta, problems: list[str]) -> None:
    """Raise `MixedRunError` (one line naming the files) when there are `problems`."""
    if problems:
        names = ", ".join(_name(f.path) for f in meta.files)
        msg = (
            f"{names} are not ranks of one run: {'; '.join(problems)}. "
            "Pass --allow-mixed to analyse each file on its own"
        )
        raise MixedRunError(msg)


def check_same_run(run: Run) -> pl.DataFrame | None:
    """Raise `MixedRunError` (one line naming the files) when the files are not ranks of one run.

    Returns the `rank_extents` the check read (None for one file, where there is nothing to check),
    so that the caller need not derive them again (`derive.per_rank.rank_tables`)."""
    if len(run.meta.files) < 2:
        return None
    extents = rank_extents(run.events)
    check_problems(run.meta, run_problems(run.meta, extents))
    return extents


@checked
def split_by_file(run: Run) -> list[tuple[str, Run]]:
    """One run per file (its rank's events and metadata), in rank order."""
    out = []
    for f in sorted(run.meta.files, key=lambda f: f.rank):
        events = run.events.filter(pl.col("rank") == f.rank)
        out.append((f.path, Run(events=events, meta=RunMeta(files=(f,)))))
    return out

"""The tables a Perfetto export draws beside the timeline: clock offsets, collective arrivals, idle gaps.

The `Analysis` keeps per-step totals; the export needs them as intervals. They are derived here from
the run's events by the analysis' own stages (`derive.steps`, `derive.collectives`,
`derive.breakdown.device_sweep`), so the offsets, the matched instances and the idle split are the
ones the analysis read: aligned clocks are each rank's ``ts − offset_ns`` (`collectives.clock_offsets`),
and the idle gaps are split into waiting on the host / on kernels / other by the breakdown's rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import polars as pl

from tracediag.derive.breakdown import KERNEL_WAIT_NS, device_sweep
from tracediag.derive.collectives import align_and_match, collective_instances, plausible_matches
from tracediag.derive.intervals import in_time_order, time_keys
from tracediag.derive.steps import assign_steps, find_markers, launches, step_spans
from tracediag.reduce import needs_split
from tracediag.vocab import distinct_names

if TYPE_CHECKING:
    from tracediag.analysis import Analysis
    from tracediag.run import Run

IDLE_KINDS = ("host", "kernel", "other")
"""How an idle gap of the device is split (`derive.breakdown`): the device waits on the host (nothing
queued until the launch call returns), on kernels (launch latency), or other (queued work held)."""

_DEVICE_WORK = ("kernel", "comm", "memcpy", "memset")


@dataclass(frozen=True)
class Tracks:
    """What the export draws from the analysis' derivation, on aligned clocks."""

    offsets: pl.DataFrame
    """``rank, offset_ns``: subtract from a rank's timestamps to align it."""
    arrivals: pl.DataFrame
    """Per rank and matched instance: ``iid, rank, group, op, seq, step, arrival, aligned_end, wait_ns,
    late_rank`` (the instance's last arriver; of equal arrivals the lowest rank, as the analysis names it)."""
    idle: pl.DataFrame
    """``rank, step, kind, ts, end``: idle device time by kind (`IDLE_KINDS`) over the analysed steps."""
    hosts: dict[int, str] = field(default_factory=dict)
    """Each rank's host, where its trace names one (`run.RunMeta.hosts`): one clock, one offset per host."""

    def host_offsets(self) -> dict[str, int]:
        """Each named host's clock offset (ns; the lowest rank's host 0), as the analysis aligned it."""
        return {self.hosts[r]: o for r, o in self.offsets.select("rank", "offset_ns").iter_rows() if r in self.hosts}


def derive_tracks(run: Run, analysis: Analysis, *, step_regex: str | None = None) -> Tracks:
    """The `Tracks` of `run`, as `analysis` (its analysis) derived them."""
    events = run.events
    names = distinct_names(events)
    ordered = in_time_order(events, "rank", "ts")
    keys = time_keys(events)
    markers = find_markers(events, step_regex=step_regex)
    launched = launches(events, markers, names=names, ordered=ordered, keys=keys)
    spans = step_spans(events, markers, names=names, ordered=ordered, launched=launched, keys=keys)
    stepped = assign_steps(events, spans, ordered=ordered, launched=launched, keys=keys)
    instances = collective_instances(stepped, names=names)
    offsets, matched, _ = align_and_match(instances, split=needs_split(run.meta, instances), hosts=run.meta.hosts)
    matched, _ = plausible_matches(matched)
    device = device_sweep(stepped, spans, names=names, keys=keys)
    kept = analysis.steps.select("rank", "step")
    idle = (
        idle_gaps(device, spans, launched.links, offsets).join(kept, on=["rank", "step"], how="semi").sort("rank", "ts")
    )
    return Tracks(offsets=offsets, arrivals=_arrivals(matched), idle=idle, hosts=run.meta.hosts)


def _arrivals(matched: pl.DataFrame) -> pl.DataFrame:
    """Instances seen on two ranks or more, each row with the instance's last arriver."""
    late = pl.col("rank").sort_by(["arrival", "rank"], descending=[False, True]).last().over("iid")
    return (
        matched.filter(pl.col("n_ranks") > 1)
        .with_columns(late_rank=late)
        .select("iid", "rank", "group", "op", "seq", "step", "arrival", "aligned_end", "wait_ns", "late_rank")
        .sort("rank", "arrival", "iid")
    )


def idle_gaps(device: pl.DataFrame, spans: pl.DataFrame, links: pl.DataFrame, offsets: pl.DataFrame) -> pl.DataFrame:
    """``rank, step, kind, ts, end`` (aligned) of the device timeline's idle gaps (`device_sweep` rows with
    no compute, communication or copy, a gap opening at each cut of the breakdown's own timeline), each
    split as the breakdown splits it: on the host until the launch call of the work that ends the gap
    returns (the whole gap when no work follows), then up to `KERNEL_WAIT_NS` on kernels, the rest other.
    CPU-only ranks: all other."""
    busy = pl.sum_horizontal("n_compute", "n_comm", "n_p2p", "n_copy") > 0
    starts = spans.filter(pl.col("start").is_not_null()).select("rank", _s="start", step="step").sort("_s")
    rows = (
        device.lazy()
        .filter(pl.col("n_step") > 0)
        .sort("ts")
        .join_asof(starts.lazy(), left_on="ts", right_on="_s", by="rank", check_sortedness=False)
    )
    gaps = (
        rows.sort("rank", "ts")
        .filter(~busy)
        .with_columns(_gap=pl.col("breakdown_cut").cast(pl.Int64).cum_sum().over("rank"))
        .group_by("rank", "_gap")
        .agg(pl.col("step").first(), pl.col("ts").first(), pl.col("end").last())
        .filter(pl.col("step").is_not_null())
        .drop("_gap")
    )
    main = spans.filter(pl.col("device") >= 0).select("rank", "device").unique()
    work = (
        links.lazy()
        .filter(pl.col("kind").is_in(_DEVICE_WORK))
        .join(main.lazy(), on=["rank", "device"], how="semi")
        .group_by("rank", "ts")
        .agg(next_launch=pl.col("_call_end").min())
        .select("rank", next_ts="ts", next_launch="next_launch")
        .sort("next_ts")
    )
    length = pl.col("end") - pl.col("ts")
    host = (
        pl.when(pl.col("next_ts").is_null())
        .then(length)
        .when(pl.col("next_launch").is_null())
        .then(0)
        .otherwise((pl.col("next_launch") - pl.col("ts")).clip(pl.lit(0), length))
    )
    on_gpu = pl.col("rank").is_in(main["rank"].implode())
    rest = length - pl.col("_host")
    split = (
        gaps.sort("end")
        .join_asof(work, left_on="end", right_on="next_ts", by="rank", strategy="forward", check_sortedness=False)
        .with_columns(_host=pl.when(on_gpu).then(host).otherwise(0))
        .with_columns(_kernel=pl.when(on_gpu & (rest <= KERNEL_WAIT_NS)).then(rest).otherwise(0))
        .join(offsets.lazy(), on="rank", how="left")
        .with_columns(
            _t=pl.col("ts") - pl.col("offset_ns").fill_null(0), _e=pl.col("end") - pl.col("offset_ns").fill_null(0)
        )
    )
    t0, t1, t2 = pl.col("_t"), pl.col("_t") + pl.col("_host"), pl.col("_t") + pl.col("_host") + pl.col("_kernel")
    pieces = [
        split.select("rank", "step", kind=pl.lit(kind), ts=lo, end=hi)
        for kind, lo, hi in (("host", t0, t1), ("kernel", t1, t2), ("other", t2, pl.col("_e")))
    ]
    return (
        pl.concat(pieces)
        .filter(pl.col("end") > pl.col("ts"))
        .with_columns(pl.col("kind").cast(pl.Enum(list(IDLE_KINDS))))
        .sort("rank", "ts")
        .collect()
    )

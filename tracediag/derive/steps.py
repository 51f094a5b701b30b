"""Step segmentation: which training step every event belongs to.

Steps come from host markers: ``ProfilerStep#N`` (Kineto, Nsight), ``train#N`` (JAX), or any host row
whose name matches a user regex (NVTX ranges, annotations). The rank's *training thread* is the
thread holding the markers. On GPU traces a step is projected onto each device through correlation:
a kernel belongs to the step during which its launch ran on the host, and the device span of step N
runs from its first device activity to the first device activity of step N+1 (the last step ends at
its last activity), so device steps partition the device timeline.

A step at the edge of a rank's recorded window is *partial* and left out of the analysis when its
marker is cut short (shorter than half the shortest of the rank's other steps: a median would cut
the healthy edge step of a run whose steps alternate, one slow step in two) or, on GPU traces,
when kernels launched in it never reached the trace (the profiler stopped before they ran). A step
with no span at all (on a GPU rank, one the device did nothing in, past the first) is left out too.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracediag.derive.intervals import TimeKeys, asof_by_rank, ranked_span
from tracediag.derive.ranked import keep_ranked
from tracediag.errors import NoStepsError
from tracediag.vocab import ANY_LAUNCH, STEP_NUMBER, distinct_names, name_matches, user_regex

PARTIAL_SHORT = 0.5
"""An edge step shorter than this fraction of the rank's shortest other step is cut by the window."""

STEP_SPAN_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "step": pl.Int32(),
    "tid": pl.Int64(),
    "host_start": pl.Int64(),
    "host_end": pl.Int64(),
    "device": pl.Int16(),
    "start": pl.Int64(),
    "end": pl.Int64(),
    "partial": pl.Boolean(),
    "clipped_ns": pl.Int64(),
    "repeats": pl.Int32(),
}
"""Per (rank, step): the marker thread and host span, and the span the breakdown uses (``start``,
``end``: the device span on GPU traces, ``device`` = -1 and the host span on CPU-only traces); ``clipped_ns``:
how much of the marker overlapped the next step's and was cut (0 where none); ``repeats``: the other markers
of its step number left out (0 where none)."""


def find_markers(events: pl.DataFrame, *, step_regex: str | None = None) -> pl.DataFrame:
    """Host step markers: ``rank, step, tid, host_start, host_end, clipped_ns, repeats`` (one row per rank and
    step; ``clipped_ns``: how much of the marker overlapped the next one, cut off; ``repeats``: the markers of
    the same step number left out, the longest kept).

    Without `step_regex`, rows of kind ``step`` named ``ProfilerStep#N`` / ``train#N``. With it, host
    rows of any kind whose name matches; the first group is the step number, or, when the regex
    has no group, steps are numbered 0, 1, ... in time order per rank.
    """
    pattern = step_regex or STEP_NUMBER
    compiled = user_regex(pattern, "--step-regex")  # linear time; a refused pattern is a one-line ValueError
    host = events.lazy().filter(pl.col("device") == -1)
    if step_regex is None:
        host = host.filter(pl.col("kind") == "step")
    name = pl.col("name").cast(pl.String)
    rows = host.filter(name.str.contains(pattern)).select(
        "rank", "tid", pl.col("ts").alias("host_start"), (pl.col("ts") + pl.col("dur")).alias("host_end"), name
    )
    if compiled.groups:
        digits = pl.col("name").str.extract(pattern, 1)
        number = digits.cast(pl.Int64, strict=False)
        fits = number.is_between(_STEP_MIN, _STEP_MAX)
        step = pl.when(fits).then(number).cast(pl.Int32)
        rows = rows.with_columns(step=step, _digits=digits).collect(engine="in-memory").lazy()
        _refuse_out_of_range(rows, pattern)
        rows = rows.drop("_digits")
    else:
        # markers that start together keep the event table's order (file order): numbered the same each run
        rows = rows.sort("rank", "host_start", maintain_order=True).with_columns(
            step=pl.int_range(pl.len()).over("rank").cast(pl.Int32)
        )
    return (
        # a marker of no length bounds no step: taken as one, its rank would seem to compute nothing in it
        rows.filter(pl.col("step").is_not_null() & (pl.col("host_end") > pl.col("host_start")))
        .sort("rank", "host_start", maintain_order=True)
        # one marker per (rank, step): the longest, should a step be annotated twice (of equal ones, the last)
        .group_by("rank", "step")
        .agg(
            pl.all().sort_by(pl.col("host_end") - pl.col("host_start"), maintain_order=True).last(),
            repeats=(pl.len() - 1).cast(pl.Int32),
        )
        .select("rank", "step", "tid", "host_start", "host_end", "repeats")
        .sort("rank", "host_start", "step")
        # nested or overlapping markers (a loose --step-regex, a damaged trace): each ends where the next
        # begins, so steps partition the host timeline and no time is counted twice; `clipped_ns` says by how
        # much (the analysis warns of it)
        .with_columns(
            _end=pl.min_horizontal(
                "host_end", pl.col("host_start").shift(-1).over("rank").fill_null(pl.col("host_end"))
            )
        )
        .select(
            "rank",
            "step",
            "tid",
            "host_start",
            pl.col("_end").alias("host_end"),
            (pl.col("host_end") - pl.col("_end")).alias("clipped_ns"),
            "repeats",
        )
        .sort("rank", "step")
        .collect(engine="in-memory")
    )


def _refuse_out_of_range(rows: pl.LazyFrame, pattern: str) -> None:
    """`NoStepsError` when a marker's step number is a whole number outside `_STEP_MIN`..`_STEP_MAX`:
    dropped, it would leave a silent gap or "no ProfilerStep#N markers"; wrapped, a wrong step."""
    bad = (
        rows.filter(pl.col("step").is_null() & pl.col("_digits").str.contains(r"^[+-]?[0-9]+$"))
        .select(pl.len(), pl.col("_digits").first())
        .collect(engine="in-memory")
    )
    if bad.item(0, 0):
        what = "ProfilerStep#N markers" if pattern == STEP_NUMBER else f"markers of --step-regex {pattern!r}"
        msg = (
            f"{bad.item(0, 0)} {what} number their step beyond {_STEP_MIN}..{_STEP_MAX} "
            f"(e.g. {bad.item(0, 1)[:40]}): out of range, not read"
        )
        raise NoStepsError(msg)


_STEP_MIN, _STEP_MAX = -(2**31) + 1, 2**31 - 2
"""Step numbers the ``step`` column (Int32) holds with room for the step before and after (N ± 1)."""


def _host_step(
    lf: pl.LazyFrame, markers: pl.DataFrame, ts: str = "ts", *, ordered: bool = False, keys: TimeKeys | None = None
) -> pl.LazyFrame:
    """Add ``_step``: the marker of the same rank whose host span contains column `ts`, the rows in
    (rank, `ts`) order (`ordered`: `lf` is sorted so already, as the as-of join asks; `keys`: the
    events' `intervals.TimeKeys`)."""
    m = markers.lazy().select("rank", pl.col("host_start").alias("_ms"), "host_end", pl.col("step").alias("_step"))
    return (
        asof_by_rank(lf, m, ts, "_ms", ordered=ordered, keys=keys)
        .with_columns(
            _step=pl.when(pl.col(ts) < pl.col("host_end")).then(pl.col("_step")).otherwise(pl.lit(None, pl.Int32))
        )
        .drop("_ms", "host_end")
    )


def _launch_steps(
    events: pl.DataFrame, markers: pl.DataFrame, names: pl.Series, ordered: bool, keys: TimeKeys | None
) -> pl.LazyFrame:
    """Per (rank, correlation) of host runtime calls: the step during which the call ran, its name
    (``_call``) and whether it launches a kernel (``_launch``, `vocab.ANY_LAUNCH`; `names`:
    `vocab.distinct_names` of `events`; `ordered`: `events` are sorted by rank then ts)."""
    runtime = (
        events.lazy()
        .filter(pl.col("kind") == "runtime", pl.col("device") == -1, pl.col("correlation").is_not_null())
        .select(
            "rank",
            "correlation",
            "ts",
            _call="name",
            _launch=name_matches(names, ANY_LAUNCH),
            _call_ts="ts",
            _call_end=pl.col("ts") + pl.col("dur"),
        )
    )
    return _host_step(runtime, markers, ordered=ordered, keys=keys).select(
        "rank", "correlation", "_call", "_launch", "_call_ts", "_call_end", pl.col("_step").alias("_launch_step")
    )


@dataclass(frozen=True, eq=False)
class Launches:
    """The host runtime calls of an event table and its device rows, each with the call that
    launched it (`launches`): joined once, read by `step_spans`, `assign_steps`, the breakdown's
    idle split (`derive.breakdown`) and how the host feeds the device (`derive.host`)."""

    calls: pl.DataFrame
    """Per host runtime call with a ``correlation``: ``rank, correlation``, ``_call`` (its name),
    ``_launch`` (a kernel launch, `vocab.ANY_LAUNCH`), ``_call_ts``, ``_call_end`` and ``_launch_step``
    (the marker whose host span holds the call); ``_rc``, the `call_key`, when it fits."""
    links: pl.DataFrame
    """The device rows (any device and kind), in the event table's order: ``_row`` (index in the
    event table), ``rank, device, kind, ts, dur, correlation`` and the columns of their call in
    `calls` (null when none)."""


def launches(
    events: pl.DataFrame,
    markers: pl.DataFrame,
    *,
    names: pl.Series | None = None,
    ordered: bool = False,
    keys: TimeKeys | None = None,
) -> Launches:
    """The `Launches` of `events` over `markers` (`find_markers`). `names`:
    `vocab.distinct_names` of `events`, when the caller has them; `ordered`: `events` are
    sorted by rank then ts (`intervals.in_time_order`), which spares a sort; `keys`: their
    `intervals.time_keys` (Int64 keys for the as-of join)."""
    calls = _launch_steps(events, markers, distinct_names(events) if names is None else names, ordered, keys)
    links = (
        events.lazy()
        .select("rank", "device", "kind", "ts", "dur", "correlation")
        .with_row_index("_row")
        .filter(pl.col("device") >= 0)
    )
    key = call_key(events)
    if key is None:
        links = links.join(calls, on=["rank", "correlation"], how="left", maintain_order="left")
    else:  # one Int64 key to hash instead of two columns: about half the join's CPU
        calls = calls.with_columns(_rc=key)
        links = links.with_columns(_rc=key).join(
            calls.drop("rank", "correlation"), on="_rc", how="left", maintain_order="left"
        )
    return Launches(*pl.collect_all([calls, links], engine="in-memory"))


def call_key(events: pl.DataFrame) -> pl.Expr | None:
    """(``rank``, ``correlation``) as one Int64 that is equal where both are (null where either is),
    for the events' values: ``rank * 2**bits + (correlation - least)``. None when it cannot hold them
    (a null or negative rank, no correlation, or more ranks than fit above the correlations' span)."""
    span = ranked_span(events, pl.col("correlation").min(), pl.col("correlation").max())
    if span is None:
        return None
    lo, hi, rmax = span
    bits = (hi - lo).bit_length()
    if (rmax + 1) << bits >= 2**63:
        return None
    return pl.col("rank").cast(pl.Int64) * pl.lit(1 << bits, pl.Int64) + (pl.col("correlation") - lo)


def step_spans(
    events: pl.DataFrame,
    markers: pl.DataFrame,
    *,
    names: pl.Series | None = None,
    ordered: bool = False,
    launched: Launches | None = None,
    keys: TimeKeys | None = None,
) -> pl.DataFrame:
    """Per (rank, step): host span, the span the breakdown uses and whether the step is partial.

    Returns a frame with `STEP_SPAN_SCHEMA`. A rank with device activity gets the device span of the
    device that has most of it; other ranks use the host span and ``device = -1``. `names`:
    `vocab.distinct_names` of `events`, when the caller has them; `ordered`: `events` are
    sorted by rank then ts (`intervals.in_time_order`: a `Run`'s are), which spares a sort;
    `launched`: `launches` of `events` and `markers`, when the caller has them; `keys`: their
    `intervals.time_keys`.
    """
    if launched is None:
        launched = launches(events, markers, names=names, ordered=ordered, keys=keys)
    dev = launched.links.lazy().filter(pl.col("kind") != "step")
    main_dev = (
        dev.group_by("rank", "device")
        .len()
        .sort("len", "device", descending=[True, False])
        .group_by("rank")
        .agg(pl.col("device").first().alias("main_device"))
        .collect(engine="in-memory")
    )
    # one device per rank: its rows kept by a lookup, no join (`ranked`)
    on_main = keep_ranked(dev, main_dev.select("rank", device="main_device"), "device")
    cols = ("rank", "ts", "dur", "_launch_step")
    dev_steps = (
        pl.concat(
            [
                on_main.filter(pl.col("_call").is_not_null()).select(cols),
                # a device row without a launch link (JAX, Nsight without runtime rows) falls in the
                # host step it overlaps (only these rows need the as-of join)
                on_main.filter(pl.col("_call").is_null())
                .pipe(_host_step, markers, keys=keys)
                .select(*cols[:-1], _launch_step="_step"),
            ]
        )
        .filter(pl.col("_launch_step").is_not_null())
        .group_by("rank", pl.col("_launch_step").alias("step"))
        .agg(dev_first=pl.col("ts").min(), dev_last=(pl.col("ts") + pl.col("dur")).max())
        .sort("rank", "step")
        .with_columns(
            dev_end=pl.coalesce(pl.col("dev_first").shift(-1).over("rank"), pl.col("dev_last")),
        )
    )
    on = ["_rc"] if "_rc" in launched.calls.columns else ["rank", "correlation"]  # `call_key`'s when it fits
    seen = dev.select(*on).unique()
    lost = (
        launched.calls.lazy()
        .filter(pl.col("_launch"), pl.col("_launch_step").is_not_null())
        .filter(pl.col("rank").is_in(main_dev.get_column("rank").implode()))
        .join(seen, on=on, how="anti")
        .group_by("rank", pl.col("_launch_step").alias("step"))
        .agg(lost=pl.len())
    )
    first = pl.col("step") == pl.col("step").min().over("rank")
    last = pl.col("step") == pl.col("step").max().over("rank")
    out = (
        markers.lazy()
        .join(main_dev.lazy(), on="rank", how="left")
        .join(dev_steps.select("rank", "step", "dev_first", "dev_end"), on=["rank", "step"], how="left")
        .join(lost, on=["rank", "step"], how="left")
        .with_columns(
            device=pl.col("main_device").fill_null(-1).cast(pl.Int16),
            # the window's first and last steps keep the device's wait for the host before and after its work
            start=pl.when(pl.col("main_device").is_null())
            .then(pl.col("host_start"))
            .when(first)
            .then(pl.min_horizontal("host_start", "dev_first"))
            .otherwise(pl.col("dev_first")),
            end=pl.when(pl.col("main_device").is_null())
            .then(pl.col("host_end"))
            .when(last & pl.col("dev_end").is_not_null())
            .then(pl.max_horizontal("host_end", "dev_end"))
            .otherwise(pl.col("dev_end")),
        )
        # a step the device did nothing in but whose start is known (the window's first step: the device
        # waited for the host all along) lasts until the next step's start, so device steps still
        # partition the timeline
        .with_columns(
            end=pl.when(pl.col("start").is_not_null() & pl.col("end").is_null())
            .then(pl.coalesce(pl.col("start").shift(-1).over("rank", order_by="step"), pl.col("host_end")))
            .otherwise(pl.col("end"))
        )
        # device work of nested markers out of order (a loose --step-regex): no span rather than a negative one
        .with_columns(
            start=pl.when(pl.col("end") < pl.col("start")).then(None).otherwise(pl.col("start")),
            end=pl.when(pl.col("end") < pl.col("start")).then(None).otherwise(pl.col("end")),
        )
        .with_columns(
            _dur=pl.col("host_end") - pl.col("host_start"),
            _edge=(pl.col("step") == pl.col("step").min().over("rank"))
            | (pl.col("step") == pl.col("step").max().over("rank")),
        )
        .with_columns(
            _others=pl.col("_dur").filter(~pl.col("_edge")).min().over("rank"),
        )
        .with_columns(
            partial=(
                pl.col("_edge")
                & (
                    (pl.col("_dur") < PARTIAL_SHORT * pl.col("_others")).fill_null(False)
                    | (pl.col("lost").fill_null(0) > 0)
                )
            )
            # no span to analyse: a step the device did nothing in (markers of a loose --step-regex)
            | pl.col("start").is_null()
            | pl.col("end").is_null()
        )
        .select(list(STEP_SPAN_SCHEMA))
        .sort("rank", "step")
        .collect(engine="in-memory")
    )
    return out.cast(STEP_SPAN_SCHEMA)


def assign_steps(
    events: pl.DataFrame,
    spans: pl.DataFrame,
    *,
    ordered: bool = False,
    launched: Launches | None = None,
    keys: TimeKeys | None = None,
) -> pl.DataFrame:
    """Return `events` with ``step`` filled (null outside every step).

    Host rows: the step whose host span contains ``ts``. Device rows: the step of their launch
    (through ``correlation``), else the device step span that contains ``ts``. Only the columns
    that decide the step take part in the joins; the event table's other columns are not copied.
    `ordered`: `events` are sorted by rank then ts (`intervals.in_time_order`), which spares a sort;
    `launched`: `launches` of `events` and the spans' markers, when the caller has them; `keys`:
    their `intervals.time_keys`.
    """
    markers = spans.select("rank", "step", "host_start", "host_end")
    if launched is None:
        launched = launches(events, markers, ordered=ordered, keys=keys)
    lf = events.lazy().select("rank", "device", "ts").with_row_index("_row")
    host = _host_step(
        lf.filter(pl.col("device") == -1).select("_row", "rank", "ts"), markers, ordered=ordered, keys=keys
    )
    dev_span = (
        spans.lazy()
        .filter(pl.col("device") >= 0, pl.col("start").is_not_null())
        .select("rank", pl.col("start").alias("_ds"), pl.col("end").alias("_de"), pl.col("step").alias("_dstep"))
    )
    links = launched.links.lazy().select("_row", "rank", "ts", "_launch_step")
    unlaunched = (  # only the rows with no launch step take the as-of join to the device spans
        links.filter(pl.col("_launch_step").is_null())
        .sort("ts")
        .join_asof(dev_span.sort("_ds"), left_on="ts", right_on="_ds", by="rank", check_sortedness=False)
        .select("_row", _step=pl.when(pl.col("ts") < pl.col("_de")).then(pl.col("_dstep")).cast(pl.Int32))
    )
    launched_rows = links.filter(pl.col("_launch_step").is_not_null()).select(
        "_row", _step=pl.col("_launch_step").cast(pl.Int32)
    )
    if ordered:
        # rows in (rank, ts) order: the as-of join over every row keeps the rows' order, so the host
        # rows' steps come in place (no scatter of 500k values); only the device rows are put back
        in_place = _host_step(lf.select("rank", "device", "ts"), markers, ordered=True, keys=keys).select(
            pl.when(pl.col("device") == -1).then(pl.col("_step")).alias("_step")
        )
        host_steps, *device_parts = pl.collect_all([in_place, launched_rows, unlaunched], engine="in-memory")
        if sum(p.height for p in device_parts) == events.select((pl.col("device") >= 0).sum()).item():
            step = host_steps.get_column("_step")
            for p in device_parts:
                step.scatter(p["_row"], p["_step"])
            return events.with_columns(step.alias("step"))
    parts = pl.collect_all([host.select("_row", "_step"), launched_rows, unlaunched])
    timed = events.select(((pl.col("device") == -1) | (pl.col("device") >= 0)).sum()).item()
    if sum(p.height for p in parts) == timed:
        # each row in at most one part, once: put the steps back by position (no sort of the rows);
        # rows with a null device belong to neither timeline and keep no step
        step = pl.repeat(None, events.height, dtype=pl.Int32, eager=True)
        for p in parts:
            step.scatter(p["_row"], p["_step"])
        return events.with_columns(step.alias("step"))
    # a row found by two parts (a device row with several launch links): its first step that is known
    steps = pl.concat(parts).sort("_row", "_step", nulls_last=True).unique("_row", keep="first", maintain_order=True)
    if steps.height != events.height:
        steps = pl.DataFrame({"_row": pl.int_range(events.height, eager=True, dtype=pl.UInt32)}).join(
            steps, on="_row", how="left", maintain_order="left"
        )
    return events.with_columns(steps["_step"].alias("step"))

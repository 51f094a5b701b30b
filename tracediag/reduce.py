"""`analyze(run) -> Analysis`: where a run waits, from its events to ranked findings.

The façade chains the stages: the map, `derive.per_rank.rank_tables` (each rank's events to its
`RankSummary`: steps, breakdown, collectives, point-to-point, ...), then the one reduce, `reduce`
(every rank's summary and the files' metadata to facts, detectors, what-if prices, packed into the
`analysis.Analysis` contract). The in-memory path, the executors (`tracediag.execute`) and the
per-file split of ``--allow-mixed`` (`reduce_files`) all reduce through it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import COLLECTIVE_SCHEMA, KERNEL_SCHEMA, STEP_SCHEMA, Analysis
from tracediag.api_types import checked
from tracediag.causes import detect_all, price
from tracediag.derive.collectives import (
    align_and_match,
    plausible_matches,
    summarize_instances,
    wait_per_step,
)
from tracediag.derive.kernels import TOP_STORED, by_category, kernel_view
from tracediag.derive.lateness import late_rows
from tracediag.derive.p2p import p2p_pairs, pipeline_groups, stage_neighbours
from tracediag.derive.per_rank import rank_tables
from tracediag.derive.transfers import transfers
from tracediag.detect import Facts, Thresholds
from tracediag.detect import lateness as lateness_detect
from tracediag.detect.pipeline import pipeline_stages
from tracediag.detect.warmup import warmup_steps, without_steps
from tracediag.errors import NoStepsError, TracediagError, capped, one_line, shown
from tracediag.run import Run, RunMeta
from tracediag.same_run import check_problems, check_same_run, run_problems
from tracediag.units import count, noun
from tracediag.whatif import ReplayInputs, graph_of

if TYPE_CHECKING:
    from tracediag.derive.summary import RankSummary


def needs_split(meta: RunMeta, instances: pl.DataFrame) -> bool:
    """Whether collectives must be matched by occurrence within rank sets (`align_and_match(split=...)`): no group
    names in the events and several groups in the run. Public so that every view of a run aligns it alike."""
    named = instances.filter(pl.col("group") != "").height > 0
    rank_sets = {g.ranks for g in meta.process_groups.values() if g.ranks}
    return not named and len(rank_sets) > 1


def _with_windows(late: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """The lateness rows with each rank's window before the instance (`derive.windows`), by the
    instance's own start on the rank."""
    return late.join(windows, on=["rank", "ts"], how="left")


@dataclass(frozen=True, eq=False)
class Derived:
    """The cross-rank facts of a run and what the reduce left out or keeps for later stages."""

    facts: Facts
    """What the detectors read (complete steps on every rank, aligned clocks)."""
    excluded_steps: int
    """Rank-steps left out of `facts` (partial, without device work, or not on every rank)."""
    warnings: tuple[str, ...]
    """One line per kind of thing left out, with its count."""
    replay: ReplayInputs
    """What the what-if replay reads beside `facts`."""
    kernels: pl.DataFrame
    """Every kernel or operator per rank over the kept steps (`derive.kernels.kernel_view`; names and
    categories Categorical: `KERNEL_SCHEMA` once cast)."""
    kernel_categories: pl.DataFrame
    """Per rank, compute / communication / memory over the kept steps (`derive.kernels.by_category`)."""


def derive_facts(run: Run, *, step_regex: str | None = None, link_gbps: float | None = None) -> Derived:
    """The derived per-rank and cross-rank tables of `run` (no run checks, no detectors)."""
    summary = rank_tables(run.events, step_regex=step_regex)
    return facts_from_tables(Handed(summary), run.meta, step_regex=step_regex, link_gbps=link_gbps)


def facts_from_tables(
    summary: RankSummary | Handed, meta: RunMeta, *, step_regex: str | None = None, link_gbps: float | None = None
) -> Derived:
    """The cross-rank part of `derive_facts`: from the summary of every rank (`derive.per_rank.rank_tables`,
    in rank order) to the facts the detectors read. Raises `NoStepsError` when no rank has steps. A `Handed`
    summary's tables are dropped as they are read (the breakdown, spans, collective instances, windows and
    category table once their cross-rank rows are built): not all held under the tables built after them."""
    t = (summary.take() if isinstance(summary, Handed) else summary).tables()
    del summary  # a handed one lives on only in `t`, each table until its last use
    spans = t.pop("spans")
    if not spans.height:
        what = f"no host row matches --step-regex {step_regex!r}" if step_regex else "no ProfilerStep#N markers"
        msg = f"{what} in the traces; pass --step-regex REGEX for other step annotations (NVTX ranges, train)"
        raise NoStepsError(msg)
    per_step = t.pop("breakdown")
    n_ranks = per_step["rank"].n_unique()
    partial = spans.filter("partial").select("rank", "step")
    complete = per_step.join(partial, on=["rank", "step"], how="anti")
    on_all = complete.group_by("step").agg(pl.len()).filter(pl.col("len") == n_ranks)["step"]
    kept = complete.filter(pl.col("step").is_in(on_all.implode()))
    excluded, not_on_all = per_step.height - kept.height, complete.height - kept.height
    del per_step, complete
    # the kernel view first (its sums over the per-step table: the reduce's largest working set), so
    # that the cross-rank tables below are not yet built under it
    kernels = kernel_view(t["kernels"], kept, top=None, strings=False)
    # the detectors read the per-step kernel table's counts and times, not its wall times (58 MB at
    # 16,384 ranks): dropped now, not held under the cross-rank tables
    t["kernels"] = t["kernels"].drop("wall_ns")
    kernel_categories = by_category(kernels, t.pop("kernel_categories"), kept)
    instances = t.pop("instances")
    offsets, matched, refused = align_and_match(instances, split=needs_split(meta, instances), hosts=meta.hosts)
    del instances
    matched, unmatched = plausible_matches(matched)
    waits = wait_per_step(matched)
    kept = kept.join(offsets, on="rank", how="left")
    warnings = [
        f"the ranks that name host {host!r} do not keep one clock (a collective ends on one before it starts on "
        "another): aligned rank by rank"
        for host in refused
    ]
    step = pl.col("step")
    inner = (step > step.min().over("rank")) & (step < step.max().over("rank"))
    no_span = spans.filter(inner & (pl.col("start").is_null() | pl.col("end").is_null())).height
    if partial.height > no_span:
        edge = count(partial.height - no_span, "partial step")
        warnings.append(f"{edge} at the edges of the recorded window left out")
    if no_span:
        warnings.append(f"{count(no_span, 'step')} with no device activity left out (markers around host work only)")
    if unmatched:
        warnings.append(
            f"{count(unmatched, 'collective instance')} could not be matched across the traced ranks (a rank "
            "left before another arrived: different instances or asynchronous enqueue operators); no wait is "
            "counted for them"
        )
    if not_on_all:
        dropped = count(not_on_all, "rank-step")
        warnings.append(f"{dropped} of steps not recorded on every rank left out")
    warnings += overlap_warning(spans, meta) + repeat_warning(spans, meta) + stepless_warning(spans, meta, step_regex)
    del spans, partial
    steps = (
        kept.join(waits, on=["rank", "step"], how="left")
        .with_columns(
            pl.col("start_ns") - pl.col("offset_ns").fill_null(0),
            pl.col("wait_ns").fill_null(0),
            pl.col("late_n").fill_null(0),
            pl.col("coll_n").fill_null(0),
        )
        .sort("rank", "step")
    )
    collectives = summarize_instances(matched).select(list(COLLECTIVE_SCHEMA)).cast(COLLECTIVE_SCHEMA)
    p2p = (
        t["p2p"]
        .join(offsets, on="rank", how="left")
        .with_columns(pl.col("first_send_ns") - pl.col("offset_ns").fill_null(0))
        .drop("offset_ns")
        .filter(pl.col("step").is_in(on_all.implode()))
    )
    pipelines = pipeline_groups(t["p2p_edges"])
    pairs = p2p_pairs(t["replay_sync"], offsets, stage_neighbours(p2p, pipelines), steps)
    facts = Facts(
        steps=steps,
        collectives=collectives,
        p2p=p2p,
        pipelines=pipelines,
        host=t["host"],
        kernel_steps=t["kernels"],
        late=_with_windows(late_rows(matched).filter(pl.col("step").is_in(on_all.implode())), t.pop("windows")),
        link_gbps=link_gbps,
        world_size=meta.world_size,
        transfers=transfers(pairs, matched).filter(pl.col("step").is_in(on_all.implode())),
    )
    replay = ReplayInputs(
        segments=t["replay_segments"], sync=t["replay_sync"], offsets=offsets, matched=matched, pairs=pairs
    )
    return Derived(
        facts=facts,
        excluded_steps=excluded,
        warnings=tuple(warnings),
        replay=replay,
        kernels=kernels,
        kernel_categories=kernel_categories,
    )


@checked
def analyze(
    run: Run,
    *,
    step_regex: str | None = None,
    link_gbps: float | None = None,
    thresholds: Thresholds | None = None,
    allow_mixed: bool = False,
) -> Analysis:
    """Find where `run` waits: per-step breakdown, matched collectives and ranked findings.

    Parameters
    ----------
    run
        From `tracediag.load`.
    step_regex
        Step markers other than ``ProfilerStep#N``: a regex over host row names whose first group is
        the step number (or, without a group, steps are numbered in time order).
    link_gbps
        Peak bus bandwidth of the link in GB/s, to say whether communication saturates it.
    thresholds
        Detector thresholds (`detect.Thresholds`); the documented defaults when None.
    allow_mixed
        Skip the check that the files are ranks of one run (`same_run.check_same_run`).

    Raises
    ------
    TypeError
        An argument of the wrong type (`run` not a `Run`, ...), in one line naming it (`api_types.checked`).
    MixedRunError
        The files are not ranks of one run (world sizes, devices, backends, time spans, collectives).
    NoStepsError
        The traces hold no step markers.
    ValueError
        `link_gbps` is not a finite number above 0, or `step_regex` is not a valid pattern.
    """
    return analyze_files(
        run, step_regex=step_regex, link_gbps=link_gbps, thresholds=thresholds, allow_mixed=allow_mixed
    )[0][1]


def analyze_files(
    run: Run,
    *,
    step_regex: str | None = None,
    link_gbps: float | None = None,
    thresholds: Thresholds | None = None,
    allow_mixed: bool = False,
    per_file: bool = False,
) -> list[tuple[str, Analysis]]:
    """`analyze`, or with `per_file` (``--allow-mixed``) one analysis per file when the files are
    not ranks of one run: `reduce_files` of the run's `RankSummary`. Raises as `analyze`."""
    check_link_gbps(link_gbps)
    extents = None if allow_mixed or per_file else check_same_run(run)  # refused before the per-rank work
    return reduce_files(
        Handed(rank_tables(run.events, step_regex=step_regex, extents=extents)),
        run.meta,
        step_regex=step_regex,
        link_gbps=link_gbps,
        thresholds=thresholds,
        allow_mixed=True,  # checked above, or each file on its own
        per_file=per_file,
    )


def check_link_gbps(link_gbps: float | None) -> None:
    """Raise ValueError unless `link_gbps` is None or a finite number of GB/s above 0."""
    if link_gbps is not None and not (isinstance(link_gbps, (int, float)) and 0 < link_gbps < math.inf):
        msg = f"link_gbps must be a finite number of GB/s above 0, got {link_gbps!r}"
        raise ValueError(msg)


def reduce_files(
    summary: RankSummary | Handed,
    meta: RunMeta,
    *,
    step_regex: str | None = None,
    link_gbps: float | None = None,
    thresholds: Thresholds | None = None,
    allow_mixed: bool = False,
    per_file: bool = False,
) -> list[tuple[str, Analysis]]:
    """``[("", analysis)]`` of the run, by `reduce`; or, with `per_file`, when the files are not
    ranks of one run (`same_run.run_problems` of the metadata and the summary's ``extents``), one
    ``(path, analysis)`` per file, each reduced from its rank's summary alone, in rank order. An
    error of one file names it. Raises `MixedRunError` for mixed files unless `allow_mixed` or
    `per_file`."""
    kw = {"step_regex": step_regex, "link_gbps": link_gbps, "thresholds": thresholds}
    whole = summary.summary if isinstance(summary, Handed) else summary
    if whole is None or not (per_file and run_problems(meta, whole.extents)):
        del whole
        return [("", reduce(summary, meta, allow_mixed=allow_mixed or per_file, **kw))]
    summary = summary.take() if isinstance(summary, Handed) else summary
    out = []
    for f in sorted(meta.files, key=lambda f: f.rank):
        try:
            out.append((f.path, reduce(summary.only_rank(f.rank), RunMeta(files=(f,)), allow_mixed=True, **kw)))
        except TracediagError as e:
            msg = f"{shown(f.path)}: {e}"
            raise TracediagError(msg) from None
    return out


def _path_of(meta: RunMeta, rank: int) -> str:
    """` (FILE)` of `rank`'s file, for a warning about the rank ("" when the metadata names none)."""
    path = next((f.path for f in meta.files if f.rank == rank), None)
    return f" ({shown(path)})" if path else ""


def stepless_warning(spans: pl.DataFrame, meta: RunMeta, step_regex: str | None) -> tuple[str, ...]:
    """One line naming the ranks read whose traces hold no step marker: they are in no step, so the analysis
    leaves them out, and without this line it would count them traced yet call them "possibly untraced"."""
    stepless = sorted(set(meta.ranks) - set(spans.get_column("rank").to_list()))
    if not stepless:
        return ()
    what = f"no host row matching --step-regex {step_regex!r}" if step_regex else "no ProfilerStep#N marker"
    first = f"rank {stepless[0]}{_path_of(meta, stepless[0])}"
    more = f" and {count(len(stepless) - 1, 'more rank')}" if len(stepless) > 1 else ""
    return (f"{first}{more}: {what}, so in no step: left out of the analysis",)


def repeat_warning(spans: pl.DataFrame, meta: RunMeta) -> tuple[str, ...]:
    """One line counting the step markers left out because an earlier or longer one has their step number
    (`derive.steps.find_markers` keeps one per rank and step), with the first rank's file."""
    repeated = spans.filter(pl.col("repeats") > 0)
    if not repeated.height:
        return ()
    n = int(repeated.get_column("repeats").sum())
    first = repeated.row(0, named=True)
    return (
        f"{count(n, 'step marker')} {'repeats' if n == 1 else 'repeat'} the number of another of its rank "
        f"(first: step {first['step']} of rank {first['rank']}{_path_of(meta, first['rank'])}): the longest kept",
    )


def overlap_warning(spans: pl.DataFrame, meta: RunMeta) -> tuple[str, ...]:
    """One line counting the step markers that overlapped the next one and were cut where it begins
    (`derive.steps.find_markers`), with the largest and its rank's file: time is then counted once, but
    the traces say a step began before the last one ended (a damaged or merged trace, a loose --step-regex)."""
    clipped = spans.filter(pl.col("clipped_ns") > 0)
    if not clipped.height:
        return ()
    worst = clipped.sort("clipped_ns", descending=True).row(0, named=True)
    where = _path_of(meta, worst["rank"])
    return (
        f"{count(clipped.height, 'step marker')} {'overlaps' if clipped.height == 1 else 'overlap'} the next step's, "
        f"cut where it begins: the most, step {worst['step']} of rank {worst['rank']}{where} by "
        f"{worst['clipped_ns'] / 1e6:.3f} ms",
    )


FILE_WARNINGS_SHOWN = 5
"""Distinct reader warnings `file_warnings` writes out, one line each; the rest are counted in one more."""


def file_warnings(meta: RunMeta) -> tuple[str, ...]:
    """What the readers warned of per file (a file cut short, ids read as one thread, relative times), one
    line per distinct warning naming its first file and how many more have it: `ingest` lists the first
    file by file, and an analysis must not drop them unsaid."""
    by_text: dict[str, list[str]] = {}
    for f in meta.files:
        for w in f.warnings:
            by_text.setdefault(one_line(w), []).append(f.path)
    lines = []
    for text, paths in list(by_text.items())[:FILE_WARNINGS_SHOWN]:
        more = f" and {count(len(paths) - 1, 'more file')}" if len(paths) > 1 else ""
        lines.append(f"{shown(paths[0])}{more}: {text}")
    if len(by_text) > FILE_WARNINGS_SHOWN:
        rest = len(by_text) - FILE_WARNINGS_SHOWN
        lines.append(f"{count(rest, 'other reader warning')} (`tracediag.load(...).meta.files` holds every file's)")
    return tuple(lines)


MALFORMED_QUIET = 1
"""Malformed events a file may hold without a warning: every real trace of fixtures/ and shared/ holds at
most one (JAX's closing empty event `{}`, Nsight's range without an end); more is damage that the analysis
must not read past unsaid (a rank's operators whose `dur` is a string or negative read as no compute)."""


def malformed_warning(meta: RunMeta) -> tuple[str, ...]:
    """One line naming the file that lost the most events as malformed (no usable `ts` or `dur`: absent, not
    a number, negative, out of range; `schema.conform`), with how many more files lost some: `ingest` counts
    them per file, but without this line an analysis would judge a rank on what was left of it unsaid."""
    lost = sorted(
        ((f.skipped.get("malformed", 0), f) for f in meta.files if f.skipped.get("malformed", 0) > MALFORMED_QUIET),
        key=lambda pair: -pair[0],
    )
    if not lost:
        return ()
    n, worst = lost[0]
    more = ""
    if len(lost) > 1:
        rest = sum(k for k, _ in lost[1:])
        more = f"; {count(len(lost) - 1, 'more file')} lost {count(rest, 'event')} so"
    return (
        f"rank {worst.rank} ({shown(worst.path)}): {n:,} of its {worst.events_in:,} events malformed (ts or dur "
        f"absent, not a number, negative or out of range) and left out{more}: its numbers are read without them",
    )


def ignored_warning(meta: RunMeta) -> tuple[str, ...]:
    """One line counting the files found in the input directories that are not traces (a manifest, a
    README), with the first and its reason: skipped, never dropped without a word."""
    if not meta.ignored:
        return ()
    more = f" and {len(meta.ignored) - 1} more" if len(meta.ignored) > 1 else ""
    return (f"{count(len(meta.ignored), 'file')} in the directories ignored (not traces: {meta.ignored[0]}{more})",)


def untraced_warning(meta: RunMeta) -> tuple[str, ...]:
    """One line naming the ranks of the stated world size that have no trace (none when every rank has one):
    who waits for whom is then judged among the traced ranks only."""
    present = set(meta.ranks)
    missing = [r for r in range(meta.world_size) if r not in present]
    if not missing or not present:
        return ()
    shown = ", ".join(map(str, missing[:16])) + (f" (+{len(missing) - 16})" if len(missing) > 16 else "")
    return (
        f"{count(len(missing), 'rank')} of world size {meta.world_size} {'has' if len(missing) == 1 else 'have'} no "
        f"trace ({shown}): waits are judged among the {len(present)} traced; a rank they wait for may be untraced",
    )


@dataclass(eq=False)
class Handed:
    """A summary its caller gives up to the reduce (`reduce`, `reduce_files`): the caller keeps no other
    reference, so each table is dropped once the reduce has read it (the per-step kernel table after the
    detectors, the replay's per-rank tables once the replay graph is built). At 16,384 ranks that is
    what the driver's peak is not: the whole summary under the what-if replay's own tables."""

    summary: RankSummary | None

    def peek(self) -> RankSummary:
        """The summary, still held here (raises when already taken)."""
        if self.summary is None:
            msg = "this summary was already reduced"
            raise ValueError(msg)
        return self.summary

    def take(self) -> RankSummary:
        """The summary, the only reference to it now the caller's (raises when already taken)."""
        summary, self.summary = self.peek(), None
        return summary


def reduce(
    summary: RankSummary | Handed,
    meta: RunMeta,
    *,
    step_regex: str | None = None,
    link_gbps: float | None = None,
    thresholds: Thresholds | None = None,
    allow_mixed: bool = False,
) -> Analysis:
    """`analyze` from the summary of every rank (`derive.per_rank.rank_tables`, in rank order) and
    the files' metadata: the one cross-rank half, in memory and on the driver when ranks are
    summarised where they lie (`tracediag.execute`). The run checks (`same_run.run_problems`) read
    the metadata and the summary's ``extents``, unless `allow_mixed`. Findings are priced by the
    what-if replay from the summary's replay tables. A `Handed` summary is freed as it is read."""
    handed = summary if isinstance(summary, Handed) else Handed(summary)
    del summary  # a handed one lives on only in `handed`, then in what the reduce still reads
    extents = handed.peek().extents
    if not allow_mixed:
        check_problems(meta, run_problems(meta, extents))
    ranks = tuple(meta.ranks) or tuple(sorted(extents["rank"].to_list()))
    del extents
    derived = facts_from_tables(handed, meta, step_regex=step_regex, link_gbps=link_gbps)
    facts, replay, kernels = derived.facts, derived.replay, derived.kernels
    th = thresholds or Thresholds()
    warmup = warmup_steps(facts.steps, th)
    diagnosed = without_steps(facts, warmup)
    late = lateness_detect.assess(diagnosed, th)
    findings = detect_all(diagnosed, thresholds=th)
    # the per-step kernel table, the lateness rows and the host table are the detectors' alone (the
    # kernel table their largest input): not kept under the replay
    facts, diagnosed = (dataclasses.replace(f, kernel_steps=None, late=None, host=None) for f in (facts, diagnosed))
    excluded, categories, warnings = derived.excluded_steps, derived.kernel_categories, derived.warnings
    del derived
    # only the rows stored are kept under the replay (as Categorical until the end: no string a row)
    kernels = kernels.group_by("rank", maintain_order=True).head(TOP_STORED) if kernels.height else None
    if warmup:
        warnings += (
            f"{noun(len(warmup), 'step')} {', '.join(map(str, warmup))} {'is' if len(warmup) == 1 else 'are'} "
            f"warm-up (every rank at least {th.warmup_ratio}x its later steps, its waits for peers left out): "
            "shown, left out of the diagnosis",
        )
    warnings += untraced_warning(meta) + ignored_warning(meta) + malformed_warning(meta) + file_warnings(meta)
    graph = graph_of(diagnosed, replay)
    del replay
    # priced on the steps the diagnosis read (warm-up left out), as every what-if in the output
    findings, whatif = price(findings, diagnosed, graph, thresholds=th)
    del graph
    return Analysis(
        ranks=ranks,
        world_size=meta.world_size,
        steps=facts.steps.with_columns(pl.min_horizontal("wait_ns", "exposed_comm_ns").alias("wait_ns"))
        .select(list(STEP_SCHEMA))
        .cast(STEP_SCHEMA),
        collectives=facts.collectives,
        findings=findings,
        excluded_steps=excluded,
        warnings=tuple(capped(meta.errors)) + warnings,
        pipelines=tuple(pipeline_stages(facts)),
        whatif=whatif,
        kernels=kernels.cast(KERNEL_SCHEMA) if kernels is not None else None,
        kernel_categories=categories if kernels is not None else None,
        lateness=late,
    )

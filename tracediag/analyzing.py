"""`analyze(run) -> Analysis`: where a run waits, from its events to ranked findings.

The façade chains the stages: derive (steps → breakdown → collectives → point-to-point), then the
detectors, and packs the result into the `analysis.Analysis` contract.
"""

from __future__ import annotations

import math

import polars as pl

from tracediag.analysis import COLLECTIVE_SCHEMA, STEP_SCHEMA, Analysis
from tracediag.causes import detect_all, price
from tracediag.derive.collectives import align_and_match, plausible_matches, summarize_instances, wait_per_step
from tracediag.derive.kernels import TOP_STORED, by_category, kernel_view
from tracediag.derive.lateness import late_rows
from tracediag.derive.p2p import pipeline_groups
from tracediag.derive.per_rank import rank_tables
from tracediag.detect import Facts, Thresholds
from tracediag.detect import lateness as lateness_detect
from tracediag.detect.pipeline import pipeline_stages
from tracediag.detect.warmup import warmup_steps, without_steps
from tracediag.errors import NoStepsError
from tracediag.run import Run, RunMeta
from tracediag.sanity import check_problems, check_same_run, run_problems
from tracediag.whatif import graph_of
from tracediag.words import count, noun


def _needs_split(meta: RunMeta, instances: pl.DataFrame) -> bool:
    """Occurrence matching may mix groups: no group names in the events, several groups in the run."""
    named = instances.filter(pl.col("group") != "").height > 0
    rank_sets = {g.ranks for g in meta.process_groups.values() if g.ranks}
    return not named and len(rank_sets) > 1


def _with_windows(late: pl.DataFrame, windows: pl.DataFrame | None) -> pl.DataFrame:
    """The lateness rows with each rank's window before the instance (`derive.windows`), by the
    instance's own start on the rank."""
    if windows is None:
        return late
    return late.join(windows, on=["rank", "ts"], how="left")


def derive_facts(run: Run, *, step_regex: str | None = None, link_gbps: float | None = None) -> tuple[Facts, dict]:
    """The derived per-rank and cross-rank tables, plus what was left out (``excluded_steps``,
    ``warnings``)."""
    tables = rank_tables(run.events, step_regex=step_regex)
    return facts_from_tables(tables, run.meta, step_regex=step_regex, link_gbps=link_gbps)


def facts_from_tables(
    tables: dict[str, pl.DataFrame], meta: RunMeta, *, step_regex: str | None = None, link_gbps: float | None = None
) -> tuple[Facts, dict]:
    """The cross-rank part of `derive_facts`: from the per-rank tables (`derive.per_rank.rank_tables`
    of all ranks, in rank order) to the facts the detectors read."""
    spans = tables["spans"]
    if not spans.height:
        what = f"no host row matches --step-regex {step_regex!r}" if step_regex else "no ProfilerStep#N markers"
        msg = f"{what} in the traces; pass --step-regex REGEX for other step annotations (NVTX ranges, train)"
        raise NoStepsError(msg)
    instances = tables["instances"]
    offsets, matched = align_and_match(instances, split=_needs_split(meta, instances))
    matched, unmatched = plausible_matches(matched)
    waits = wait_per_step(matched)
    per_step = tables["breakdown"].join(offsets, on="rank", how="left")
    n_ranks = per_step["rank"].n_unique()
    partial = spans.filter("partial").select("rank", "step")
    complete = per_step.join(partial, on=["rank", "step"], how="anti")
    on_all = complete.group_by("step").agg(pl.len()).filter(pl.col("len") == n_ranks)["step"]
    kept = complete.filter(pl.col("step").is_in(on_all.implode()))
    excluded = per_step.height - kept.height
    warnings = []
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
    if complete.height - kept.height:
        dropped = count(complete.height - kept.height, "rank-step")
        warnings.append(f"{dropped} of steps not recorded on every rank left out")
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
    facts = Facts(
        steps=steps,
        collectives=collectives,
        p2p=tables["p2p"]
        .join(offsets, on="rank", how="left")
        .with_columns(pl.col("first_send_ns") - pl.col("offset_ns").fill_null(0))
        .drop("offset_ns")
        .filter(pl.col("step").is_in(on_all.implode())),
        pipelines=pipeline_groups(tables["p2p_edges"]),
        host=tables["host"],
        kernel_steps=tables["kernels"],
        late=_with_windows(late_rows(matched).filter(pl.col("step").is_in(on_all.implode())), tables.get("windows")),
        link_gbps=link_gbps,
        world_size=meta.world_size,
    )
    replay_inputs = {
        "segments": tables["replay_segments"],
        "sync": tables["replay_sync"],
        "offsets": offsets,
        "matched": matched,
    }
    kernels = kernel_view(tables["kernels"], steps, top=None)
    return facts, {
        "excluded_steps": excluded,
        "warnings": tuple(warnings),
        "replay": replay_inputs,
        "kernels": kernels,
    }


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
        Skip the check that the files are ranks of one run (`sanity.check_same_run`).

    Raises
    ------
    MixedRunError
        The files are not ranks of one run (world sizes, devices, backends, time spans, collectives).
    NoStepsError
        The traces hold no step markers.
    ValueError
        `link_gbps` is not a finite number above 0, or `step_regex` is not a valid pattern.
    """
    if link_gbps is not None and not (isinstance(link_gbps, (int, float)) and 0 < link_gbps < math.inf):
        raise ValueError(f"link_gbps must be a finite number of GB/s above 0, got {link_gbps!r}")
    extents = None if allow_mixed else check_same_run(run)
    tables = rank_tables(run.events, step_regex=step_regex, extents=extents)
    ranks = tuple(run.meta.ranks) or tuple(sorted(run.events["rank"].unique().to_list()))
    return analyze_tables(
        tables,
        run.meta,
        ranks=ranks,
        step_regex=step_regex,
        link_gbps=link_gbps,
        thresholds=thresholds,
        allow_mixed=True,  # checked above, before the per-rank tables
    )


def analyze_tables(
    tables: dict[str, pl.DataFrame],
    meta: RunMeta,
    *,
    ranks: tuple[int, ...] | None = None,
    step_regex: str | None = None,
    link_gbps: float | None = None,
    thresholds: Thresholds | None = None,
    allow_mixed: bool = False,
) -> Analysis:
    """`analyze` from the per-rank tables of every rank (`derive.per_rank.rank_tables`, in rank
    order) and the files' metadata: the driver's half when ranks are summarised where they lie
    (`tracediag.execute`). `ranks` defaults to the ranks `meta` lists. The run checks
    (`sanity.run_problems`) read the metadata and the per-rank ``extents``, unless `allow_mixed`.
    Findings are priced by the what-if replay from the per-rank replay tables, as in memory."""
    if not allow_mixed:
        check_problems(meta, run_problems(meta, tables["extents"]))
    facts, left_out = facts_from_tables(tables, meta, step_regex=step_regex, link_gbps=link_gbps)
    th = thresholds or Thresholds()
    warmup = warmup_steps(facts.steps, th)
    diagnosed = without_steps(facts, warmup)
    late = lateness_detect.assess(diagnosed, th)
    findings = detect_all(diagnosed, thresholds=th)
    warnings = left_out["warnings"]
    if warmup:
        warnings += (
            f"{noun(len(warmup), 'step')} {', '.join(map(str, warmup))} {'is' if len(warmup) == 1 else 'are'} "
            f"warm-up (every rank at least {th.warmup_ratio}x its later steps, its waits for peers left out): "
            "shown, left out of the diagnosis",
        )
    # priced on the steps the diagnosis read (warm-up left out), as every what-if in the output
    findings, whatif = price(findings, diagnosed, graph_of(diagnosed, **left_out["replay"]), thresholds=th)
    kernels = left_out["kernels"]
    return Analysis(
        ranks=ranks if ranks is not None else tuple(meta.ranks),
        world_size=meta.world_size,
        steps=facts.steps.with_columns(pl.min_horizontal("wait_ns", "exposed_comm_ns").alias("wait_ns"))
        .select(list(STEP_SCHEMA))
        .cast(STEP_SCHEMA),
        collectives=facts.collectives,
        findings=findings,
        excluded_steps=left_out["excluded_steps"],
        warnings=tuple(meta.errors) + warnings,
        pipelines=tuple(pipeline_stages(facts)),
        whatif=whatif,
        kernels=kernels.group_by("rank", maintain_order=True).head(TOP_STORED) if kernels.height else None,
        kernel_categories=by_category(kernels) if kernels.height else None,
        lateness=late,
    )

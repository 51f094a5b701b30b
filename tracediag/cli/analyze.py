"""`tracediag analyze`: where a run's slow steps wait, as text or versioned JSON, with CI gating."""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tracediag.cli import collection_paused
from tracediag.cli.check_options import add_check, check_options, finish_report
from tracediag.cli.common import EXIT_FINDING, FilePath, InputError
from tracediag.cli.execute_options import (
    EXECUTOR_KEYS,
    executor_options,
    refuse_overwrite,
    refuse_without_executor,
    report_failed,
    run_summaries,
    storage_options,
    summarize_kw,
)
from tracediag.cli.export import perfetto_options, write_trace
from tracediag.cli.traces import (
    exit_if_missing,
    parse_rank_map,
    reading_progress,
    report_read_errors,
    trace_options,
)
from tracediag.errors import TracediagError, shown

if TYPE_CHECKING:
    from tracediag.analysis import Analysis
    from tracediag.run import Run


def _with_checks(results: list[tuple[str, Analysis]], run: Run | None, check_kw: dict) -> list[tuple[str, Analysis]]:
    """Each analysis with its check (`--plan`/`--model`), against its own file's run in memory."""
    from tracediag.same_run import split_by_file

    runs = dict(split_by_file(run)) if run is not None and any(p for p, _ in results) else {}
    return [(p, add_check(r, runs.get(p, run), check_kw)) for p, r in results]


def _sources_kw(
    paths: tuple[str, ...], ex_kw: dict[str, Any], outputs: dict[str, Any], more_inputs: tuple, **trace_kw: Any
) -> tuple[dict[str, Any], int]:
    """`analyze_sources` keywords from the trace and executor options (an output naming an input
    refused), and how many trace files the paths name."""
    jobs, rank_from_filename, rank_map = trace_kw["jobs"], trace_kw["rank_from_filename"], trace_kw["rank_map"]
    if ex_kw["executor"]:
        files = refuse_overwrite(paths, outputs, more_inputs, ex_kw)
        kw = summarize_kw(ex_kw, jobs=jobs, rank_from_filename=rank_from_filename, rank_map=rank_map)
        kw["jobs"] = kw.pop("workers")
        return {**kw, "out": ex_kw["out_dir"], "comm_kernel": trace_kw["comm_kernel"]}, len(files)
    files = refuse_overwrite(paths, outputs, more_inputs, {**ex_kw, "out_dir": None})
    kw = {
        "jobs": jobs,
        "rank_from_filename": rank_from_filename,
        "rank_map": parse_rank_map(rank_map),
        "storage_options": storage_options(ex_kw["storage_options"]),
        "comm_kernel": trace_kw["comm_kernel"],
        "on_read": report_read_errors,
    }
    return kw, len(files)


def _causes(value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    from tracediag.analysis import CAUSES

    causes = tuple(c.strip() for c in value.split(",") if c.strip())
    bad = [c for c in causes if c not in CAUSES]
    if bad:
        msg = f"unknown cause {bad[0]!r}; one of {', '.join(CAUSES)}"
        raise click.BadParameter(msg, param_hint="--fail-on")
    return causes


def _link(value: str | None) -> float | None:
    if value is None:
        return None
    from tracediag.model.specs import parse_link

    try:
        gbps = parse_link(value).bandwidth_gbps
    except (TracediagError, ValueError, OverflowError) as e:
        # the message and its hint (the presets) on one line
        raise click.BadParameter(" ".join(str(e).replace("Hint:", "-").split()), param_hint="--link-gbps") from None
    if not (math.isfinite(gbps) and gbps > 0):
        msg = f"{value!r}: a bandwidth is a finite number of GB/s above 0"
        raise click.BadParameter(msg, param_hint="--link-gbps")
    return gbps


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("-o", "--output", type=FilePath(dir_okay=False), help="Write the report to this file.")
@click.option(
    "--fail-on",
    metavar="CAUSE[,CAUSE]",
    help=f"Exit {EXIT_FINDING} when a finding of these causes exists (not one that costs nothing measurable).",
)
@click.option("--step-regex", metavar="REGEX", help=r"Step markers other than ProfilerStep#N, e.g. '^step (\d+)$'.")
@click.option(
    "--link-gbps",
    metavar="GBPS|PRESET",
    help="Peak bus bandwidth of the link in GB/s, or a link preset (nvlink4, ib-ndr, ...).",
)
@click.option(
    "--kernels",
    "kernels_top",
    type=click.IntRange(min=0),
    default=0,
    metavar="N",
    help="Also list each rank's top N kernels/operators by total time (text; JSON always has them).",
)
@click.option(
    "--allow-mixed",
    is_flag=True,
    help="Files that are not ranks of one run: analyse each on its own instead of refusing them.",
)
@click.option(
    "--perfetto",
    "perfetto_path",
    type=FilePath(dir_okay=False),
    help="Also write every rank's timeline with the analysis drawn on it, for ui.perfetto.dev (docs/perfetto.md).",
)
@perfetto_options
@trace_options
@executor_options
@check_options
def analyze(
    paths: tuple[str, ...],
    fmt: str,
    output: str | None,
    fail_on: str | None,
    step_regex: str | None,
    link_gbps: str | None,
    allow_mixed: bool,
    kernels_top: int,
    jobs: int,
    rank_from_filename: str | None,
    rank_map: tuple[str, ...],
    comm_kernel: str | None,
    perfetto_path: str | None,
    export_ranks: tuple[int, ...] | None,
    max_events: int,
    **check_kw: Any,
) -> None:
    """Name the cause of slow steps in trace files, globs, directories or an ingest Parquet."""
    with collection_paused():
        from tracediag.execute.driver import analyze_sources
        from tracediag.output import write_atomic
        from tracediag.report.analyses import analyses_json, analyses_text, write_analyses_json

    gate = _causes(fail_on)
    peak = _link(link_gbps)
    html = check_kw.get("html_path")
    if output is not None and html is not None and os.path.realpath(output) == os.path.realpath(html):
        msg = f"{shown(output)}: -o and --html name the same file"
        raise InputError(msg)
    ex_kw = {k: check_kw.pop(k) for k in EXECUTOR_KEYS}
    refuse_without_executor(ex_kw)
    if perfetto_path is not None and ex_kw["executor"]:
        msg = "--perfetto reads the events here: not with --executor (run tracediag export on the traces)"
        raise InputError(msg)
    kw, n_files = _sources_kw(
        paths,
        ex_kw,
        {"-o": output, "--html": html, "--perfetto": perfetto_path},
        (check_kw.get("plan_path"),),
        jobs=jobs,
        rank_from_filename=rank_from_filename,
        rank_map=rank_map,
        comm_kernel=comm_kernel,
    )
    if not ex_kw["executor"]:  # what draws the events or checks a model reads them here; else only summaries
        checked = any(check_kw.get(k) is not None for k in ("plan_path", "model_name", "layers"))
        kw["events"] = perfetto_path is not None or html is not None or checked
    with reading_progress(0 if ex_kw["executor"] else n_files) as on_file_done:
        analysed = run_summaries(
            analyze_sources, paths, step_regex=step_regex, link_gbps=peak, per_file=allow_mixed,
            on_file_done=on_file_done, **kw,
        )  # fmt: skip
    results = _with_checks(analysed.results, analysed.run, check_kw)
    if output:
        if fmt == "json":  # written a slice of rows at a time, never held whole
            data = functools.partial(write_analyses_json, results)
        else:
            data = (analyses_text(results, kernels_top=kernels_top) + "\n").encode()
        try:
            write_atomic(output, data)
        except TracediagError as e:
            raise InputError(str(e)) from None
        del data
    else:
        click.echo(analyses_json(results) if fmt == "json" else analyses_text(results, kernels_top=kernels_top))
    for i, (p, r) in enumerate(results):
        kw = check_kw
        if p and check_kw.get("html_path") is not None:
            html = Path(check_kw["html_path"])
            kw = {**check_kw, "html_path": html.with_name(f"{html.stem}.{i}{html.suffix}")}
        finish_report(r, kw, run=analysed.run if len(results) == 1 else None, step_regex=step_regex)
    if perfetto_path is not None:
        if len(results) != 1 or analysed.run is None:
            msg = "--perfetto draws one run; these files are analysed each on its own (--allow-mixed)"
            raise InputError(msg)
        write_trace(
            perfetto_path, analysed.run, results[0][1], ranks=export_ranks, max_events=max_events, step_regex=step_regex
        )
    if ex_kw["executor"]:
        report_failed(analysed.failed, ex_kw["allow_missing"])
    else:  # named on stderr as they were read (`report_read_errors`)
        exit_if_missing(analysed.failed, ex_kw["allow_missing"])
    # a finding that costs nothing measurable is reported, not gated on
    if gate and any(f.cause in gate and f.measurable for _, r in results for f in r.findings):
        raise SystemExit(EXIT_FINDING)

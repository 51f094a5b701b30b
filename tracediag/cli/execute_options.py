"""`--executor` and its options for `analyze` and `ingest`: per-rank work on a process pool, Ray or Dask."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from tracediag.cli.common import FilePath, InputError
from tracediag.cli.traces import ALLOW_MISSING_HELP, exit_if_missing, parse_rank_map
from tracediag.errors import TracediagError, capped, shown
from tracediag.execute.base import EXECUTORS, EngineMissing

EXECUTOR_KEYS = (
    "executor", "address", "scheduler_file", "out_dir", "storage_options", "resume", "retries", "allow_missing",
)  # fmt: skip
"""The keyword names `executor_options` adds to a command."""


def executor_options(f):
    """The options of the summary path (`tracediag.execute`); without --executor the run is loaded whole."""
    options = [
        click.option(
            "--executor",
            type=click.Choice(EXECUTORS),
            envvar="TRACEDIAG_EXECUTOR",
            help="Summarise each rank where the workers are (a process pool, Ray or Dask); only summaries "
            "reach this process. Default: read all ranks into this process.",
        ),
        click.option(
            "--address",
            metavar="ADDR",
            help="Cluster to attach to (default: RAY_ADDRESS or DASK_SCHEDULER_ADDRESS; else a local cluster).",
        ),
        click.option(
            "--scheduler-file",
            metavar="PATH",
            type=FilePath(dir_okay=False),
            help="Dask scheduler file (`dask scheduler --scheduler-file`).",
        ),
        click.option(
            "--out",
            "out_dir",
            metavar="DIR|URL",
            help="Where the per-rank summaries go (a directory or s3://, gs://, az:// URL); "
            "workers of a cluster must reach it. analyze: a temporary directory when omitted.",
        ),
        click.option(
            "--storage-option",
            "storage_options",
            multiple=True,
            metavar="KEY=VALUE",
            help="Object-store option for input URLs and --out, in polars' names (e.g. aws_region=eu-west-1, "
            "aws_endpoint_url=URL); repeatable. Default: the store's environment (AWS_*, GOOGLE_*, AZURE_*).",
        ),
        click.option("--resume", is_flag=True, help="Skip files a previous run into --out finished."),
        click.option("--retries", type=click.IntRange(0), default=2, show_default=True, help="Retries per file."),
        click.option("--allow-missing", is_flag=True, help=ALLOW_MISSING_HELP),
    ]
    for option in reversed(options):
        f = option(f)
    return f


_EXECUTOR_ONLY = {"address": "--address", "scheduler_file": "--scheduler-file", "out_dir": "--out",
                  "resume": "--resume", "retries": "--retries"}  # fmt: skip


def refuse_without_executor(kw: dict[str, Any]) -> None:
    """`click.UsageError` (exit 2) for an option of the summary path given without --executor: the run is
    read into this process then, and the option would be ignored without a word."""
    if kw["executor"]:
        return
    ctx = click.get_current_context(silent=True)
    given = [
        flag
        for key, flag in _EXECUTOR_ONLY.items()
        if ctx is not None and ctx.get_parameter_source(key) is click.core.ParameterSource.COMMANDLINE
    ]
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        msg = f"{', '.join(given)} {verb} to the summary path: add --executor local (or ray, dask)"
        raise click.UsageError(msg)


def storage_options(items: tuple[str, ...]) -> dict[str, str] | None:
    """`--storage-option KEY=VALUE` items as a mapping (None when none is given)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            msg = f"{item!r} is not KEY=VALUE"
            raise click.BadParameter(msg, param_hint="--storage-option")
        out[key] = value
    return out or None


def _attaches(kw: dict[str, Any]) -> bool:
    """Whether the executor attaches to a cluster (its workers may not see this machine's disk)."""
    if kw["address"] or kw["scheduler_file"]:
        return True
    env = {"ray": ("RAY_ADDRESS",), "dask": ("DASK_SCHEDULER_ADDRESS", "NSYS_DASK_SCHEDULER_FILE")}
    return any(os.environ.get(name) for name in env.get(kw["executor"], ()))


def summarize_kw(
    kw: dict[str, Any], *, jobs: int, rank_from_filename: str | None, rank_map: tuple[str, ...]
) -> dict[str, Any]:
    """`execute.driver.summarize` arguments from the command's options."""
    if _attaches(kw) and not kw["out_dir"]:
        msg = "a cluster's workers write where the driver reads: give --out on storage both reach"
        raise InputError(msg)
    if kw["out_dir"]:
        _refuse_file_out(kw["out_dir"])
    return {
        "executor": kw["executor"],
        "workers": jobs,
        "retries": kw["retries"],
        "address": kw["address"],
        "scheduler_file": kw["scheduler_file"],
        "resume": kw["resume"],
        "rank_from_filename": rank_from_filename,
        "rank_map": parse_rank_map(rank_map),
        "storage_options": storage_options(kw["storage_options"]),
        "progress": True,
    }


def _refuse_file_out(out: str) -> None:
    """`InputError` when a local `--out`, or the nearest of its folders that exists, is not a directory
    (a file there: the summaries could not be written under it)."""
    from tracediag.ingest.remote import is_remote

    if is_remote(out) and not out.startswith("file://"):
        return
    place = Path(out.removeprefix("file://"))
    while not place.exists() and place != place.parent:
        place = place.parent
    if place.exists() and not place.is_dir():
        what = "is a file" if place.is_file() else "is not a directory"
        where = "" if place == Path(out.removeprefix("file://")) else f" ({shown(place)} {what})"
        msg = f"{shown(out)}: --out must name a directory{where or ' (it ' + what + ')'}"
        raise InputError(msg)


def run_summaries(fn, *args: Any, **kw: Any) -> Any:
    """Call `fn` (`summarize` or `analyze_ranks`), bad input and a missing engine as one line (exit 2)."""
    try:
        return fn(*args, **kw)
    except (TracediagError, ValueError, EngineMissing) as e:
        raise InputError(str(e).replace("\n", "\nError: ")) from None


def refuse_overwrite(
    paths: tuple[str, ...],
    outputs: dict[str, str | None],
    more_inputs: tuple[str | None, ...] = (),
    kw: dict[str, Any] | None = None,
) -> list[str]:
    """Refuse (exit 2) an output that names an input, as `ingest.load_traces` does for the in-memory
    path, and (from the executor options `kw`) an input where the summaries go under ``--out``.
    Returns the trace files `paths` name."""
    from tracediag.output import refuse_inputs, refuse_inputs_under
    from tracediag.run import resolve_paths

    kw = kw or {}
    try:
        traces = resolve_paths(paths, storage_options(kw.get("storage_options", ())))
        inputs = [*traces, *(p for p in more_inputs if p is not None)]
        for option, out in outputs.items():
            if out is not None:
                refuse_inputs(out, inputs, option)
        if kw.get("out_dir"):
            refuse_inputs_under(kw["out_dir"], traces, "--out")
    except TracediagError as e:
        raise InputError(str(e)) from None
    return traces


def report_failed(meta_errors: tuple[str, ...], allow_missing: bool) -> None:
    """Each file the executor failed on, on stderr; exit 2 unless --allow-missing (after the report is out)."""
    for line in capped(meta_errors):
        click.echo(f"Error: {line}", err=True)
    exit_if_missing(meta_errors, allow_missing)

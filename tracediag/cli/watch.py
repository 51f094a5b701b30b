"""`tracediag watch LOCATION`: follow a running job's trace files, one record per profiler window.

Thin: options are parsed here, `tracediag.watch` does the work, and each window is written out
(a line on stdout, a JSON Lines record, the metrics) before the next one is asked for, so a
window counts as reported (``--state``) only once its record is on disk.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import click
import orjson

from tracediag.cli.common import EXIT_FINDING, FilePath, Finite, InputError, read_user_file
from tracediag.cli.execute_options import storage_options as parse_storage_options
from tracediag.cli.traces import parse_rank_map
from tracediag.errors import SHOWN_LINES, TracediagError, more_line, one_line, problem_of, shown
from tracediag.model.predict import Prediction, load_prediction
from tracediag.output import write_atomic
from tracediag.report.metrics import WatchMetrics, exposition
from tracediag.watching import Notice, Window
from tracediag.watching import watch as watch_windows


class JsonLines:
    """An append-only JSON Lines file: one record per window, each synced to disk when written."""

    def __init__(self, path: str) -> None:
        try:
            self.f = Path(path).open("ab")  # noqa: SIM115 - open for the watch's whole life
            if self.f.tell() > 0:
                with Path(path).open("rb") as r:
                    r.seek(-1, os.SEEK_END)
                    if r.read(1) != b"\n":  # a record cut by a crash: the next starts on its own line
                        self.f.write(b"\n")
        except OSError as e:
            msg = f"{shown(path)}: cannot append to it ({e.strerror or e})"
            raise InputError(msg) from None
        self.path = path

    def write(self, record: dict) -> None:
        """Append one record as a line, flushed to disk (a reader never sees half a record)."""
        self.f.write(orjson.dumps(record) + b"\n")
        self.f.flush()
        os.fsync(self.f.fileno())


class Warnings:
    """`watch`'s warning lines on stderr: the first `SHOWN_LINES` since the last window, then the rest
    counted by problem in one line at the next window or the end (a folder of thousands of unusable files
    is 21 lines, not thousands; the metrics and `on_notice` still get every one)."""

    def __init__(self) -> None:
        self.shown = 0
        self.rest: Counter[str] = Counter()

    def say(self, message: str) -> None:
        """One warning: on stderr, or counted once `SHOWN_LINES` were."""
        if self.shown < SHOWN_LINES:
            click.echo(f"warning: {message}", err=True)
            self.shown += 1
        else:
            self.rest[problem_of(message)] += 1

    def flush(self) -> None:
        """The line counting what was not said since the last flush; the count starts again."""
        if self.rest:
            click.echo(f"warning: {more_line(self.rest, noun='warning')}", err=True)
        self.shown, self.rest = 0, Counter()


def line(w: Window) -> str:
    """One line per window on stdout."""
    head = f"window {w.index} ({w.key}): {len(w.ranks)} ranks"
    if w.missing_ranks:
        head += f", missing {','.join(map(str, w.missing_ranks))}"
    if w.error:
        return f"{head}: not analysed: {w.error}"
    step = f"step {w.step_seconds:.3f} s" if w.step_seconds is not None else "no steps"
    if w.mfu is not None:
        step += f", MFU {w.mfu:.1%} (predicted {w.mfu_predicted:.1%})"
    found = "; ".join(f"{f.cause.value} ranks {','.join(map(str, f.ranks))}" for f in w.findings[:3])
    out = f"{head}: {step}; {found}"
    if w.changes:
        out += "; changed: " + "; ".join(c.summary for c in w.changes)
    return out


def _plan(path: Path) -> Prediction:
    """The prediction saved at `path`, or a one-line error naming the file."""
    try:
        return read_user_file(path, "--plan", load_prediction, "tracediag prediction")
    except TracediagError as e:
        raise InputError(one_line(str(e))) from None


@click.command()
@click.argument("location")
@click.option("--jsonl", "jsonl_path", type=FilePath(dir_okay=False), help="Append one JSON record per window.")
@click.option(
    "--metrics-file",
    type=FilePath(dir_okay=False),
    help="Rewrite this file (atomically) with the metrics after each window: Prometheus textfile format.",
)
@click.option("--metrics-port", type=click.IntRange(0, 65535), help="Serve the metrics at http://HOST:PORT/metrics.")
@click.option("--metrics-host", default="0.0.0.0", show_default=True, help="Address the metrics server binds.")
@click.option(
    "--fail-if-slower",
    type=Finite(min=0, min_open=True),
    metavar="PCT",
    help=f"Exit {EXIT_FINDING} once a window's step time is PCT% or more above the job's baseline.",
)
@click.option(
    "--window-timeout",
    type=Finite(min=0),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="Analyse a window this long after its first file even if ranks are missing (they are named).",
)
@click.option("--poll", "poll_seconds", type=Finite(min=0, min_open=True), default=2.0, show_default=True)
@click.option("--once", is_flag=True, help="Analyse what is there now (complete or not) and end.")
@click.option("--max-windows", type=click.IntRange(min=1), help="End after this many windows.")
@click.option("--state", "state_path", type=FilePath(dir_okay=False), help="Restart state: resume, never repeat.")
@click.option("--baseline-windows", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--min-confidence", type=Finite(0, 1), default=0.9, show_default=True)
@click.option(
    "--plan",
    "plan_path",
    type=FilePath(exists=True, dir_okay=False, path_type=Path),
    help="The job's prediction (`tracediag predict -o`): each window's observed MFU against it.",
)
@click.option("--step-regex", metavar="REGEX", help=r"Step markers other than ProfilerStep#N.")
@click.option("--rank-from-filename", metavar="REGEX", help=r"Take each file's rank from its name.")
@click.option("--rank", "rank_map", multiple=True, metavar="FILE=N", help="Assign rank N to FILE; repeatable.")
@click.option("--storage-option", "storage_items", multiple=True, metavar="KEY=VALUE", help="For an object-store URL.")
def watch(
    location: str,
    jsonl_path: str | None,
    metrics_file: str | None,
    metrics_port: int | None,
    metrics_host: str,
    fail_if_slower: float | None,
    window_timeout: float,
    poll_seconds: float,
    once: bool,
    max_windows: int | None,
    state_path: str | None,
    baseline_windows: int,
    min_confidence: float,
    plan_path: Path | None,
    step_regex: str | None,
    rank_from_filename: str | None,
    rank_map: tuple[str, ...],
    storage_items: tuple[str, ...],
) -> None:
    """Follow the trace files a running job writes (a directory, glob or URL) and analyse each
    profiler window as its ranks' files land."""
    for option, path in (("--jsonl", jsonl_path), ("--metrics-file", metrics_file), ("--state", state_path)):
        if path is not None and Path(path).exists() and not Path(path).is_file():
            msg = f"{shown(path)}: {option} must name a regular file"
            raise InputError(msg)
    prediction = _plan(plan_path) if plan_path is not None else None
    metrics = WatchMetrics()
    out = JsonLines(jsonl_path) if jsonl_path else None

    def write_metrics() -> None:
        if metrics_file:
            try:
                write_atomic(metrics_file, exposition(metrics.snapshot()).encode())
            except TracediagError as e:
                click.echo(f"warning: {e}", err=True)

    said = Warnings()

    def on_notice(n: Notice) -> None:
        said.say(n.message)
        if n.reason != "rank_key":  # an option that matched nothing, not a file left out
            metrics.notice(n.reason)
            write_metrics()

    if metrics_port is not None:
        from tracediag.cli.metrics_http import serve

        try:
            _server, port, how = serve(metrics, metrics_host, metrics_port)
        except OSError as e:
            msg = f"--metrics-port {metrics_port}: cannot listen ({e.strerror or e})"
            raise InputError(msg) from None
        click.echo(f"serving metrics at http://{metrics_host}:{port}/metrics ({how})", err=True)
    slower = fail_if_slower / 100 if fail_if_slower is not None else 0.10
    try:
        windows = watch_windows(
            location,
            poll_seconds=poll_seconds,
            window_timeout=window_timeout,
            once=once,
            max_windows=max_windows,
            state=Path(state_path) if state_path else None,
            baseline_windows=baseline_windows,
            slower=min(slower, 0.10),
            min_confidence=min_confidence,
            step_regex=step_regex,
            rank_from_filename=rank_from_filename,
            rank_map=parse_rank_map(rank_map),
            storage_options=parse_storage_options(storage_items),
            on_notice=on_notice,
            prediction=prediction,
        )
        for w in windows:
            said.flush()
            click.echo(line(w))
            if out is not None:
                out.write(w.to_dict())
            metrics.window(w)
            write_metrics()
            if fail_if_slower is not None:
                change = w.slower_than(fail_if_slower / 100, min_confidence)
                if change is not None:
                    click.echo(f"regressed at window {w.index}: {change.summary}", err=True)
                    raise SystemExit(EXIT_FINDING)
    except TracediagError as e:
        raise InputError(str(e)) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    finally:
        said.flush()

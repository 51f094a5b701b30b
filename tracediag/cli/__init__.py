"""The `tracediag` command line: one module per command, registered here and imported on first use."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from importlib import import_module
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

COMMANDS: dict[str, tuple[str, str]] = {
    "analyze": (
        "tracediag.cli.analyze",
        "Name the cause of slow steps in trace files, globs, directories or an ingest Parquet.",
    ),
    "calibrate": (
        "tracediag.cli.calibrate",
        "Measure GEMM, HBM and link efficiencies from a run's traces, or fit the GEMM rate to one measured number.",
    ),
    "compare": (
        "tracediag.cli.compare",
        "Compare two runs (trace files, directories, or saved `analyze --format json` output).",
    ),
    "export": (
        "tracediag.cli.export",
        "Write trace files' timelines, aligned and annotated with the analysis, to one file for ui.perfetto.dev.",
    ),
    "hang": (
        "tracediag.cli.hang",
        "Read PyTorch Flight Recorder dumps (one per rank: files, directories, globs, URLs) and say which "
        "rank broke the collective order and who waits for whom; with --traces, what the late rank's host was "
        "doing after its last completed collective.",
    ),
    "ingest": (
        "tracediag.cli.ingest",
        "Read trace files (files, globs or directories) into one event table.",
    ),
    "plan": (
        "tracediag.cli.model",
        "Search every split that fits, rank by predicted throughput, say why each wins or loses.",
    ),
    "predict": (
        "tracediag.cli.model",
        "Predict memory per device, step time by part, MFU and tokens/s of one split.",
    ),
    "report": (
        "tracediag.cli.report",
        "Render a saved analysis (`analyze --format json`) as one self-contained HTML file.",
    ),
    "watch": (
        "tracediag.cli.watch",
        "Follow the trace files a running job writes (a directory, glob or URL) and analyse each profiler "
        "window as its ranks' files land.",
    ),
}
"""Command name -> (the module defining a command of that name, its short help for `tracediag --help`).

The short help is kept here so that `tracediag --help` lists every command without importing any; a test
checks it against each command's own."""


@contextmanager
def collection_paused() -> Iterator[None]:
    """Import a command's modules with Python's cyclic garbage collector paused.

    A module's functions, classes and tables live as long as the process: the collections their
    allocations set off during the import find nothing to free (1.6% of the instructions of a tiny
    `analyze`, benchmarks/bench_startup.py)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class LazyGroup(click.Group):
    """A click group whose commands are imported the first time they are looked up (`analyze --help`
    imports only `analyze`'s module; `--help` imports none)."""

    def __init__(self, *args: object, lazy: Mapping[str, tuple[str, str]], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy)

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command name, loaded or not, sorted."""
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command, importing its module on first use."""
        if cmd_name not in self.commands and cmd_name in self.lazy:
            with collection_paused():
                command = getattr(import_module(self.lazy[cmd_name][0]), cmd_name)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list with each short help, from the registry for a command not imported yet."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(map(len, names))
        # a stand-in carrying the registry's text: click shortens it as it would the command's own
        shown = [self.commands.get(name) or click.Command(name, help=self.lazy[name][1]) for name in names]
        rows = [(n, c.get_short_help_str(limit)) for n, c in zip(names, shown, strict=True) if not c.hidden]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, lazy=COMMANDS)
@click.version_option(package_name="tracediag")
def cli() -> None:
    """Find where a multi-GPU training run waits, predict what it should achieve, plan its split."""


def main() -> None:
    """Console-script entry point: one exit status and at most one line on stderr (`cli.run.run`)."""
    from tracediag.cli.run import run

    run(cli)

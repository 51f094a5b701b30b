"""The command line starts light: `tracediag --help` imports no command, a command's `--help` imports
only what its options need, `analyze` only what its analysis needs, and the registry's short help is
each command's own (issue 31)."""

from __future__ import annotations

import gc
import subprocess
import sys
from importlib import import_module

import click
import pytest
from conftest import ROOT

from tracediag.cli import COMMANDS, cli, collection_paused
from tracediag.cli.common import LazyChoice

HEAVY = ("polars", "pyarrow", "plotly", "numpy")
TINY = "fixtures/kineto/gen_torch2.13cpu_gloo_2rank_rank*.pt.trace.json.gz"
"""A real 2-rank run (gloo, torch 2.13 CPU), 14 KB per rank."""
NOT_FOR_ANALYZE = (
    "tracediag.model",  # the analytic model: only with --plan / --model
    "tracediag.observed_vs_predicted",
    "tracediag.cli.model",
    "tracediag.report.html",  # --html
    "tracediag.report.perfetto",  # --perfetto
    "tracediag.report.notebook",
    "tracediag.execute.local",  # --executor
    "tracediag.execute.ray",
    "tracediag.execute.dask",
    "tracediag.desync",  # other commands' work
    "tracediag.watching",
    "tracediag.compare",
    "tracediag.check_result",  # `Analysis.check`'s type: only with --plan / --model
)
"""What a plain `analyze` does not use: the modules of options it was not given and of other commands."""


def _imported_after(args: list[str]) -> set[str]:
    """The modules a fresh interpreter holds after running `tracediag ARGS` (which must exit 0)."""
    code = (
        "import sys\nfrom tracediag.cli import cli\n"
        f"try:\n    cli({args!r})\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "print('\\n'.join(sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_registry_names_each_command_with_its_own_short_help(name):
    module, short = COMMANDS[name]
    command = getattr(import_module(module), name)
    assert isinstance(command, click.Command)
    assert command.get_short_help_str(limit=10**6) == short


def test_help_lists_every_command_as_if_all_were_imported():
    """The lazy listing is the listing click gives a group holding every command."""
    eager = click.Group(cli.name, help=cli.help, params=cli.params)
    for name, (module, _) in COMMANDS.items():
        eager.add_command(getattr(import_module(module), name))
    lazy = type(cli)(cli.name, help=cli.help, params=cli.params, lazy=COMMANDS)
    with click.Context(lazy, info_name="tracediag") as ctx:
        lazy_help = lazy.get_help(ctx)
    with click.Context(eager, info_name="tracediag") as ctx:
        eager_help = eager.get_help(ctx)
    assert lazy_help == eager_help
    assert all(f"\n  {name} " in lazy_help for name in COMMANDS)


def test_help_imports_no_command_and_no_heavy_library():
    mods = _imported_after(["--help"])
    assert not {m for m in mods if m.startswith("tracediag.cli.")}
    assert not {m for m in mods if m.split(".")[0] in HEAVY}
    assert "pickle" not in mods  # `import tracediag` imports the workers' module, which pickles only in use


def test_analyze_help_imports_its_command_only_and_no_heavy_library():
    """`analyze --help` needs analyze's options (the check's model options included), not its work."""
    mods = _imported_after(["analyze", "--help"])
    assert "tracediag.cli.analyze" in mods
    assert not {m for m in mods if m.split(".")[0] in HEAVY}
    assert not {"tracediag.cli.watch", "tracediag.cli.compare", "tracediag.cli.report"} & mods


def _under(mods: set[str], prefixes: tuple[str, ...]) -> set[str]:
    return {m for m in mods if any(m == p or m.startswith(f"{p}.") for p in prefixes)}


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_analyze_imports_what_its_analysis_needs_only(fmt, tmp_path):
    """A plain analyze reads and analyses (polars), but imports neither the model its --model check
    would run, nor what its other options draw with, nor another command's work."""
    mods = _imported_after(["analyze", TINY, "--format", fmt, "-o", str(tmp_path / "out")])
    assert {"tracediag.reduce", "polars"} <= mods  # it did analyse
    assert (tmp_path / "out").stat().st_size > 1000
    assert not _under(mods, NOT_FOR_ANALYZE)
    assert not _under(mods, ("pyarrow", "plotly", "numpy", "ray", "dask"))
    assert "pickle" not in mods  # the worker processes' messages: no worker starts
    assert not {m for m in mods if m.startswith("tracediag.cli.")} - {
        f"tracediag.cli.{m}"
        for m in ("analyze", "check_options", "common", "execute_options", "export", "model_options", "traces")
    }
    if fmt == "json":  # the text renderers only for text
        assert not _under(mods, ("tracediag.report.text", "tracediag.report.kernels_text", "tracediag.kernel_names"))


def _lazy_choices() -> list[tuple[str, click.Parameter]]:
    found = {}
    for name, (module, _) in COMMANDS.items():
        for p in getattr(import_module(module), name).params:
            if isinstance(p.type, LazyChoice):
                found[f"{name} {p.opts[0]}"] = p
    return sorted(found.items())


def test_model_choices_are_looked_up_and_each_default_is_one():
    """A `LazyChoice` converts its option's default unlooked-up: that default must be one of its choices."""
    found = _lazy_choices()
    assert {k.split()[1] for k, _ in found} == {"--gpu", "--engine", "--dtype", "--recompute"}
    defaults = {key: p.default for key, p in found if isinstance(p.default, str)}
    assert defaults["predict --engine"] == "megatron-core"
    for key, p in found:
        assert len(p.type.choices) >= 2, key
        if key in defaults:
            assert defaults[key] in p.type.choices, key


def test_imports_pause_the_collector_and_give_it_back_as_found():
    assert gc.isenabled()
    with collection_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collection_paused():
            pass
        assert not gc.isenabled()  # the caller had it off: it stays off
    finally:
        gc.enable()


def test_an_unknown_command_is_a_usage_error(runner):
    result = runner.invoke(cli, ["analyse"])
    assert result.exit_code == 2
    assert "No such command 'analyse'" in result.output

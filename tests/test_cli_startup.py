"""The command line starts light: `tracediag --help` imports no command, a command's `--help` imports
only what its options need, and the registry's short help is each command's own (issue 31)."""

from __future__ import annotations

import subprocess
import sys
from importlib import import_module

import click
import pytest
from conftest import ROOT

from tracediag.cli import COMMANDS, cli

HEAVY = ("polars", "pyarrow", "plotly", "numpy")


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


def test_analyze_help_imports_its_command_only_and_no_heavy_library():
    """`analyze --help` needs analyze's options (the check's model options included), not its work."""
    mods = _imported_after(["analyze", "--help"])
    assert "tracediag.cli.analyze" in mods
    assert not {m for m in mods if m.split(".")[0] in HEAVY}
    assert not {"tracediag.cli.watch", "tracediag.cli.compare", "tracediag.cli.report"} & mods


def test_an_unknown_command_is_a_usage_error(runner):
    result = runner.invoke(cli, ["analyse"])
    assert result.exit_code == 2
    assert "No such command 'analyse'" in result.output

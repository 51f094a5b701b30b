"""An output that cannot be written is refused before any input is read (issue 29): one line naming it, exit 2,
nothing on stdout. Before, `analyze --html /dev/full` printed the whole text report and then failed, and
`calibrate RUN -o /dev/full` first analysed the run and reported what it could not calibrate."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from tracediag.cli import cli

RUN = str(FIXTURES / "runs" / "straggler_persistent")
DUMPS = str(FIXTURES / "hang" / "healthy")
SPLIT = ["--model", "llama3.1-8b", "--gpus", "8", "--gpu", "a100-80gb", "--seq-len", "2048", "--global-batch", "8"]

COMMANDS = {
    "analyze -o": ["analyze", RUN, "-o"],
    "analyze --html": ["analyze", RUN, "--html"],
    "analyze --perfetto": ["analyze", RUN, "--perfetto"],
    "ingest -o": ["ingest", RUN, "-o"],
    "export -o": ["export", RUN, "-o"],
    "compare -o": ["compare", RUN, RUN, "-o"],
    "hang -o": ["hang", DUMPS, "-o"],
    "calibrate RUN -o": ["calibrate", RUN, "--gpu", "a100-80gb", "-o"],
    "predict -o": ["predict", *SPLIT, "-o"],
}


@pytest.mark.parametrize("args", COMMANDS.values(), ids=COMMANDS.keys())
@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("device", "exists and is not a regular file; refusing to replace it"),
        ("no-folder", "cannot write, no such folder"),
    ],
)
def test_an_unwritable_output_is_refused_before_the_work(args, target, said, tmp_path):
    path = os.devnull if target == "device" else str(tmp_path / "absent" / "out")
    result = CliRunner().invoke(cli, [*args, path])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"Error: {path}: {said}" + (f" {tmp_path / 'absent'}" if target == "no-folder" else "")
    ]

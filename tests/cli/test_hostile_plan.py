"""A saved prediction (`predict -o`, read by `analyze --plan`) edited to nonsense: one line naming the
file and the key, exit 2 — never a comparison against it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
import pytest
from conftest import RUNS

from tracediag.cli import cli

if TYPE_CHECKING:
    from pathlib import Path

RUN = str(RUNS / "healthy_ddp")
PREDICT = [
    "predict",
    "--model",
    "tiny",
    "--gpu",
    "a100-80gb",
    "--seq-len",
    "512",
    "--global-batch",
    "16",
    "--gpus",
    "4",
]


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> dict:
    from click.testing import CliRunner

    out = tmp_path_factory.mktemp("plan") / "plan.json"
    result = CliRunner().invoke(cli, [*PREDICT, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return orjson.loads(out.read_bytes())


@pytest.mark.parametrize(
    ("section", "key", "value", "why"),
    [
        ("training", "recompute", "bogus", "recompute must be one of none, selective, op, full, got 'bogus'"),
        ("device", "peak_flops", -1, "inputs.device.peak_flops is -1, outside 0..1e+18"),
        ("device", "peak_flops", 1e300, "inputs.device.peak_flops is 1e+300, outside 0..1e+18"),
        ("device", "memory_bytes", 10**19, "inputs.device.memory_bytes is 1e+19, outside 0..1e+18"),
        ("training", "seq_len", "512", "seq_len is str, not a number"),
        ("split", "tp", True, "tp is bool, not a number"),
        ("model", "swiglu", 1, "swiglu is int, not true or false"),
        ("training", "global_batch", 0, "global_batch must be >= 1, got 0"),
    ],
)
def test_a_hostile_plan_value_names_the_file_and_key(runner, tmp_path: Path, plan, section, key, value, why) -> None:
    edited = orjson.loads(orjson.dumps(plan))
    edited["inputs"][section][key] = value
    path = tmp_path / "edited.json"
    path.write_bytes(orjson.dumps(edited))
    result = runner.invoke(cli, ["analyze", RUN, "--plan", str(path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines()[-1] == f"Error: {path}: {why}"


def test_the_plan_as_written_is_compared(runner, tmp_path: Path, plan) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(orjson.dumps(plan))
    result = runner.invoke(cli, ["analyze", RUN, "--plan", str(path)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output

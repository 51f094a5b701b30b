"""A saved profile (`calibrate -o`) whose numbers were edited to nonsense: one line naming the file and
the key, exit 2 — never a prediction from it (a compute_scale of 1e308 printed a 300-digit number)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
import pytest
from conftest import FIXTURES

from tracediag.cli import cli

if TYPE_CHECKING:
    from pathlib import Path

CPU_FLAGS = [
    "--gpu", "a100-80gb", "--peak-tflops", "4", "--hbm-gbps", "20", "--gpus-per-node", "4",
    "--intra-link", "1", "--inter-link", "1", "--engine", "megatron-2022",
]  # fmt: skip
RUN = FIXTURES / "model_runs" / "transformer_dp4"
MODEL_FLAGS = ["--layers", "2", "--hidden", "512", "--heads", "8", "--ffn", "2048", "--vocab", "4096"]
PREDICT = ["predict", *CPU_FLAGS, *MODEL_FLAGS, "--gpus", "4", "--seq-len", "256", "--global-batch", "16",
           "--tp", "2", "--dp", "2", "--micro-batch", "8", "--zero", "0"]  # fmt: skip


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> dict:
    """The profile calibrate writes from the real transformer_dp4 run."""
    from click.testing import CliRunner

    out = tmp_path_factory.mktemp("profile") / "cpu.json"
    run = CliRunner().invoke(
        cli,
        ["calibrate", str(RUN / "rank*.pt.trace.json.gz"), *CPU_FLAGS, *MODEL_FLAGS,
         "--seq-len", "256", "--global-batch", "16", "--micro-batch", "4", "--zero", "0", "-o", str(out)],
    )  # fmt: skip
    assert run.exit_code == 0, run.output
    return orjson.loads(out.read_bytes())


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("compute_scale", -1, "is -1, outside 0.001..1000"),
        ("compute_scale", 1e308, "is 1e+308, outside 0.001..1000"),
        ("compute_scale", 0, "is 0, outside 0.001..1000"),
        ("compute_scale", True, "is bool, not a number"),
        ("compute_scale", "0.5", "is str, not a number"),
        ("hbm_scale", 1e-300, "is 1e-300, outside 0.001..1000"),
        ("intra_busbw_gbps", -5.0, "is -5, outside 0.001..1e+06"),
        ("intra_busbw_gbps", [1], "is list, not a number"),
        ("inter_busbw_gbps", 1e30, "is 1e+30, outside 0.001..1e+06"),
    ],
)
def test_a_hostile_profile_number_names_the_file_and_key(runner, tmp_path: Path, profile, key, value, why) -> None:
    path = tmp_path / "edited.json"
    path.write_bytes(orjson.dumps({**profile, key: value}))
    result = runner.invoke(cli, [*PREDICT, "--profile", str(path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines()[0] == f"Error: {path}: {key} {why}"


def test_the_profile_as_written_still_predicts(runner, tmp_path: Path, profile) -> None:
    path = tmp_path / "as_written.json"
    path.write_bytes(orjson.dumps(profile))
    result = runner.invoke(cli, [*PREDICT, "--profile", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("calibrated (trace of 4 file(s)): GEMM rate x")


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        ({"intra_busbw_gbps": None}, "intra_link is calibrated but intra_busbw_gbps is missing"),
        ({"calibrated": ["compute", "gpu"]}, "calibrated names 'gpu', not one of compute, hbm, intra_link, inter_link"),
        ({"source": 5}, "source is int, not a string"),
    ],
)
def test_a_profile_whose_parts_do_not_fit_names_the_file(runner, tmp_path: Path, profile, edit, why) -> None:
    """Found by tests/fuzz: a calibrated link without its bandwidth crashed the prediction's first line
    (exit 1, a traceback from `Profile.describe`); unknown parts were refused without the file's name."""
    path = tmp_path / "edited.json"
    path.write_bytes(orjson.dumps({**profile, "calibrated": ["compute", "hbm", "intra_link"], **edit}))
    result = runner.invoke(cli, [*PREDICT, "--profile", str(path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines()[0] == f"Error: {path}: {why}"

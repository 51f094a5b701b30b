"""Issue 4: `tracediag predict` and `tracediag plan` wiring: JSON keys, -o, errors as one line, --emit."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from tracediag.cli import cli
from tracediag.model.predict import load_prediction

PREDICT = [
    "predict",
    "--model",
    "llama3-8b",
    "--gpus",
    "16",
    "--gpu",
    "h100-sxm",
    "--seq-len",
    "8192",
    "--global-batch",
    "32",
    "--tp",
    "2",
    "--pp",
    "2",
    "--dp",
    "4",
    "--sequence-parallel",
]


@pytest.fixture
def runner():
    return CliRunner()


def test_predict_json_has_the_documented_keys(runner, tmp_path):
    out = tmp_path / "plan.json"
    result = runner.invoke(cli, [*PREDICT, "--format", "json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.stdout)
    for key in ("fits", "memory_bytes_per_device", "step_time_s", "breakdown", "mfu", "hfu", "tokens_per_s"):
        assert key in data
    assert data["inputs"]["split"]["tp"] == 2
    assert load_prediction(out).step_time_s == pytest.approx(data["step_time_s"])


def test_predict_text_and_shape_flags(runner):
    args = [
        "predict",
        "--layers",
        "4",
        "--hidden",
        "256",
        "--heads",
        "4",
        "--vocab",
        "1000",
        "--gpus",
        "2",
        "--gpu",
        "a100-80gb",
        "--seq-len",
        "128",
        "--global-batch",
        "4",
        "--dp",
        "2",
        "--intra-link",
        "120",
    ]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "memory per device" in result.stdout and "MFU" in result.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--tp", "3"], "heads=32 not divisible by tp=3"),
        (["--dp", "2"], "≠ gpus=16"),
        (["--intra-link", "warp"], "unknown link"),
    ],
    ids=["heads", "product", "link"],
)
def test_predict_bad_split_is_one_line_exit_2(runner, extra, message):
    result = runner.invoke(cli, [*PREDICT, *extra])
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ") and message in result.stderr
    assert "Traceback" not in result.output and result.stderr.count("\n") == 1


def test_plan_text_json_and_emit(runner):
    base = [
        "plan",
        "--model",
        "tiny",
        "--gpus",
        "8",
        "--gpu",
        "a100-40gb",
        "--seq-len",
        "512",
        "--global-batch",
        "16",
        "--top",
        "3",
    ]
    text = runner.invoke(cli, base)
    assert text.exit_code == 0, text.output
    assert text.stdout.count("\n#") == 3
    data = orjson.loads(runner.invoke(cli, [*base, "--format", "json"]).stdout)
    assert len(data["splits"]) == 3 and data["splits"][0]["rank"] == 1
    emitted = runner.invoke(cli, [*base, "--emit", "megatron"])
    assert emitted.exit_code == 0 and "--tensor-model-parallel-size" in emitted.stdout

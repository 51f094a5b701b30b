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
    assert "memory per device" in result.stdout
    assert "MFU" in result.stdout


def test_predict_etp_folds_experts_over_tensor_parallel_ranks(runner):
    base = ["predict", "--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "1000", "--experts", "8"]
    base += ["--top-k", "2", "--gpus", "8", "--gpu", "h100-sxm", "--seq-len", "128", "--global-batch", "4"]
    base += ["--tp", "2", "--dp", "4", "--ep", "8", "--sequence-parallel", "--format", "json"]
    refused = runner.invoke(cli, base)
    assert refused.exit_code == 2
    assert "etp" in refused.output
    folded = runner.invoke(cli, [*base, "--etp", "1"])
    assert folded.exit_code == 0, folded.output
    data = orjson.loads(folded.stdout)
    assert data["inputs"]["split"]["etp"] == 1
    assert "mixture of experts" in data["warning"]


def test_predict_head_dim_widens_attention(runner):
    """--head-dim sets the attention width where it is not hidden / heads: Q, K, V and O, and so the parameters."""
    base = ["predict", "--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "1000", "--gpus", "1"]
    base += ["--gpu", "h100-sxm", "--seq-len", "128", "--global-batch", "1", "--format", "json"]
    plain = orjson.loads(runner.invoke(cli, base).stdout)
    wide = orjson.loads(runner.invoke(cli, [*base, "--head-dim", "128"]).stdout)
    # each layer's Q, K, V, O grow from 4·64 to 4·128 channels: 4 matrices × 256 × 256 more weights
    assert wide["params"] - plain["params"] == 4 * 4 * 256 * 256
    assert wide["inputs"]["model"]["attention_head_dim"] == 128


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
    assert result.stderr.startswith("Error: ")
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert result.stderr.count("\n") == 1


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
    assert len(data["splits"]) == 3
    assert data["splits"][0]["rank"] == 1
    emitted = runner.invoke(cli, [*base, "--emit", "megatron"])
    assert emitted.exit_code == 0
    assert "--tensor-model-parallel-size" in emitted.stdout


def test_model_knobs_reach_the_model(runner):
    """--experts/--top-k/--tied-embeddings/--grad-dtype/--recompute op/--dtype end up in the prediction."""
    args = [*PREDICT, "--format", "json"]
    base = orjson.loads(runner.invoke(cli, args).stdout)["inputs"]
    data = orjson.loads(
        runner.invoke(
            cli,
            [*args, "--experts", "8", "--top-k", "2", "--tied-embeddings", "--grad-dtype", "bf16",
             "--recompute", "op", "--dtype", "fp8"],
        ).stdout
    )  # fmt: skip
    model, train = data["inputs"]["model"], data["inputs"]["training"]
    assert (model["experts"], model["top_k"], model["tied_embeddings"]) == (8, 2, True)
    assert (base["model"]["experts"], base["model"]["tied_embeddings"]) == (1, False)
    assert (train["grad_bytes"], train["recompute"], train["dtype"]) == (2, "op", "fp8")
    assert base["training"]["grad_bytes"] == 4


def test_plan_headroom_and_emit_flags(runner):
    base = ["plan", "--model", "llama3-70b", "--gpus", "64", "--gpu", "h100-sxm", "--seq-len", "8192",
            "--global-batch", "128", "--top", "2", "--format", "json"]  # fmt: skip
    data = orjson.loads(runner.invoke(cli, [*base, "--headroom", "0.25"]).stdout)
    assert data["headroom"] == 0.25
    assert all(s["memory_bytes_per_device"] <= 0.75 * s["memory"]["capacity"] for s in data["splits"])
    emitted = runner.invoke(cli, [*base, "--emit", "torchtitan"])
    assert emitted.exit_code == 0
    assert "--parallelism.tensor_parallel_degree" in emitted.stdout  # torchtitan 0.3 overrides
    assert emitted.stdout.startswith("# tracediag plan for torchtitan 0.3: llama3-70b on 64 x h100-sxm")
    toml = runner.invoke(cli, [*base, "--emit", "torchtitan-0.2"])
    assert toml.exit_code == 0
    assert "[parallelism]" in toml.stdout


def test_plan_emit_times_splits_with_the_target_engine(runner):
    """Without --engine, `--emit deepspeed` plans with the deepspeed profile (and --engine still wins)."""
    from tracediag.model.emit import emit
    from tracediag.model.plan import plan
    from tracediag.model.specs import resolve_device, resolve_model
    from tracediag.model.stack import resolve_engine

    base = ["plan", "--model", "llama3-8b", "--gpus", "16", "--gpu", "h100-sxm", "--seq-len", "2048",
            "--global-batch", "32", "--emit", "deepspeed"]  # fmt: skip
    args = {"gpus": 16, "seq_len": 2048, "global_batch": 32, "top": 1, "target": "deepspeed"}
    model, device = resolve_model("llama3-8b"), resolve_device("h100-sxm")
    outputs = []
    for extra, engine in (([], "deepspeed"), (["--engine", "megatron-core"], "megatron-core")):
        expected = emit(plan(model, device, resolve_engine(engine), **args).ranked[0].prediction, "deepspeed")
        outputs.append(runner.invoke(cli, [*base, *extra]).stdout)
        assert outputs[-1] == expected
    assert outputs[0] != outputs[1]  # the two profiles pick different splits here


def test_engine_switches_and_oversubscription_change_the_prediction(runner):
    base = ["predict", "--model", "llama3-70b", "--gpus", "64", "--gpu", "h100-sxm", "--seq-len", "8192"]
    base += ["--global-batch", "64", "--tp", "8", "--dp", "8", "--sequence-parallel", "--format", "json"]

    def run(*extra):
        result = runner.invoke(cli, [*base, *extra])
        doc = orjson.loads(result.output)
        assert result.exit_code == (0 if doc["fits"] else 3), result.output  # a split that does not fit: 3
        return doc

    plain = run("--engine", "megatron-core", "--no-tp-overlap")
    overlapped = run("--engine", "megatron-core", "--tp-overlap")
    assert overlapped["breakdown"]["exposed_tp_s"] < 0.5 * plain["breakdown"]["exposed_tp_s"]
    assert "tp_overlap=False" in plain["inputs"]["engine"]["name"]
    slow_net = run("--engine", "megatron-core", "--no-dp-overlap", "--oversubscription", "4")
    fast_net = run("--engine", "megatron-core", "--no-dp-overlap")
    assert slow_net["breakdown"]["exposed_dp_s"] > 2 * fast_net["breakdown"]["exposed_dp_s"]
    unfused = run("--attention", "unfused", "--recompute", "none")
    fused = run("--attention", "fa3", "--recompute", "none")
    assert unfused["memory"]["activations"] > fused["memory"]["activations"]
    bad = runner.invoke(cli, [*base, "--oversubscription", "0.5"])
    assert bad.exit_code == 2


@pytest.mark.parametrize(
    "args",
    [
        ["calibrate", "--measured-mfu", "nan"],
        ["calibrate", "--measured-step-time", "inf"],
        ["calibrate", "--measured-tokens-per-s", "inf"],
        ["compare", "a", "b", "--fail-if-slower", "nan"],
        ["plan", "--headroom", "nan"],
    ],
    ids=lambda a: f"{a[0]} {a[-2]} {a[-1]}",
)
def test_a_float_option_that_is_not_finite_is_refused_naming_it(runner, args):
    """Nan passes every comparison (a gate that can never trip, a GEMM rate scaled to nothing) and inf
    every lower bound: each float option refuses both, naming the option, before any work."""
    result = runner.invoke(cli, args)
    assert result.exit_code == 2
    assert f"Invalid value for '{args[-2]}'" in result.output
    assert "not a finite number" in result.output


@pytest.mark.parametrize(
    ("split", "said"),
    [
        (["--tp", "1", "--pp", "1", "--dp", "8"], "1 micro-batch in flight"),
        (["--tp", "2", "--pp", "4", "--dp", "1"], "4 micro-batches in flight"),
    ],
)
def test_micro_batches_in_flight_agree_in_number(runner, split, said):
    """1F1B holds as many micro-batches as stages on the first stage: one without a pipeline, four with four
    stages; the count reads "1 micro-batch", not "1.0 micro-batches"."""
    args = ["predict", "--model", "llama3.1-8b", "--gpus", "8", "--gpu", "a100-80gb", "--seq-len", "2048"]
    result = runner.invoke(cli, [*args, "--global-batch", "16", "--micro-batch", "1", *split])
    assert result.exit_code == 0, result.output
    assert f"; {said})" in result.output

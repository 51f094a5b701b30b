"""One behaviour across commands: plurals, option errors that list the valid values, "wrote F"
(issue 30 item 5), on real runs."""

from __future__ import annotations

import orjson
from conftest import FIXTURES, KINETO, RUNS

from tracediag.cli import cli

MODEL = ["predict", "--model", "llama3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--seq-len", "8192", "--tp", "8"]


def test_one_micro_batch_is_singular(runner):
    one = runner.invoke(cli, [*MODEL, "--global-batch", "1"])
    assert one.exit_code == 0, one.output
    assert "(1 micro-batch per pipeline)" in one.output
    eight = runner.invoke(cli, [*MODEL, "--global-batch", "8"])
    assert "(8 micro-batches per pipeline)" in eight.output


def test_unknown_link_preset_lists_the_presets(runner):
    result = runner.invoke(cli, ["analyze", str(RUNS / "comm_bound"), "-j", "1", "--link-gbps", "nvlink9"])
    assert result.exit_code == 2
    line = result.output.strip().splitlines()[-1]  # after click's usage lines
    assert line.startswith("Error: Invalid value for --link-gbps")
    assert "unknown link 'nvlink9'" in line
    assert "nvlink3, nvlink4, nvlink5" in line
    assert "ib-ndr" in line


def test_compare_to_a_file_says_wrote(runner, tmp_path):
    out = tmp_path / "c.html"
    args = ["compare", str(RUNS / "healthy_ddp"), str(RUNS / "comm_bound"), "-j", "1", "--format", "html"]
    result = runner.invoke(cli, [*args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert result.stderr.strip().splitlines()[-1] == f"wrote {out}"
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_predict_of_a_split_that_does_not_fit_exits_3(runner, tmp_path):
    """Llama 3 70B on 8 H100s at tp=8 needs ~210 GiB a device: printed and saved, exit 3 like a failed check."""
    out = tmp_path / "p.json"
    args = ["predict", "--model", "llama3-70b", "--gpus", "8", "--gpu", "h100-sxm", "--seq-len", "8192"]
    result = runner.invoke(cli, [*args, "--global-batch", "8", "--tp", "8", "-o", str(out)])
    assert result.exit_code == 3
    assert "DOES NOT FIT" in result.output
    assert orjson.loads(out.read_bytes())["fits"] is False
    assert runner.invoke(cli, [*MODEL, "--global-batch", "8"]).exit_code == 0  # 8B fits: 0


def test_compare_of_a_gpu_run_against_a_cpu_run_warns(runner):
    gpu, cpu = KINETO / "hta_a100_nccl_rank0.json.gz", RUNS / "healthy_ddp"
    result = runner.invoke(cli, ["compare", str(gpu), str(cpu), "-j", "1"])
    assert result.exit_code == 0, result.output
    (warning,) = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warning.startswith(f"warning: {gpu} ran on GPUs and {cpu} on CPUs only")
    same = runner.invoke(cli, ["compare", str(RUNS / "comm_bound"), str(cpu), "-j", "1"])
    assert "warning:" not in same.stderr


def test_calibrate_of_a_directory_skips_its_manifest_as_analyze_does(runner, tmp_path):
    """fixtures/model_runs/transformer_dp4 holds a manifest.json beside its 4 traces: calibrate stopped
    on it ('not a trace'); now it reads the 4 traces analyze reads and says what it skipped."""
    out = tmp_path / "profile.json"
    run = FIXTURES / "model_runs" / "transformer_dp4"
    result = runner.invoke(cli, ["calibrate", str(run), "--gpu", "h100-sxm", "-o", str(out)])
    assert result.exit_code == 0, result.output
    warning = next(line for line in result.stderr.splitlines() if line.startswith("warning:"))
    assert warning.startswith("warning: 1 file in the directories ignored (not traces: ")
    assert "manifest.json" in warning
    assert "calibrated (trace of 4 file(s))" in result.stdout
    assert orjson.loads(out.read_bytes())


def test_ingest_refuses_two_unrelated_runs_as_analyze_does(runner):
    """Rank 0 of comm_bound and rank 1 of healthy_ddp, recorded 91 s apart: analyze refused them,
    ingest merged them silently into '2 ranks'."""
    files = [str(RUNS / "comm_bound" / "rank0.pt.trace.json.gz"), str(RUNS / "healthy_ddp" / "rank1.pt.trace.json.gz")]
    refused = runner.invoke(cli, ["ingest", *files, "-j", "1"])
    assert refused.exit_code == 2
    (line,) = [x for x in refused.output.splitlines() if x.strip()]
    assert "are not ranks of one run: recorded time spans do not overlap" in line
    assert line.endswith("Pass --allow-mixed to read them into one table anyway")
    assert runner.invoke(cli, ["analyze", *files, "-j", "1"]).exit_code == 2
    mixed = runner.invoke(cli, ["ingest", *files, "-j", "1", "--allow-mixed"])
    assert mixed.exit_code == 0, mixed.output
    assert mixed.output.startswith("files   2 read")
    one_run = runner.invoke(cli, ["ingest", str(RUNS / "comm_bound"), "-j", "1"])
    assert one_run.exit_code == 0, one_run.output

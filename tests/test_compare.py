"""`tracediag compare BASE NEW` on real runs (issue 11)."""

from __future__ import annotations

import itertools
import re

import orjson
import polars as pl
from conftest import FIXTURES, SAMPLES, needs_shared

import tracediag
from tracediag.cli import cli
from tracediag.report.bundle import DATA_TYPE, unpack

RUNS = FIXTURES / "runs"


def _median_step(path) -> float:
    steps = tracediag.analyze(tracediag.load(path, jobs=1)).steps
    return steps.group_by("step").agg(pl.col("dur_ns").mean())["dur_ns"].median()


def test_healthy_against_comm_bound_names_the_part_and_the_cause(runner):
    base, new = RUNS / "healthy_ddp", RUNS / "comm_bound"
    result = runner.invoke(cli, ["compare", str(base), str(new), "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.output)
    assert set(doc) >= {"base", "new", "step_time_delta_ns", "changes"}
    assert doc["step_time_delta_ns"] == round(_median_step(new) - _median_step(base))
    parts = {c["column"]: c for c in doc["changes"] if c["kind"] == "breakdown"}
    exposed = parts["exposed_comm_ns"]
    assert exposed["delta_ns"] == exposed["new_ns_per_step"] - exposed["base_ns_per_step"] > 30e6
    assert {"kind": "cause", "status": "added", "name": "comm_bound"} in doc["changes"]
    assert "exposed communication" in doc["headline"]
    assert "new cause: comm_bound" in doc["headline"]
    assert [c["cause"] for c in doc["new"]["causes"]] == ["comm_bound"]
    statuses = {c["status"] for c in doc["changes"] if c["kind"] == "kernel"}
    assert statuses <= {"added", "removed", "slower", "faster"}
    assert statuses


def test_a_run_against_its_saved_analysis_has_no_change_and_passes_the_gate(runner, tmp_path):
    saved = tmp_path / "base.json"
    assert (
        runner.invoke(
            cli, ["analyze", str(RUNS / "straggler_persistent"), "--format", "json", "-o", str(saved)]
        ).exit_code
        == 0
    )
    result = runner.invoke(cli, ["compare", str(saved), str(RUNS / "straggler_persistent"), "--fail-if-slower", "0"])
    assert result.exit_code == 0, result.output
    assert "changed +0.0 ms (+0.0%)" in result.output
    assert "0 in all" in result.output  # no kernel changed


def test_fail_if_slower_exits_3_past_the_limit(runner):
    base, new = str(RUNS / "healthy_ddp"), str(RUNS / "straggler_persistent")
    doc = orjson.loads(runner.invoke(cli, ["compare", base, new, "--format", "json"]).output)
    pct = doc["step_time_delta_pct"] * 100
    assert pct > 5
    assert runner.invoke(cli, ["compare", base, new, "--fail-if-slower", str(pct - 1)]).exit_code == 3
    assert runner.invoke(cli, ["compare", base, new, "--fail-if-slower", str(pct + 1)]).exit_code == 0


@needs_shared(SAMPLES / "hta")
def test_a100_against_v100_kernel_deltas_and_html(runner, tmp_path):
    hta = SAMPLES / "hta" / "trace_diff"
    doc = orjson.loads(
        runner.invoke(cli, ["compare", str(hta / "control"), str(hta / "test"), "--format", "json"]).output
    )
    kernels = [c for c in doc["changes"] if c["kind"] == "kernel"]
    top = kernels[0]
    assert top["name"].startswith("Memcpy DtoD")
    assert top["status"] == "slower"
    assert any(k["status"] == "added" and k["name"].startswith("volta_sgemm") for k in kernels)  # V100 GEMMs
    assert all(abs(k["delta_ns"]) >= abs(b["delta_ns"]) for k, b in itertools.pairwise(kernels))
    out = tmp_path / "cmp.html"
    assert (
        runner.invoke(
            cli, ["compare", str(hta / "control"), str(hta / "test"), "--format", "html", "-o", str(out)]
        ).exit_code
        == 0
    )
    page = out.read_text()
    assert "Memcpy DtoD (Device -&gt; Device)" in page
    # the charts: our scripts only (packed plotly.js and figures, the loader), the kernel deltas those of the JSON
    tags = re.findall(r"<script\b[^>]*>", page)
    assert tags[-1] == "<script>"
    assert all(t.startswith(f'<script type="{DATA_TYPE}"') for t in tags[:-1])
    packed = re.search(r'data-for="fig-kernel-deltas">([^<]*)</script>', page).group(1)
    bars = orjson.loads(unpack(packed))["data"]
    drawn = sorted(x for bar in bars for x in bar["x"])
    assert drawn == sorted(round(k["delta_ns"] / 1e6, 3) for k in kernels[:20])
    assert {bar["name"] for bar in bars} <= {"slower", "faster", "added", "removed"}
    assert 'id="fig-breakdown-deltas"' in page


def test_an_analysis_saved_without_the_newer_columns_compares_on_the_common_parts(runner, tmp_path):
    """A 1.1 analysis (no copy/idle-split columns) against a run analysed now."""
    doc = orjson.loads(runner.invoke(cli, ["analyze", str(RUNS / "healthy_ddp"), "--format", "json"]).output)
    for row in doc["steps"]:
        for col in ("copy_ns", "idle_host_ns", "idle_kernel_ns", "idle_other_ns"):
            del row[col]
    doc["schema_version"] = "1.1"
    old = tmp_path / "old.json"
    old.write_bytes(orjson.dumps(doc))
    result = runner.invoke(cli, ["compare", str(old), str(RUNS / "healthy_ddp"), "--format", "json"])
    assert result.exit_code == 0, result.output
    cols = [c["column"] for c in orjson.loads(result.output)["changes"] if c["kind"] == "breakdown"]
    assert "idle_host_ns" not in cols
    assert "exposed_comm_ns" in cols
    doc.pop("kernels"), doc.pop("kernel_categories")
    old.write_bytes(orjson.dumps(doc))
    result = runner.invoke(cli, ["compare", str(old), str(RUNS / "healthy_ddp"), "--format", "json"])
    assert [c for c in orjson.loads(result.output)["changes"] if c["kind"] == "kernel"] == []


def test_compare_never_writes_over_an_input(runner, tmp_path):
    saved = tmp_path / "base.json"
    runner.invoke(cli, ["analyze", str(RUNS / "healthy_ddp"), "--format", "json", "-o", str(saved)])
    before = saved.read_bytes()
    result = runner.invoke(cli, ["compare", str(saved), str(RUNS / "comm_bound"), "-o", str(saved)])
    assert result.exit_code == 2
    assert "names an input file" in result.output
    assert saved.read_bytes() == before

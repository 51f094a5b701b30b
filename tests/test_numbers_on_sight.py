"""Numbers a user can trust on sight: impossible MFU refused, rank axes of exactly the ranks present,
counts that agree in number, and a legend for the text table."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest
from _reports import RUNS, traces
from conftest import FIXTURES

import tracediag
from tracediag.analysis import Finding
from tracediag.cli import cli
from tracediag.report import figures
from tracediag.report.text import COLUMNS, render_text

NSYS_GPU = sorted((FIXTURES / "nsys").glob("constructed_gpu_rank*.sqlite.gz"))
PLAN = ["--gpu", "h100-sxm", "--dp", "2", "--gpus", "2", "--seq-len", "2048", "--global-batch", "64"]


@pytest.fixture(scope="module")
def straggler():
    return tracediag.analyze(tracediag.load(traces(RUNS / "straggler_persistent"), jobs=1))


def test_mfu_above_100_percent_is_refused_with_the_reason(runner, tmp_path):
    """A plan for a far larger model than the run's (GPT-3 175B against a 2-GPU trace) would give an MFU of
    thousands of percent; the check says why it shows none."""
    plan = tmp_path / "plan.json"
    made = runner.invoke(cli, ["predict", "--model", "gpt3-175b", *PLAN, "-o", str(plan)])
    assert made.exit_code == 3, made.output  # 175B on 2 GPUs does not fit: saved, exit 3
    result = runner.invoke(cli, ["analyze", *map(str, NSYS_GPU), "-j", "1", "--plan", str(plan)])
    assert result.exit_code == 0, result.output
    (mfu,) = [line for line in result.stdout.splitlines() if line.strip().startswith("MFU")]
    observed = mfu.split()[1]
    assert observed == "-"
    assert "not shown: above 100%" in mfu
    assert "other work than this run" in mfu
    assert "note: observed MFU would exceed 100%" in result.stdout
    # the run's own size of model gives a plausible MFU, which is shown
    small = runner.invoke(cli, ["analyze", *map(str, NSYS_GPU), "-j", "1", "--model", "tiny", *PLAN])
    (mfu,) = [line for line in small.stdout.splitlines() if line.strip().startswith("MFU")]
    value = float(mfu.split()[1].rstrip("%"))
    assert 0 < value <= 100


@pytest.mark.parametrize("ranks", [(1, 3), (2,)])
def test_rank_axes_label_exactly_the_ranks_present(straggler, ranks):
    steps = straggler.steps.filter(pl.col("rank").is_in(list(ranks)))
    heat = figures.heatmap(steps, "dur_ns", "step time").figure
    assert tuple(heat.data[0].y) == tuple(str(r) for r in ranks)
    assert heat.layout.yaxis.type == "category"  # no ticks between or around the ranks
    bars = figures.breakdown(steps).figure
    assert all(tuple(t.x) == tuple(str(r) for r in ranks) for t in bars.data)
    assert bars.layout.xaxis.type == "category"


def test_binned_rank_axes_name_each_bin(straggler):
    wide = pl.concat(straggler.steps.with_columns(pl.col("rank") + 4 * k) for k in range(figures.MAX_ROWS // 2))
    heat = figures.heatmap(wide, "dur_ns", "step time").figure
    assert heat.data[0].y[:2] == ("0–1", "2–3")


def test_counts_agree_in_number(straggler):
    one = straggler.steps.filter((pl.col("rank") == 2) & (pl.col("step") == 5))
    finding = Finding("compute_straggler", (2,), (5,), 1_000_000, 0.9, "rank 2 computes 2x its peers")
    pair = Finding("comm_bound", (1, 3), (4, 6), 1_000_000, 0.5, "exposed communication")
    alone = dataclasses.replace(straggler, ranks=(2,), steps=one, findings=(finding, pair), excluded_steps=1)
    text = render_text(alone)
    assert text.startswith("tracediag analyze: 1 rank (world size 4), 1 step (5), 1 partial rank-step left out")
    assert "1. compute_straggler  rank 2  step 5  lost" in text
    assert "2. comm_bound  ranks 1, 3  steps 4, 6  lost" in text
    assert "4 ranks (world size 4), 8 steps (2..9), 0 partial rank-steps left out" in render_text(straggler)


def test_text_table_has_a_legend_for_every_column(straggler):
    lines = render_text(straggler).splitlines()
    (legend,) = [line for line in lines if line.startswith("columns: ")]
    header = lines[lines.index(legend) + 1]
    for _, label, _ in COLUMNS:
        assert f"{label} = " in legend
        assert label in header
    assert "max compute = " in legend
    assert "max compute" in header
    # the last column: the what-if replay of each step (the straggler run has a finding to price)
    assert "what-if = " in legend
    assert header.rstrip().endswith("max compute   what-if")


def test_utilisation_above_peak_is_refused_wherever_it_is_printed():
    from tracediag.units import of_peak

    assert of_peak("MFU", 0.4123) == "MFU 41.2%"
    assert of_peak("HFU", 1.0) == "HFU 100.0%"
    refused = of_peak("HFU", 3.2)
    assert refused.startswith("HFU not shown (320% of peak is impossible")
    assert "%)" not in refused[:12]

"""Issue 30 item 2: evidence with units and a sentence each; heat-map colours from the data, on real runs."""

from __future__ import annotations

import html

import pytest
from conftest import RUNS

import tracediag
from tracediag.report.evidence import SENTENCES, with_unit
from tracediag.report.figures import heatmap
from tracediag.report.html import render_html

VARIED = (
    "slow_node_6",
    "slow_link",
    "stage_imbalance",
    "sequence_imbalance",
    "input_bound",
    "pipeline_gpipe_m8",
    "healthy_ddp",
    "comm_bound",
    "host_late",
)


@pytest.fixture(scope="module")
def slow_node():
    return tracediag.analyze(tracediag.load(RUNS / "slow_node_6"))


def _row(page: str, key: str) -> str:
    return page.split(f'<td class="key">{key}</td>')[1].split("</tr>")[0]


def test_evidence_values_carry_their_units_and_a_sentence(slow_node):
    ev = slow_node.findings[0].evidence
    page = render_html(slow_node)
    row = _row(page, "peer_wait_ms_median")
    assert f"{ev['peer_wait_ms_median']:,.4g} ms" in row
    assert html.escape(SENTENCES["peer_wait_ms_median"]) in row
    assert f"{100 * ev['waiting_share']:.1f}%" in _row(page, "waiting_share")
    assert f"{ev['compute_ratio_median']:.2f}×" in _row(page, "compute_ratio_median")
    assert "step 2: " in _row(page, "compute_ratio_by_step")
    # the example: a share of the idle time, not ms
    assert with_unit("idle_waiting_on_host", 0.462) == "46.2%"


@pytest.mark.parametrize("name", VARIED)
def test_every_evidence_key_of_real_findings_has_a_sentence(name):
    analysis = tracediag.analyze(tracediag.load(RUNS / name))
    keys = {k for f in analysis.findings for k in f.evidence}
    assert keys
    assert keys - SENTENCES.keys() == set()


def test_heatmap_colours_run_from_the_lowest_to_the_highest_value(slow_node):
    steps = slow_node.steps
    fig = heatmap(steps, "dur_ns", "step time (ms)")
    trace = fig.figure.data[0]
    lo, hi = steps["dur_ns"].min() / 1e6, steps["dur_ns"].max() / 1e6
    assert trace.zmin == pytest.approx(lo, abs=0.01)
    assert trace.zmax == pytest.approx(hi, abs=0.01)
    assert f"from the lowest, {lo:,.1f} ms (pale), to the highest, {hi:,.1f} ms (dark)" in fig.caption

"""Each real 4-rank gloo run under fixtures/runs gets the verdict its manifest states (issue 3)."""

from __future__ import annotations

import json

import pytest
from conftest import LATENESS_PENDING, LOAD_PENDING, RUNS

import tracediag
from tracediag.analysis import Analysis
from tracediag.errors import TracediagError

SCENARIOS = sorted(p.parent.name for p in RUNS.glob("*/manifest.json"))
PENDING = {**LATENESS_PENDING, **LOAD_PENDING}
VERDICTS = [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=PENDING[n])) if n in PENDING else n for n in SCENARIOS
]
LOADS = [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=LOAD_PENDING[n])) if n in LOAD_PENDING else n
    for n in SCENARIOS
]


@pytest.fixture(scope="module")
def analyses() -> dict[str, tuple[Analysis, dict]]:
    out = {}
    for name in SCENARIOS:
        manifest = json.loads((RUNS / name / "manifest.json").read_text())
        try:
            run = tracediag.load(sorted(RUNS.glob(f"{name}/*.pt.trace.json.gz")), jobs=1)
        except TracediagError as e:  # re-raised by each test of this run (xfail while in LOAD_PENDING)
            out[name] = (e, manifest)
            continue
        out[name] = (tracediag.analyze(run), manifest)
    return out


def _analysis(analyses, name) -> tuple[Analysis, dict]:
    analysis, manifest = analyses[name]
    if isinstance(analysis, TracediagError):
        raise analysis
    return analysis, manifest


@pytest.mark.parametrize("name", VERDICTS, ids=str)
def test_verdict_ranks_and_steps_match_manifest(analyses, name):
    analysis, manifest = _analysis(analyses, name)
    causes = [f.cause for f in analysis.findings]
    if manifest["cause"] == "healthy":
        assert causes == ["healthy"]
        return
    if manifest.get("also"):  # two causes in one run: each with its ranks and steps
        expected = {(c["cause"], tuple(c["ranks"]), tuple(c["steps"])) for c in [manifest, *manifest["also"]]}
        assert {(f.cause, f.ranks, f.steps) for f in analysis.findings} == expected
        assert all(f.time_lost_ns > 0 and 0 < f.confidence <= 1 for f in analysis.findings)
        return
    assert causes == [manifest["cause"]]
    (finding,) = analysis.findings
    expected_ranks = manifest["ranks"] or manifest["affected_ranks"]
    assert list(finding.ranks) == expected_ranks
    assert list(finding.steps) == manifest["steps"]
    assert finding.time_lost_ns > 0
    assert 0 < finding.confidence <= 1


@pytest.mark.parametrize("name", LOADS, ids=str)
def test_every_complete_step_of_every_rank_is_in_the_table(analyses, name):
    analysis, manifest = _analysis(analyses, name)
    assert analysis.step_numbers == manifest["profiler_steps"]
    assert analysis.steps.height == manifest["world_size"] * len(manifest["profiler_steps"])
    s = analysis.steps
    assert (s["compute_ns"] + s["exposed_comm_ns"] + s["idle_ns"] <= s["dur_ns"]).all()
    assert (s["exposed_comm_ns"] <= s["comm_ns"]).all()


def test_straggler_evidence_shows_the_arrival_pattern(analyses):
    analysis, _ = analyses["straggler_persistent"]
    ev = analysis.findings[0].evidence
    assert ev["kind"] == "persistent"
    assert ev["compute_ratio_median"] > 1.3
    assert ev["peer_wait_ms_median"] > 10 * max(ev["own_wait_ms_median"], 1.0)
    assert ev["last_arrivals"] >= len(analysis.findings[0].steps)
    culprit = analysis.collectives["last_rank"].value_counts().sort("count")["last_rank"][-1]
    assert culprit == 2


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n.startswith("pipeline")], ids=str)
def test_pipeline_p_m_and_formula_from_the_trace(analyses, name):
    analysis, manifest = analyses[name]
    (pipe,) = analysis.pipelines
    details = manifest["details"]
    assert (pipe.p, pipe.m) == (details["num_stages"], details["n_microbatches"])
    assert pipe.ranks == (0, 1, 2, 3)
    assert pipe.expected_bubble_share == pytest.approx(details["expected_bubble_fraction"], abs=1e-3)
    measured = analysis.findings[0].evidence["idle_share_median"]
    assert measured >= pipe.expected_bubble_share - 0.05


def test_json_round_trip_keeps_findings_and_tables(analyses):
    analysis, _ = analyses["input_bound"]
    back = Analysis.from_dict(json.loads(json.dumps(analysis.to_dict())))
    assert back.findings == analysis.findings
    assert back.steps.equals(analysis.steps)
    assert back.collectives.height == analysis.collectives.height

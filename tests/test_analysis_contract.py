"""One typed result: `Analysis` and its sections are dataclasses; JSON only in `to_dict` / `from_dict`."""

from __future__ import annotations

import dataclasses
import importlib
import pickle

import orjson
import pytest
from _reports import RUNS, analysis_with_check, traces

import tracediag
from tracediag.analysis import CAUSES, Analysis, Cause, Finding, Pipeline
from tracediag.check_result import Check, CheckedPlan, Component
from tracediag.model.specs import Split


def _finding(**kw) -> Finding:
    args = {
        "cause": "comm_bound",
        "ranks": [0, 1],
        "steps": [3],
        "time_lost_ns": 5,
        "confidence": 0.5,
        "summary": "s",
        "evidence": {"share": 0.4, "by_step": {"3": 0.4}, "ranks": [0, 1]},
    }
    return Finding(**{**args, **kw})


def test_cause_is_validated_against_the_enum():
    with pytest.raises(ValueError, match=r"unknown cause 'comm-bound'; one of compute_straggler, comm_bound"):
        _finding(cause="comm-bound")
    f = _finding()
    assert f.cause is Cause.COMM_BOUND
    assert f.cause == "comm_bound"
    assert orjson.loads(orjson.dumps(f.to_dict()))["cause"] == "comm_bound"
    assert set(CAUSES) == {c.value for c in Cause}
    assert "host_bound" in CAUSES


def test_a_built_finding_cannot_change():
    f = _finding()
    with pytest.raises(TypeError):
        f.evidence["share"] = 0.9  # type: ignore[index]
    with pytest.raises(TypeError):
        f.evidence["by_step"]["3"] = 0.9  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.summary = "other"  # type: ignore[misc]
    assert f.ranks == (0, 1)
    assert f.evidence["ranks"] == (0, 1)
    # a dict the caller keeps does not reach into the finding
    evidence = {"share": 0.4}
    g = _finding(evidence=evidence)
    evidence["share"] = 0.9
    assert g.evidence["share"] == 0.4


def test_finding_json_round_trip_is_exact_and_it_pickles():
    f = _finding(confidence=0.123456)
    d = f.to_dict()
    assert d["evidence"] == {"share": 0.4, "by_step": {"3": 0.4}, "ranks": [0, 1]}
    assert Finding.from_dict(orjson.loads(orjson.dumps(d))) == dataclasses.replace(f, confidence=0.123)
    back = pickle.loads(pickle.dumps(f))
    assert back == f
    assert back.confidence == 0.123456
    with pytest.raises(TypeError):
        back.evidence["share"] = 1  # type: ignore[index]


@pytest.fixture(scope="module")
def pipeline_with_check() -> Analysis:
    return analysis_with_check(traces(RUNS / "pipeline_gpipe_m8"), Split(pp=4))


def test_typed_sections_and_their_json_round_trip(pipeline_with_check):
    a = pipeline_with_check
    assert not hasattr(a, "extra")
    (pipe,) = a.pipelines
    assert isinstance(pipe, Pipeline)
    assert pipe.p == 4
    assert [s.stage for s in pipe.stages] == [0, 1, 2, 3]
    assert isinstance(a.check, Check)
    assert isinstance(a.check.plan, CheckedPlan)
    assert a.check.plan.gpus == 4
    assert dict(a.check.plan.split)["pp"] == 4
    assert all(isinstance(c, Component) for c in a.check.components)
    d = orjson.loads(orjson.dumps(a.to_dict()))
    assert d["pipeline"][0]["p"] == 4
    assert d["check"]["plan"]["split"]["pp"] == 4
    assert d["check"]["components"][0]["label"] == "step time"
    back = Analysis.from_dict(d)
    assert back.pipelines == a.pipelines
    assert back.check == a.check
    assert back.findings == a.findings
    assert back.to_dict() == d


def test_a_later_minor_version_reads_and_another_major_is_refused(pipeline_with_check):
    d = orjson.loads(orjson.dumps(pipeline_with_check.to_dict()))
    later = {**d, "schema_version": "1.9", "a_new_section": {"x": 1}}
    assert Analysis.from_dict(later).findings == pipeline_with_check.findings
    with pytest.raises(ValueError, match=r"schema_version '2\.0'"):
        Analysis.from_dict({**d, "schema_version": "2.0"})


def test_facade_exports_the_functions_and_no_module_shadows_one():
    for name in ("load", "analyze", "predict", "plan", "check", "load_prediction"):
        assert callable(getattr(tracediag, name))
        assert not isinstance(getattr(tracediag, name), type(tracediag))
    assert tracediag.analyze is importlib.import_module("tracediag.reduce").analyze
    assert tracediag.check is importlib.import_module("tracediag.observed_vs_predicted").check
    assert issubclass(tracediag.NoStepsError, tracediag.TracediagError)
    assert tracediag.NoStepsError.__module__ == "tracediag.errors"
    assert set(tracediag.__all__) <= set(dir(tracediag))


def test_renderers_read_the_typed_check(pipeline_with_check):
    from tracediag.report.check_text import render_check_text

    text = render_check_text(pipeline_with_check.check)
    assert text.startswith("observed vs predicted (tiny on 4 x a100-80gb, tp=1 pp=4 dp=1")
    assert pipeline_with_check.check.sentence in text


def test_the_document_written_a_few_rows_at_a_time_is_orjsons_bytes(pipeline_with_check, monkeypatch):
    from tracediag.report import analyses

    a = pipeline_with_check
    assert a.steps.height > 3  # several slices of each table
    assert a.kernels.height > 3
    monkeypatch.setattr(analyses, "ROWS_AT_ONCE", 3)
    whole = orjson.dumps(a.to_dict(), option=orjson.OPT_APPEND_NEWLINE)
    assert analyses.analyses_json_bytes([("", a)]) == whole
    per_file = analyses.analyses_json_bytes([("a.json", a), ("b.json", a)], newline=False)
    both = [{"file": p, **a.to_dict()} for p in ("a.json", "b.json")]
    assert per_file == orjson.dumps({"per_file": both})

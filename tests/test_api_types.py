"""The public API's boundary (issue 29 item 4): every name of `tracediag.__all__`, and every function and
class docs/api.md documents, refuses an argument of the wrong type in one line that names it (`TypeError`),
or the input (`TracediagError`), before any work; never an AttributeError, a KeyError or a polars error from
inside. Valid calls on real fixtures still work.

The cases enumerate `tracediag.__all__` and the names docs/api.md documents, and every parameter of each
signature: a public name or parameter without a case here fails."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl
import pytest
from conftest import FIXTURES, ROOT

import tracediag
from tracediag.errors import TracediagError, shown
from tracediag.ingest.flight import read_dumps
from tracediag.ingest.gemms import gemm_table
from tracediag.model.calibrate import calibrate_from_step_time
from tracediag.model.specs import Split, Training, resolve_device, resolve_model
from tracediag.model.stack import resolve_engine

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

RUN = FIXTURES / "runs" / "healthy_ddp"
DUMPS = FIXTURES / "hang" / "host_stuck"
GEMM_RUN = FIXTURES / "model_runs" / "transformer_dp4"  # a GPU run profiled with its GEMMs' shapes
WATCHED = FIXTURES / "watch" / "straggler_from3"
MISSING = "no/such/dir/rank0.json"

ERRORS = {"MixedRunError", "NoStepsError", "RankError", "SpecError", "TraceError", "TracediagError"}
"""Exceptions take any message, as Python's do: checked to be `TracediagError`s with one-line messages."""


@dataclass
class Real:
    """Each public result, made from real fixtures through the public API (the valid calls)."""

    run: tracediag.Run
    analysis: tracediag.Analysis
    prediction: Any
    check: tracediag.Check
    hang: tracediag.HangReport
    window: tracediag.Window
    plan_path: Path
    profile: Any
    profile_path: Path
    gemms: pl.DataFrame
    dumps: Any
    model: Any = field(default_factory=lambda: resolve_model("tiny"))
    device: Any = field(default_factory=lambda: resolve_device("a100-80gb"))
    engine: Any = field(default_factory=lambda: resolve_engine("megatron-core"))


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Real:
    run = tracediag.load(RUN, jobs=1)
    analysis = tracediag.analyze(run)
    model, device, engine = resolve_model("tiny"), resolve_device("a100-80gb"), resolve_engine("megatron-core")
    prediction = tracediag.predict(model, device, Split(dp=4), Training(seq_len=512, global_batch=16), engine)
    folder = tmp_path_factory.mktemp("api_types")
    plan_path, profile_path = folder / "plan.json", folder / "profile.json"
    prediction.save(plan_path)
    profile = calibrate_from_step_time(
        model, device, prediction.split, prediction.training, engine, step_time_s=2 * prediction.step_time_s
    )
    profile.save(profile_path)
    (window,) = list(tracediag.watch(WATCHED, once=True, poll_seconds=0.01, max_windows=1))
    return Real(
        run=run,
        analysis=analysis,
        prediction=prediction,
        check=tracediag.check(analysis, prediction, run=run),
        hang=tracediag.hang(DUMPS),
        window=window,
        plan_path=plan_path,
        profile=profile,
        profile_path=profile_path,
        gemms=gemm_table(sorted(str(p) for p in GEMM_RUN.glob("*.json.gz"))),
        dumps=read_dumps(str(DUMPS)),
    )


def _bad(real: Real) -> dict[str, object]:
    """The wrong values fed to every parameter: `ts_str` is the real run's event table with `ts` as strings."""
    return {
        "None": None,
        "int": 7,
        "float": 3.5,
        "dict": {"a": 1},
        "frame": pl.DataFrame({"x": [1]}),
        "ts_str": real.run.events.with_columns(pl.col("ts").cast(pl.String)),
        "empty": [],
        "missing": MISSING,
        "bytes": b"rank0.json",
    }


def _fields(obj: object) -> dict[str, object]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


@dataclass(frozen=True)
class Case:
    """A public callable: the keyword arguments of a valid call, and per parameter the wrong values of
    `_bad` that are in fact of its type (an optional's None, a path str, an empty tuple): not probed."""

    valid: Callable[[Real], dict[str, object]]
    accepts: dict[str, str] = field(default_factory=dict)
    params: tuple[str, ...] | None = None
    """The parameters, where the signature does not say them (an enum's call)."""
    bound: Callable[[Real], Callable[..., object]] | None = None
    """A method: the bound method of a real object it is called on."""


def _spec_args(r: Real) -> dict[str, object]:
    """The real specs of one prediction, as `predict` and the calibrations take them."""
    return {
        "model": r.model,
        "device": r.device,
        "split": r.prediction.split,
        "training": r.prediction.training,
        "engine": r.engine,
    }


OPT_STR = "None missing"
OPT_NUM = "None int float"
NUM = "int float"
OPT_INT = "None int"
OPT_MAP = "None dict"
TUPLE = "empty"
PATHS = "missing"

CASES: dict[str, Case] = {
    "load": Case(
        lambda r: {"sources": RUN, "jobs": 1},
        {
            "sources": PATHS,
            "jobs": "int",
            "rank_from_filename": OPT_STR,
            "rank_map": OPT_MAP,
            "on_file_done": "None",
            "storage_options": OPT_MAP,
            "comm_kernel": OPT_STR,
        },
    ),
    "analyze": Case(
        lambda r: {"run": r.run},
        {"step_regex": OPT_STR, "link_gbps": OPT_NUM, "thresholds": "None"},
    ),
    "check": Case(lambda r: {"analysis": r.analysis, "prediction": r.prediction, "run": r.run}, {"run": "None"}),
    "hang": Case(
        lambda r: {"sources": DUMPS},
        {
            "sources": PATHS,
            "world_size": OPT_INT,
            "rank_from_filename": OPT_STR,
            "storage_options": OPT_MAP,
            "max_bytes": "int",
            "max_entries": "int",
            "jobs": "int",
            "traces": "None missing empty",
        },
    ),
    "load_prediction": Case(lambda r: {"path": r.plan_path}, {"path": PATHS}),
    "plan": Case(
        lambda r: {
            "model": r.model,
            "device": r.device,
            "engine": r.engine,
            "gpus": 4,
            "seq_len": 512,
            "global_batch": 16,
        },
        {
            "gpus": "int",
            "seq_len": "int",
            "global_batch": "int",
            "top": "int",
            "headroom": NUM,
            "target": OPT_STR,
            "grad_bytes": "int",
            "dtype": "missing",
        },
    ),
    "predict": Case(
        _spec_args,
        {"gpus": OPT_INT},
    ),
    "watch": Case(
        lambda r: {"location": WATCHED, "once": True},
        {
            "location": PATHS,  # a job's folder may not be there yet: the watch waits for it
            "poll_seconds": NUM,
            "window_timeout": NUM,
            "max_windows": OPT_INT,
            "state": OPT_STR,
            "baseline_windows": "int",
            "slower": NUM,
            "min_confidence": NUM,
            "step_regex": OPT_STR,
            "thresholds": "None",
            "rank_from_filename": OPT_STR,
            "rank_map": OPT_MAP,
            "storage_options": OPT_MAP,
            "on_notice": "None",
            "stop": "None",
            "prediction": "None",
        },
    ),
    "Run": Case(lambda r: _fields(r.run)),
    "RunMeta": Case(lambda r: _fields(r.run.meta), {"files": TUPLE, "errors": TUPLE, "ignored": TUPLE}),
    "Analysis": Case(
        lambda r: _fields(r.analysis),
        {
            "ranks": TUPLE,
            "world_size": "int",
            "steps": "frame ts_str",  # no table schema is asked of the results' frames
            "collectives": "frame ts_str",
            "findings": TUPLE,
            "excluded_steps": "int",
            "warnings": TUPLE,
            "pipelines": TUPLE,
            "check": "None",
            "whatif": "None",
            "kernels": "None frame ts_str",
            "kernel_categories": "None frame ts_str",
            "lateness": "None",
        },
    ),
    "Finding": Case(
        lambda r: _fields(r.analysis.findings[0]),
        {
            "cause": "missing",  # a str: an unknown cause is a ValueError (docs/api.md)
            "ranks": TUPLE,
            "steps": TUPLE,
            "time_lost_ns": "int",
            "confidence": NUM,
            "summary": "missing",
            "evidence": "dict",
            "step_time_without_ns": OPT_INT,
            "whatif": "missing",
            "whatif_withheld": "missing",
        },
    ),
    "Cause": Case(lambda r: {"value": "healthy"}, {"value": "missing"}, params=("value",)),
    "Check": Case(
        lambda r: _fields(r.check),
        {"components": TUPLE, "links": TUPLE, "sentence": "missing", "notes": TUPLE},
    ),
    "HangReport": Case(
        lambda r: _fields(r.hang),
        {
            "sentence": "missing",
            "culprit_ranks": TUPLE,
            "culprit_group": OPT_STR,
            "culprit_seq": OPT_INT,
            "culprit_op": OPT_STR,
            "world": TUPLE,
            "dumped_ranks": TUPLE,
            "missing_dumps": TUPLE,
            "groups": TUPLE,
            "frames": TUPLE,
            "joins": TUPLE,
            "activity": TUPLE,
            "notes": TUPLE,
            "skipped": "dict",
        },
    ),
    "Window": Case(
        lambda r: _fields(r.window),
        {
            "index": "int",
            "key": "missing",
            "steps": TUPLE,
            "ranks": TUPLE,
            "missing_ranks": TUPLE,
            "start_ns": "int",
            "end_ns": "int",
            "step_seconds": OPT_NUM,
            "findings": TUPLE,
            "mfu": OPT_NUM,
            "mfu_predicted": OPT_NUM,
            "mfu_note": "missing",
            "waited_for": TUPLE,
            "changes": TUPLE,
            "warnings": TUPLE,
            "error": "missing",
            "files": TUPLE,
            "analysis_seconds": NUM,
        },
    ),
}


SPEC_NAME = "missing"  # a name of no engine or device: the model's SpecError, with its hint of the names
MODEL = "tracediag.model"

DOCUMENTED: dict[str, Case] = {
    "tracediag.compare.compare": Case(lambda r: {"base": r.analysis, "new": r.analysis}),
    "tracediag.report.text.render_text": Case(lambda r: {"analysis": r.analysis}),
    "tracediag.report.notebook.render_notebook_html": Case(lambda r: {"obj": r.analysis}),
    "tracediag.execute.driver.analyze_ranks": Case(
        lambda r: {"sources": RUN},
        {"sources": PATHS, "out": OPT_STR, "step_regex": OPT_STR, "link_gbps": OPT_NUM},
    ),
    "tracediag.execute.driver.analyze_ranks_per_file": Case(
        lambda r: {"sources": RUN},
        {"sources": PATHS, "out": OPT_STR, "step_regex": OPT_STR, "link_gbps": OPT_NUM},
    ),
    "tracediag.desync.analyze_dumps": Case(lambda r: {"dumps": r.dumps}, {"world_size": OPT_INT}),
    "tracediag.ingest.flight.read_dumps": Case(
        lambda r: {"sources": str(DUMPS)},
        {
            "sources": PATHS,
            "rank_from_filename": OPT_STR,
            "storage_options": OPT_MAP,
            "max_bytes": "int",
            "max_entries": "int",
            "jobs": "int",
        },
    ),
    "tracediag.ingest.gemms.gemm_table": Case(lambda r: {"paths": []}, {"paths": "empty"}),
    "tracediag.same_run.split_by_file": Case(lambda r: {"run": r.run}),
    "tracediag.schema.conform": Case(
        lambda r: {"df": r.run.events},
        # any frame is conformed: missing columns become nulls, rows without a usable ts/dur are counted
        {"df": "frame ts_str", "skipped": OPT_MAP, "warnings": "None empty"},
    ),
    f"{MODEL}.stack.resolve_engine": Case(lambda r: {"name": "megatron-core"}, {"name": SPEC_NAME}),
    f"{MODEL}.specs.resolve_device": Case(lambda r: {"name": "a100-80gb"}, {"name": SPEC_NAME}),
    f"{MODEL}.specs.resolve_model": Case(lambda r: {"name_or_path": "tiny"}),
    f"{MODEL}.specs.Split": Case(
        lambda r: {}, {**{k: "int" for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "zero")}, "etp": "None int"}
    ),
    f"{MODEL}.specs.Training": Case(
        lambda r: {"seq_len": 512, "global_batch": 16},
        {"seq_len": "int", "global_batch": "int", "micro_batch": "int", "grad_bytes": "int"},
    ),
    f"{MODEL}.calibrate.apply_profile": Case(lambda r: {"device": r.device, "profile": r.profile}),
    f"{MODEL}.calibrate.calibrate_from_step_time": Case(
        lambda r: {**_spec_args(r), "step_time_s": 0.05},
        {"step_time_s": NUM, "gpus": OPT_INT, "source": "missing"},
    ),
    f"{MODEL}.calibrate.load_profile": Case(lambda r: {"path": r.profile_path}, {"path": PATHS}),
    f"{MODEL}.calibrate.calibrate_from_trace": Case(
        lambda r: {"gemms": r.gemms, "analysis": r.analysis, "device": r.device, "engine": r.engine},
        {"groups": OPT_MAP, "model": "None", "split": "None", "training": "None"},
    ),
}
"""The functions and classes docs/api.md documents beyond `tracediag.__all__`, by the path it gives them."""
CASES.update(DOCUMENTED)


def documented_api() -> set[str]:
    """What docs/api.md documents beyond `tracediag.__all__`: the functions and classes its examples
    import, those it names in full (`tracediag.same_run.split_by_file`), and the calls it shows of a name
    of a module an example imports (`calibrate_from_trace(...)`)."""
    text = (ROOT / "docs" / "api.md").read_text()
    found, modules = set(), set()
    for module, names in re.findall(r"^from (tracediag[\w.]*) import ([\w, ]+)$", text, flags=re.M):
        modules.add(module)
        found |= {f"{module}.{n.strip()}" for n in names.split(",")}
    found |= set(re.findall(r"\btracediag(?:\.\w+)+", text))
    found |= {f"{m}.{call}" for call in re.findall(r"`(\w+)\(", text) for m in modules}
    return {name for name in found if _is_api(name)} - {f"tracediag.{n}" for n in tracediag.__all__}


def _is_api(name: str) -> bool:
    module, _, attr = name.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return False
    return callable(obj) and not inspect.ismodule(obj)


def _target(name: str) -> Any:
    """The object a dotted path names: ``load``, ``tracediag.model.specs.Split``, ``tracediag.Run.save``."""
    parts = name.split(".") if name.startswith("tracediag.") else ["tracediag", *name.split(".")]
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def _unwrapped(obj: object) -> object:
    obj = getattr(obj, "__func__", obj)
    return getattr(obj, "__wrapped__", obj)


def _params(name: str) -> list[str]:
    case = CASES.get(name)
    if case is not None and case.params is not None:
        return list(case.params)
    sig = inspect.signature(_target(name))
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in sig.parameters.values() if p.kind not in skip and p.name != "self"]


METHODS: dict[str, Case] = {
    "tracediag.Run.save": Case(
        lambda r: {"path": r.plan_path.with_name("run.parquet")}, {"path": PATHS}, bound=lambda r: r.run.save
    ),
    "tracediag.model.calibrate.Profile.save": Case(
        lambda r: {"path": r.profile_path}, {"path": PATHS}, bound=lambda r: r.profile.save
    ),
    "tracediag.Analysis.from_dict": Case(
        lambda r: {"d": r.analysis.to_dict()}, {"d": "dict"}, bound=lambda r: tracediag.Analysis.from_dict
    ),
    "tracediag.Window.from_dict": Case(
        lambda r: {"d": r.window.to_dict()}, {"d": "dict"}, bound=lambda r: tracediag.Window.from_dict
    ),
    "tracediag.Window.slower_than": Case(
        lambda r: {"ratio": 0.1}, {"ratio": NUM, "confidence": NUM}, bound=lambda r: r.window.slower_than
    ),
}
"""The methods the docs show taking arguments (docs/api.md, docs/watch.md); a wrong type of dict (its
keys or values) is the method's own error, not probed here."""
CASES.update(METHODS)

PROBES = [
    (name, param)
    for name in sorted(set(tracediag.__all__) - ERRORS | set(DOCUMENTED) | set(METHODS))
    for param in _params(name)
]


def test_every_public_name_has_a_case():
    assert set(tracediag.__all__) - ERRORS | documented_api() | set(METHODS) == set(CASES)
    for name, case in CASES.items():
        assert set(case.accepts) <= set(_params(name)), f"{name}: accepts names no parameter"


@pytest.mark.parametrize(("name", "param"), PROBES, ids=[f"{n}-{p}" for n, p in PROBES])
def test_a_wrong_argument_is_one_line_naming_it(real, name, param):
    case = CASES[name]
    accepted = case.accepts.get(param, "").split()
    target = case.bound(real) if case.bound else _target(name)
    failures = []
    for bad_id, bad in _bad(real).items():
        if bad_id in accepted:
            continue
        kwargs = {**case.valid(real), param: bad}
        try:
            out = target(**kwargs)
        except (TypeError, TracediagError) as e:
            message = str(e)
            named = f"`{param}`" in message or (bad_id == "missing" and MISSING in message)
            if type(e) is TypeError and not _names(message.split(": ")[0], target):
                failures.append(f"{bad_id}: a TypeError from inside ({message})")
            elif "\n" in message or not named:
                failures.append(f"{bad_id}: {message!r} is not one line naming `{param}`")
        except Exception as e:
            failures.append(f"{bad_id}: {type(e).__name__}: {e}")
        else:
            failures.append(f"{bad_id}: accepted ({type(out).__name__})")
    assert not failures, f"{name}({param}=...): " + "; ".join(failures)


def _names(prefix: str, target: object) -> bool:
    """Whether a message's `prefix` is the path of `target` (the function as its module holds it)."""
    try:
        named = _target(prefix)
    except (ImportError, AttributeError, ValueError):
        return False
    return _unwrapped(named) is _unwrapped(target)


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_the_errors_are_tracediag_errors(name):
    assert issubclass(getattr(tracediag, name), TracediagError)


def test_a_trace_error_is_one_line_whatever_it_is_given(real):
    for bad in _bad(real).values():
        message = str(tracediag.TraceError(bad, bad))
        assert "\n" not in message
        assert message.startswith(f"{shown(bad)}: ")


def test_the_valid_calls_give_the_real_results(real):
    """The values the fixtures' manifests state, through the checked entry points."""
    assert real.run.meta.ranks == [0, 1, 2, 3]
    assert [f.cause for f in real.analysis.findings] == ["healthy"]
    assert dict(real.check.plan.split)["dp"] == 4
    assert real.hang.verdict == "hang"
    assert real.hang.culprit_ranks == (2,)
    assert real.window.index == 1
    assert real.window.ranks == (0, 1, 2, 3)
    assert tracediag.load_prediction(real.plan_path) == real.prediction
    assert tracediag.Cause("comm_bound") is tracediag.Cause.COMM_BOUND


def test_the_documented_calls_give_the_real_results(real):
    """docs/api.md's functions beyond `__all__`, through their checked entry points, on the real fixtures."""
    assert _target("tracediag.compare.compare")(real.analysis, real.analysis).step_time_delta_ns == 0
    assert _target("tracediag.desync.analyze_dumps")(real.dumps).culprit_ranks == (2,)
    parts = _target("tracediag.same_run.split_by_file")(real.run)
    assert [run.meta.ranks for _, run in parts] == [[0], [1], [2], [3]]
    assert _target("tracediag.schema.conform")(real.run.events).equals(real.run.events)
    assert real.gemms["path"].n_unique() == 4
    gemm_analysis = tracediag.analyze(tracediag.load(GEMM_RUN, jobs=1))
    calibrate_from_trace = _target(f"{MODEL}.calibrate.calibrate_from_trace")
    profile = calibrate_from_trace(real.gemms, gemm_analysis, real.device, real.engine)
    assert "compute" in profile.calibrated
    assert _target(f"{MODEL}.calibrate.load_profile")(real.profile_path) == real.profile
    applied = _target(f"{MODEL}.calibrate.apply_profile")(real.device, real.profile)
    assert applied.gemm_efficiency == pytest.approx(real.device.gemm_efficiency * real.profile.compute_scale)
    assert _target(f"{MODEL}.specs.Split")(dp=4, tp=2).gpus == 8


def test_a_gemm_table_without_its_columns_names_them(real):
    calibrate_from_trace = _target(f"{MODEL}.calibrate.calibrate_from_trace")
    with pytest.raises(
        TracediagError, match=r"^tracediag.model.calibrate.calibrate_from_trace: `gemms` lacks the GEMM"
    ):
        calibrate_from_trace(real.gemms.drop("seconds"), real.analysis, real.device, real.engine)


@pytest.mark.parametrize("name", ["Run", "RunMeta", "Analysis", "Finding", "Check", "HangReport", "Window"])
def test_a_result_rebuilt_from_its_fields_is_built(real, name):
    """The constructors' checks accept every real result's own fields (DataFrames compared by identity)."""
    kwargs = CASES[name].valid(real)
    rebuilt = getattr(tracediag, name)(**kwargs)
    for key, value in kwargs.items():
        got = getattr(rebuilt, key)
        assert got is value or got == value, key


def test_an_event_table_with_ts_as_strings_names_the_column(real):
    events = real.run.events.with_columns(pl.col("ts").cast(pl.String))
    with pytest.raises(
        TracediagError,
        match=r"^tracediag.Run: `events` has event-table columns of another dtype: ts is String, not Int64 \(",
    ):
        tracediag.Run(events=events, meta=real.run.meta)


def test_a_run_without_ts_and_dur_names_them(real):
    """A real run's table with `ts` and `dur` dropped: refused when the Run is built, not with polars'
    ColumnNotFoundError in the analysis."""
    with pytest.raises(TracediagError, match=r"^tracediag.Run: `events` lacks the event-table columns ts, dur \("):
        tracediag.Run(events=real.run.events.drop("ts", "dur"), meta=real.run.meta)


def test_the_message_says_what_was_asked_and_given():
    with pytest.raises(TypeError, match=r"^tracediag.analyze: `run` must be a Run; got int$"):
        tracediag.analyze(7)
    with pytest.raises(
        TypeError,
        match=r"^tracediag.load: `sources` must be a str, a path or a list of str or path; got a list of int$",
    ):
        tracediag.load([1, 2])
    with pytest.raises(TypeError, match=r"^tracediag.Finding: `ranks` must be a list of int; got a tuple of str$"):
        tracediag.Finding(cause="healthy", ranks=("0",), steps=(), time_lost_ns=0, confidence=1.0, summary="")


def test_the_messages_api_md_shows_are_the_real_ones():
    """docs/api.md's examples of the message, each made here by the call it describes."""
    doc = (ROOT / "docs" / "api.md").read_text()
    calls = [
        lambda: tracediag.analyze(pl.DataFrame({"x": [1]})),
        lambda: tracediag.load(b"rank0.json"),
        lambda: tracediag.Finding(cause="healthy", ranks=("0",), steps=(), time_lost_ns=0, confidence=1.0, summary=""),
        lambda: tracediag.load(),
    ]
    for call in calls:
        with pytest.raises(TypeError) as e:
            call()
        assert f"\n{e.value}\n" in doc

"""Chrome traces in the JSON Array form and the 2021 Kineto layout, on both decode paths.

The Array form is a real torch 2.13 trace's events written as a bare `[...]`; the 2021 layout is the
profiler's own ResNet-50 samples (../shared/trace-samples/gpu-public/resnet50_v100_2021, read when present).
"""

from __future__ import annotations

import gzip
import json
from typing import TYPE_CHECKING

import polars as pl
import pytest
from conftest import FIXTURES, SAMPLES, needs_shared
from polars.testing import assert_frame_equal

import tracediag
from tracediag.errors import TracediagError
from tracediag.ingest import chrome, native
from tracediag.ingest.read import read_file
from tracediag.vocab import canonical_category

if TYPE_CHECKING:
    from pathlib import Path

REAL = FIXTURES / "runs/healthy_ddp/rank0.pt.trace.json.gz"
RESNET = SAMPLES / "gpu-public/resnet50_v100_2021"


def _events() -> list:
    return json.loads(gzip.decompress(REAL.read_bytes()))["traceEvents"]


def _read(path: Path, *, scanner: bool, monkeypatch: pytest.MonkeyPatch, **kw):
    with monkeypatch.context() as m:
        if not scanner:
            m.setattr(native, "_chromescan", None)
        try:
            return read_file(path, **kw)
        except TracediagError as e:
            return str(e)


def _both(path: Path, monkeypatch: pytest.MonkeyPatch, **kw):
    scanned, decoded = (_read(path, scanner=s, monkeypatch=monkeypatch, **kw) for s in (True, False))
    assert type(scanned) is type(decoded), (scanned, decoded)
    if isinstance(scanned, str):
        assert scanned == decoded
    else:
        assert_frame_equal(scanned.events, decoded.events)
        assert scanned.meta == decoded.meta
    return scanned


# ------------------------------------------------------------------------------------------ Array form


@pytest.mark.parametrize("chunk", [chrome.CHUNK_BYTES, 20_000])
def test_array_form_of_a_real_trace_reads_as_its_object_form(tmp_path, monkeypatch, chunk):
    """The same events, as a bare array (whole, and cut into pieces), give the object form's rows on
    both paths; only what the array cannot hold (distributedInfo, baseTimeNanoseconds) is missing."""
    monkeypatch.setattr(chrome, "CHUNK_BYTES", chunk)
    path = tmp_path / "array.json"
    path.write_text(json.dumps(_events(), indent=1))
    arr = _both(path, monkeypatch, rank=0)
    obj = read_file(REAL)
    assert native.Scanner().feed(path.read_bytes(), True) is not None  # the scanner answers, not only msgspec
    assert arr.events.height == obj.events.height > 2000
    cols = ["name", "kind", "dur", "tid", "coll_op"]
    assert_frame_equal(arr.events.select(cols), obj.events.select(cols))
    base = json.loads(gzip.decompress(REAL.read_bytes()))["baseTimeNanoseconds"]
    assert (obj.events["ts"] - arr.events["ts"]).unique().to_list() == [base]
    assert arr.meta.time_base == "relative"
    assert arr.meta.skipped == obj.meta.skipped


def test_array_form_analyzes_like_the_object_form(tmp_path):
    path = tmp_path / "array.json"
    path.write_text(json.dumps(_events()))
    steps = tracediag.analyze(tracediag.load(path)).steps
    assert steps["step"].to_list() == list(range(2, 10))


@pytest.mark.parametrize("content", [b"[]", b"  [ \n ]  ", b'{"traceEvents": []}'])
def test_an_empty_event_list_is_read_as_no_events_on_both_paths(tmp_path, monkeypatch, content):
    """Was an IndexError on the scanner path (no piece of rows to join)."""
    path = tmp_path / "empty.json"
    path.write_bytes(content)
    ft = _both(path, monkeypatch, default_rank=0)
    assert ft.events.height == 0
    assert ft.meta.events_in == 0


def test_a_truncated_array_keeps_its_complete_events_on_both_paths(tmp_path, monkeypatch):
    text = json.dumps(_events())
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) * 2 // 3])
    ft = _both(path, monkeypatch, rank=0)
    assert ft.meta.skipped["truncated"] == 1
    assert ft.events.height + sum(ft.meta.skipped.values()) == ft.meta.events_in
    assert 1000 < ft.events.height < read_file(REAL).events.height
    assert any("ends early" in w for w in ft.meta.warnings)


def test_non_objects_in_an_array_are_counted_and_an_array_of_none_refused(tmp_path, monkeypatch):
    events = _events()[:60]
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps([*events, 1, "x", None]))
    ft = _both(mixed, monkeypatch, rank=0)
    assert ft.meta.skipped["malformed"] == 3
    assert ft.meta.events_in == 63
    numbers = tmp_path / "numbers.json"
    numbers.write_bytes(b"[1, 2, 3]")
    assert _both(numbers, monkeypatch, rank=0) == f"{numbers}: not a trace: a JSON array without event objects"


# ----------------------------------------------------------------------------------- 2021 Kineto layout


@pytest.mark.parametrize(
    ("cat", "canonical"),
    [("Operator", "cpu_op"), ("Kernel", "kernel"), ("Runtime", "cuda_runtime"), ("Memcpy", "gpu_memcpy"),
     ("Memset", "gpu_memset"), ("cpu_op", "cpu_op"), ("KERNEL", "kernel"), ("Trace", "Trace"), ("xla", "xla")],
)  # fmt: skip
def test_canonical_category(cat, canonical):
    assert canonical_category(cat) == canonical


def test_a_digit_string_tid_is_its_integer_on_both_paths(tmp_path, monkeypatch):
    """One parser rule: `"tid": "25738"` (the 2021 layout) is thread 25738; `"stream 7"` is no thread
    id (a device row's stream is in its args); an escaped digit string reads the same on both paths."""
    rows = [
        {"ph": "X", "cat": "Operator", "name": "aten::add", "pid": 1, "tid": "25738", "ts": 10, "dur": 5},
        {"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": "stream 7", "ts": 11, "dur": 2,
         "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "Operator", "name": "aten::mul", "pid": 1, "tid": 25772, "ts": 20, "dur": 5},
    ]  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps(rows))
    ft = _both(path, monkeypatch, rank=0)
    assert ft.events.sort("ts")["tid"].to_list() == [25738, None, 25772]
    assert ft.events.sort("ts")["stream"].to_list() == [None, 7, None]
    escaped = tmp_path / "escaped.json"
    escaped.write_text(json.dumps(rows).replace('"25738"', '"\\u00325738"'))
    assert _both(escaped, monkeypatch, rank=0).events.sort("ts")["tid"].to_list() == [25738, None, 25772]


def _resnet(workers: int) -> Path:
    return next((RESNET / f"resnet50_num_workers_{workers}").glob("*.pt.trace.json.gz"))


@needs_shared(RESNET)
def test_2021_layout_reads_its_steps_kinds_and_threads(monkeypatch):
    """`Operator`/`Kernel`/`Runtime`/`Memcpy`/`Memset` are the kinds today's names give; the
    `ProfilerStep#N` ranges (an `Operator` in 2021) are steps; host threads keep their ids."""
    ft = _both(_resnet(0), monkeypatch, default_rank=0)
    ev = ft.events
    counts = dict(ev.group_by("kind").len().iter_rows())
    raw = json.loads(gzip.decompress(_resnet(0).read_bytes()))["traceEvents"]
    by_cat = {c: sum(1 for e in raw if e.get("ph") == "X" and e.get("cat") == c) for c in ("Kernel", "Runtime")}
    assert counts["kernel"] == by_cat["Kernel"]
    assert counts["runtime"] == by_cat["Runtime"]
    assert counts["memcpy"] == 12
    assert counts["memset"] == 312
    steps = ev.filter(pl.col("kind") == "step")["name"].cast(pl.String).sort().to_list()
    assert steps == [f"ProfilerStep#{n}" for n in range(16, 22)]
    kernels = ev.filter(pl.col("kind") == "kernel")
    assert kernels["device"].unique().to_list() == [0]
    assert kernels["stream"].null_count() == 0
    assert set(ev.filter(pl.col("kind") == "cpu_op")["tid"].unique().to_list()) == {25738, 25772}


@needs_shared(RESNET)
def test_2021_resnet_pair_the_loader_without_workers_is_input_bound():
    """The pair differs only in the DataLoader's workers: with none, loading holds the step (the plugin's
    own sample shows it); with four, it does not."""
    causes = {}
    for workers in (0, 4):
        analysis = tracediag.analyze(tracediag.load(_resnet(workers)))
        assert analysis.steps["step"].unique().sort().to_list() == list(range(16, 22))
        causes[workers] = [f.cause.value for f in analysis.findings]
    assert causes[0][0] == "input_bound"
    assert "input_bound" not in causes[4]

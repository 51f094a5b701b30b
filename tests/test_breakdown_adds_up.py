"""The per-step breakdown adds up on every real trace (issue 11).

For every (rank, step) row, partial edge steps included: step = compute + exposed communication +
copies alone + idle, and idle = waiting on the host + on kernels + other; the shown wait is part of
the exposed communication. Checked on every fixture and on every trace file in ../shared (each file
alone: the HTA samples are unrelated single-rank traces), skipped with the reason when absent.
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import FIXTURES, SAMPLES, loadable_runs

import tracediag
from tracediag.derive.breakdown import breakdown
from tracediag.derive.steps import assign_steps, find_markers, step_spans
from tracediag.errors import TracediagError

RUN_DIRS = loadable_runs()
TRACE_FILES = sorted(
    p
    for sub in ("kineto", "nsys", "jax")
    for p in (FIXTURES / sub).iterdir()
    if p.name.endswith((".json", ".json.gz", ".sqlite.gz")) and "perfetto" not in p.name
)
HTA = SAMPLES / "hta"
SHARED_FILES = sorted(p for p in HTA.rglob("*") if p.name.endswith((".json", ".json.gz"))) if HTA.exists() else []
LOOSE_REGEX = {"cupti_profiler": r"^\[param\|pytorch.model.alex_net"}
"""Traces without ProfilerStep markers, cut by nested annotations (overlapping spans must not double count)."""
NO_STEPS = {
    "hta_ns_resolution_head.json.gz",
    "_removed_upstream/with_gpu_user_annotation/step_based_trace_2543932.json.gz",
    "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
    "critical_path/end_to_end/simple_add/input/trace.json.gz",
    "critical_path/end_to_end/simple_add/output/overlaid_critical_path_trace.json.gz",
    "critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz",
    "execution_trace/benchmark_simple_add_trace.json.gz",
    "mtia_inference_trace/mtia_inference_rank_0.json.gz",
    "trace_file_list/inference_rank_1.json.gz",
}
"""Real traces recorded without step markers (inference, micro-benchmarks, a head cut before the first
step): they have no step to add up, and the test asserts they still have none."""
NOT_TRACES = {"execution_trace/benchmark_simple_add_et.json.gz"}
"""A PyTorch execution trace (the op graph, no timestamps), which the loader must refuse."""


def _name(path) -> str:
    return str(path.relative_to(HTA)) if path.is_relative_to(HTA) else path.name


def _rows(paths, step_regex=None) -> pl.DataFrame | None:
    """The breakdown rows of `paths`; None for a trace listed in `NO_STEPS` (asserting it has none) or
    `NOT_TRACES` (asserting the loader refuses it). Any other failure fails the test."""
    names = {_name(p) for p in (paths if isinstance(paths, list) else [paths])}
    if names & NOT_TRACES:
        with pytest.raises(TracediagError):
            tracediag.load(paths, jobs=1)
        return None
    ev = tracediag.load(paths, jobs=1).events
    markers = find_markers(ev, step_regex=step_regex)
    if names & NO_STEPS:
        assert markers.height == 0, "has step markers now: remove it from NO_STEPS"
        return None
    assert markers.height, "no step markers (list the trace in NO_STEPS if it was recorded without)"
    spans = step_spans(ev, markers)
    return breakdown(assign_steps(ev, spans), spans)


def _assert_adds_up(rows: pl.DataFrame | None) -> None:
    if rows is None:
        return
    assert rows.height
    parts = pl.col("compute_ns") + pl.col("exposed_comm_ns") + pl.col("copy_ns") + pl.col("idle_ns")
    idle = pl.col("idle_host_ns") + pl.col("idle_kernel_ns") + pl.col("idle_other_ns")
    bad = rows.filter((parts != pl.col("dur_ns")) | (idle != pl.col("idle_ns")))
    assert bad.height == 0, bad.head(3)
    for c in ("compute_ns", "exposed_comm_ns", "copy_ns", "idle_host_ns", "idle_kernel_ns", "idle_other_ns"):
        assert rows[c].min() >= 0, c
    assert (rows["exposed_comm_ns"] <= rows["comm_ns"]).all()


@pytest.mark.parametrize("run_dir", RUN_DIRS, ids=lambda p: p.name)
def test_fixture_runs_add_up_and_analysis_wait_is_within_exposed(run_dir):
    paths = sorted(run_dir.glob("*.pt.trace.json.gz"))
    _assert_adds_up(_rows(paths))
    steps = tracediag.analyze(tracediag.load(paths, jobs=1)).steps
    assert (steps["wait_ns"] <= steps["exposed_comm_ns"]).all()
    assert (steps["idle_other_ns"] == steps["idle_ns"]).all()  # CPU-only ranks: no separate device to wait


@pytest.mark.parametrize("path", TRACE_FILES, ids=lambda p: p.name)
def test_fixture_traces_add_up(path):
    _assert_adds_up(_rows(path))


@pytest.mark.skipif(not SHARED_FILES, reason="../shared/trace-samples is not present")
@pytest.mark.parametrize("path", SHARED_FILES, ids=lambda p: str(p.relative_to(SAMPLES / "hta")))
def test_shared_traces_add_up(path):
    regex = next((r for k, r in LOOSE_REGEX.items() if k in str(path)), None)
    _assert_adds_up(_rows(path, step_regex=regex))

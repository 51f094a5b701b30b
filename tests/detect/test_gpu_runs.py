"""Real GPU jobs (fixtures/gpu_runs, make_gpu_runs.py on an H200): who everyone waits for, and why.

Four ranks of a DDP job on one CUDA device, their gradients all-reduced by gloo over CUDA tensors (NCCL
refuses two ranks on one GPU). The collective is host work on gloo's worker thread that first waits for its
CUDA input: a rank reaches it when that wait ends, not when its row opens (the host runs ahead of its
device), and the device that idles after that waits for its peers (exposed communication, not a host that
starves it). Read the other way, every rank looked on time and every GPU host-bound.
"""

from __future__ import annotations

import json
import statistics

import polars as pl
import pytest
from conftest import FIXTURES

import tracediag

GPU_RUNS = FIXTURES / "gpu_runs"
SCENARIOS = sorted(p.parent.name for p in GPU_RUNS.glob("*/manifest.json"))


@pytest.fixture(scope="module")
def analyses() -> dict[str, tuple[tracediag.Analysis, dict]]:
    out = {}
    for name in SCENARIOS:
        manifest = json.loads((GPU_RUNS / name / "manifest.json").read_text())
        run = tracediag.load(sorted((GPU_RUNS / name).glob("*.pt.trace.json.gz")), jobs=1)
        out[name] = (tracediag.analyze(run), manifest)
    return out


def test_the_runs_are_there_and_recorded_as_injected() -> None:
    assert len(SCENARIOS) >= 9, SCENARIOS
    for name in SCENARIOS:
        manifest = json.loads((GPU_RUNS / name / "manifest.json").read_text())
        assert manifest["validation"]["passed"], (name, manifest["validation"])
        assert manifest["details"]["device"]["name"].startswith("NVIDIA")


FIRST_STEP = (
    "step 2 is not found: the first recorded step has no device activity before it, so its GPU step span runs "
    "from its first kernel to step 3's first (292 ms, step 3's 100 ms of loading in it) and its loading is 34% "
    "of it, under the per-step share; steps 3..7 are found (54%)"
)
VERDICTS = [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=FIRST_STEP)) if n == "gpu_input_bound" else n
    for n in SCENARIOS
]


@pytest.mark.parametrize("name", VERDICTS)
def test_verdict_ranks_and_steps_match_manifest(analyses, name: str) -> None:
    analysis, manifest = analyses[name]
    causes = [f.cause for f in analysis.findings]
    if manifest["cause"] == "healthy":
        assert causes == ["healthy"]
        return
    if manifest.get("also"):  # two causes in one run, on alternate steps: each with its ranks and steps
        expected = {(c["cause"], tuple(c["ranks"]), tuple(c["steps"])) for c in [manifest, *manifest["also"]]}
        assert {(f.cause, f.ranks, f.steps) for f in analysis.findings} == expected
        return
    assert causes == [manifest["cause"]]
    (finding,) = analysis.findings
    assert list(finding.ranks) == (manifest["ranks"] or manifest["affected_ranks"])
    assert list(finding.steps) == manifest["steps"]
    assert finding.time_lost_ns > 0


@pytest.mark.parametrize("name", SCENARIOS)
def test_cause_and_ranks_match_manifest(analyses, name: str) -> None:
    analysis, manifest = analyses[name]
    (finding,) = [f for f in analysis.findings if f.cause == manifest["cause"]]
    assert finding.cause == manifest["cause"]
    assert list(finding.ranks) == (
        manifest["ranks"] or manifest["affected_ranks"]
        if finding.cause != "healthy"
        else list(range(manifest["world_size"]))
    )
    assert set(finding.steps) <= set(manifest["steps"] or manifest["profiler_steps"])


@pytest.mark.parametrize("name", ["gpu_straggler", "gpu_host_late", "gpu_input_late"])
def test_the_late_rank_arrives_last_at_every_collective_from_its_ready_time(analyses, name: str) -> None:
    analysis, manifest = analyses[name]
    (culprit,) = manifest["ranks"]
    inst = analysis.collectives  # one row per matched instance: 2 DDP buckets a step
    assert inst.height == 2 * len(manifest["profiler_steps"])
    assert (inst.get_column("n_ranks") == manifest["world_size"]).all()
    assert inst.get_column("last_rank").to_list() == [culprit] * inst.height
    # each bucket's peers wait tens of ms for the culprit (its extra work: 55-150 ms a step)
    assert inst.get_column("skew_ns").min() > 20_000_000


def test_the_peers_of_a_late_rank_wait_in_exposed_communication_not_idle(analyses) -> None:
    analysis, manifest = analyses["gpu_straggler"]
    s = analysis.steps.filter(~pl.col("rank").is_in(manifest["ranks"]))
    # 145 ms steps of 65 ms compute: the rest is the all-reduce waiting for rank 1, not a starved device
    assert s.get_column("exposed_comm_ns").median() > 50_000_000
    assert s.get_column("idle_ns").median() < 20_000_000


def test_the_whatif_of_the_straggler_gives_the_healthy_runs_step(analyses) -> None:
    (finding,) = analyses["gpu_straggler"][0].findings
    healthy = analyses["gpu_healthy"][0]
    observed = statistics.median(s.observed_ns for s in healthy.whatif.steps)
    assert finding.step_time_without_ns is not None, finding.whatif_withheld
    assert finding.step_time_without_ns == pytest.approx(observed, rel=0.1)


@pytest.mark.xfail(
    strict=True,
    reason="a cost the what-if leaves in: step 4 is the first the extra matmuls run, and their first launches "
    "hold rank 0's host 100 ms in cudaLaunchKernel (CUDA loads the tanh and GEMM kernels' modules lazily), so "
    "its device also idles 32 ms more than its peers'; the what-if removes the extra compute, not that idle "
    "(step 4: 119 ms against 92 ms; step 6: 93 ms; median 106 ms, +15.1% of the steps without it)",
)
def test_the_whatif_of_the_transient_straggler_gives_its_own_steps_without_it(analyses) -> None:
    analysis, manifest = analyses["gpu_transient"]
    (finding,) = analysis.findings
    observed = {s.step: s.observed_ns for s in analysis.whatif.steps}
    without = statistics.median(ns for step, ns in observed.items() if step not in manifest["steps"])
    assert statistics.median(observed[s] for s in manifest["steps"]) > 1.3 * without
    assert finding.step_time_without_ns == pytest.approx(without, rel=0.15)

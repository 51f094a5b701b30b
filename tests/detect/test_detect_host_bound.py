"""host_bound on real GPU traces: an idle device is never called healthy (issue 11)."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import SAMPLES, needs_shared

import tracediag

HOST_BOUND = {
    # trace: (hint keyword, most idle category)
    "nccl_parser_config": ("CPU work between kernels", "idle_waiting_on_host"),
    "negative_queue_length_values_check": ("fewer synchronizations", "idle_other"),
    "df_index_resolver": ("CPU work between kernels", "idle_waiting_on_host"),
    "amd_trace": ("launch overhead", "idle_waiting_on_host"),
    "triton_example": ("CPU work between kernels", "idle_waiting_on_host"),
}
BUSY = ("trace_diff/test", "trace_diff/control", "ns_resolution_trace")
"""GPU traces whose device idles 1–16% of the step."""


def _analyze(name: str):
    return tracediag.analyze(tracediag.load(SAMPLES / "hta" / name, jobs=1))


@needs_shared(SAMPLES / "hta")
@pytest.mark.parametrize("name", sorted(HOST_BOUND), ids=str)
def test_idle_gpu_is_host_bound_with_the_split_and_a_hint(name):
    a = _analyze(name)
    causes = [f.cause for f in a.findings]
    assert "healthy" not in causes
    assert "host_bound" in causes
    f = next(f for f in a.findings if f.cause == "host_bound")
    ev = f.evidence
    split = {k: ev[k] for k in ("idle_waiting_on_host", "idle_waiting_on_kernels", "idle_other")}
    assert sum(split.values()) == pytest.approx(1, abs=0.002)
    keyword, top = HOST_BOUND[name]
    assert max(split, key=split.get) == top
    assert keyword in ev["hint"]
    assert ev["idle_share_median"] >= 0.3
    steps = a.steps.filter(a.steps["step"].is_in(list(f.steps)))
    # the what-if removes only the device's waits on its host (nothing queued), never all its idle:
    # these single-rank traces have no sync to wait at, so what it saves is that time itself
    host = steps["idle_host_ns"].sum()
    assert f.time_lost_ns == pytest.approx(host, rel=1e-3)
    per_step = f"{steps['idle_host_ns'].median() / 1e6:,.1f} of its {steps['idle_ns'].median() / 1e6:,.1f} ms idle"
    assert f.whatif.startswith(f"without the device's waits on its host ({per_step} per step)")
    observed = steps.group_by("step").agg(pl.col("dur_ns").median())["dur_ns"].median()
    assert f.measurable == (1 - f.step_time_without_ns / observed >= 0.01)


@needs_shared(SAMPLES / "hta")
def test_waiting_on_host_means_an_empty_launch_queue():
    """The host-starved traces keep at most one launch queued; the busy ones keep hundreds."""
    starved = _analyze("nccl_parser_config").findings[0].evidence["queue_depth_median"]
    assert starved == 1
    from tracediag.reduce import derive_facts

    facts = derive_facts(tracediag.load(SAMPLES / "hta" / "ns_resolution_trace", jobs=1)).facts
    assert facts.host["queue_depth"].median() > 100


@needs_shared(SAMPLES / "hta")
@pytest.mark.parametrize("name", BUSY, ids=str)
def test_busy_gpu_is_not_host_bound(name):
    a = _analyze(name)
    assert "host_bound" not in [f.cause for f in a.findings]
    assert (a.steps["idle_ns"] / a.steps["dur_ns"]).median() < 0.2


@needs_shared(SAMPLES / "hta")
def test_cpu_only_trace_with_an_idle_host_is_host_bound_at_half_confidence():
    """rank_non_gpu: a CPU-only trace whose threads run no traced operator 63% of the step."""
    a = _analyze("rank_non_gpu")
    (f,) = a.findings
    assert (f.cause, f.evidence["decided_on"], f.confidence) == ("host_bound", "host", 0.5)
    assert f.evidence["idle_share_median"] == pytest.approx(0.626, abs=0.005)
    assert f.evidence["idle_other"] == 1.0  # no separate device: all host idle is "other"

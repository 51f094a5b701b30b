"""Issue 5: observed vs predicted, on analyses built from the `Analysis` contract and on real traces."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
import polars as pl
import pytest

import tracediag
from tracediag.analysis import COLLECTIVE_SCHEMA, STEP_SCHEMA, Analysis, Finding
from tracediag.ingest.trace import FileMeta, ProcessGroup
from tracediag.model.predict import predict
from tracediag.model.specs import Split, Training, resolve_device, resolve_model
from tracediag.model.stack import resolve_engine
from tracediag.observed_vs_predicted import NOT_VISIBLE, check, group_kind
from tracediag.run import Run, RunMeta
from tracediag.schema import conform

MS = 1_000_000
RUNS = Path(__file__).parent.parent / "fixtures" / "runs"


def _prediction(split: Split, gpus: int = 4):
    train = Training(seq_len=4096, global_batch=8)
    model, device = resolve_model("llama3-8b"), resolve_device("h100-sxm")
    return predict(model, device, split, train, resolve_engine("megatron-core"), gpus=gpus)


def _analysis(
    *, ranks=4, steps=(2, 3, 4), step_ms=1000, compute_ms=700, exposed_ms=200, wait_ms=50, idle_ms=100, collectives=()
) -> Analysis:
    rows = [
        {
            "rank": r, "step": s, "start_ns": s * step_ms * MS, "dur_ns": step_ms * MS, "compute_ns": compute_ms * MS,
            "comm_ns": exposed_ms * MS, "exposed_comm_ns": exposed_ms * MS, "wait_ns": wait_ms * MS,
            "idle_ns": idle_ms * MS, "host_gap_ns": 0, "input_ns": 0, "device": 0, "exposed_p2p_ns": 0, "stall_ns": 0,
                    "lead_idle_ns": 0,
        }
        for r in range(ranks)
        for s in steps
    ]  # fmt: skip
    return Analysis(
        ranks=tuple(range(ranks)),
        world_size=ranks,
        steps=pl.DataFrame(rows, schema=STEP_SCHEMA),
        collectives=pl.DataFrame(list(collectives), schema=COLLECTIVE_SCHEMA),
        findings=(Finding("healthy", (), (), 0, 1.0, "no cause found"),),
    )


def _coll(group, op, n_ranks, *, seq=0, busbw=100.0, skew_ms=1, transfer_ms=4):
    return {
        "group": group, "seq": seq, "op": op, "bytes": 1 << 26, "step": 2, "n_ranks": n_ranks,
        "first_arrival_ns": 0, "last_arrival_ns": skew_ms * MS, "skew_ns": skew_ms * MS, "last_rank": 1,
        "end_ns": (skew_ms + transfer_ms) * MS, "transfer_ns": transfer_ms * MS, "algbw_gbps": busbw / 1.5,
        "busbw_gbps": busbw,
    }  # fmt: skip


def _run(groups: list[ProcessGroup], *, device: bool = True) -> Run:
    """A run whose only content that `check` reads: process groups and whether events sit on a device."""
    events = conform(pl.DataFrame({"device": [0 if device else -1], "ts": [0], "dur": [1]}))
    meta = RunMeta(files=(FileMeta(path="rank0.json", format="kineto", rank=0, process_groups=tuple(groups)),))
    return Run(events=events, meta=meta)


def _by_name(result) -> dict:
    return {c["component"]: c for c in result.to_dict()["components"]}


def test_pure_dp_attributes_all_exposed_comm_to_dp_and_names_the_gap():
    p = _prediction(Split(dp=4, zero=1))
    a = _analysis(collectives=[_coll("0", "all_reduce", 4)])
    result = check(a, p)
    rows = _by_name(result)
    assert rows["step_time"]["observed"] == pytest.approx(1.0)
    assert rows["compute"]["predicted"] == pytest.approx(p.time.compute_s + p.time.optimizer_s)
    assert rows["exposed_dp"]["observed"] == pytest.approx(0.2)
    assert rows["exposed_dp"]["ratio"] == pytest.approx(0.2 / p.time.exposed_dp_s, rel=1e-3)
    assert "exposed_tp" not in rows  # tp = 1 and no TP collectives
    assert rows["idle"]["observed"] == pytest.approx(0.1)
    assert rows["idle"]["ratio"] is None
    assert rows["bubble"]["note"] == "no pipeline"
    expected_mfu = p.model_flops_per_step / (1.0 * p.device.peak_flops * 4)
    assert rows["mfu"]["observed"] == pytest.approx(expected_mfu)
    # exposed DP (0.2 s against ~1 ms predicted) exceeds every other component by the most seconds
    assert result.sentence.startswith("Exposed DP communication is ")
    assert "bucketing or overlap is off" in result.sentence
    (link,) = result.links
    assert (link.kind, link.op, link.busbw_gbps) == ("dp", "all_reduce", 100.0)
    assert link.link_busbw_gbps == pytest.approx(p.link_busbw["dp"] / 1e9)
    orjson.dumps(result.to_dict())  # JSON-ready


def test_tp_and_dp_of_the_same_size_are_not_told_apart_without_group_members():
    p = _prediction(Split(tp=2, dp=2))
    a = _analysis(collectives=[_coll(None, "all_reduce", 2, seq=i) for i in range(4)])
    rows = _by_name(check(a, p))
    for kind in ("tp", "dp"):
        assert rows[f"exposed_{kind}"]["observed"] is None
        assert rows[f"exposed_{kind}"]["note"].startswith(NOT_VISIBLE)
    assert rows["exposed_comm"]["observed"] == pytest.approx(0.2)
    (link,) = check(a, p).links
    assert link.kind is None
    assert "fits tp and dp" in link.kind_from


def test_group_names_and_members_tell_tp_from_dp():
    split = Split(tp=2, dp=2)
    named = {"1": ProcessGroup(name="1", desc="tp0", size=2, ranks=(0, 1))}
    assert group_kind("1", "all_reduce", 2, split, named) == ("tp", "group name 'tp0'")
    members = {"3": ProcessGroup(name="3", desc="group3", size=2, ranks=(0, 2))}
    assert group_kind("3", "all_reduce", 2, split, members) == ("dp", "group members")
    world = {"0": ProcessGroup(name="0", desc="default_pg", size=4, ranks=(0, 1, 2, 3))}
    assert group_kind("0", "all_reduce", 4, split, world)[0] is None
    assert group_kind(None, "send", 2, Split(pp=2, dp=2), {}) == ("pp", "send/recv")


def test_kinds_from_groups_split_busbw_and_mark_exposed_per_kind_not_visible():
    p = _prediction(Split(tp=2, dp=2))
    groups = [
        ProcessGroup(name="1", desc="tp0", size=2, ranks=(0, 1)),
        ProcessGroup(name="3", desc="dp0", size=2, ranks=(0, 2)),
    ]
    colls = [_coll("1", "all_reduce", 2, busbw=200.0, transfer_ms=3), _coll("3", "all_reduce", 2, busbw=20.0)]
    result = check(_analysis(collectives=colls), p, run=_run(groups))
    kinds = {li.kind: li for li in result.links}
    assert kinds["tp"].busbw_gbps == 200.0
    assert kinds["dp"].busbw_gbps == 20.0
    assert kinds["tp"].groups == ("1 (tp0)",)
    assert kinds["tp"].link == p.links["tp"]
    rows = _by_name(result)
    # both kinds present: the steps table cannot say which of them the exposed time belongs to
    assert rows["exposed_tp"]["observed"] is None
    assert "44% of collective time" in rows["exposed_tp"]["note"]
    assert rows["exposed_dp"]["observed"] is None
    assert "56% of collective time" in rows["exposed_dp"]["note"]
    assert rows["exposed_comm"]["ratio"] is not None


def test_cpu_only_trace_has_no_mfu_and_says_so():
    p = _prediction(Split(dp=4))
    result = check(_analysis(), p, run=_run([], device=False))
    rows = _by_name(result)
    assert rows["mfu"]["observed"] is None
    assert rows["mfu"]["note"].startswith(NOT_VISIBLE)
    assert any("CPU-only" in n for n in result.notes)


def test_pipeline_bubble_uses_bubble_column_else_is_not_visible():
    p = _prediction(Split(pp=2, dp=2))
    a = _analysis()
    a = dataclasses.replace(a, steps=a.steps.drop("exposed_p2p_ns"))  # an analysis that does not separate p2p
    rows = _by_name(check(a, p))
    assert rows["bubble"]["observed"] is None
    assert rows["bubble"]["note"].startswith(NOT_VISIBLE)
    with_bubble = dataclasses.replace(a, steps=a.steps.with_columns(bubble_ns=pl.lit(300 * MS)))
    rows = _by_name(check(with_bubble, p))
    assert rows["bubble"]["observed"] == pytest.approx(0.3)
    assert rows["bubble"]["ratio"] == pytest.approx(0.3 / p.time.bubble_s, rel=1e-3)


def test_send_recv_waits_are_compared_with_bubble_plus_pp_and_left_out_of_collectives():
    p = _prediction(Split(pp=2, dp=2))
    a = _analysis(collectives=[_coll("5", "all_reduce", 2), _coll("6", "send", 2)])
    a = dataclasses.replace(a, steps=a.steps.with_columns(exposed_p2p_ns=pl.lit(150 * MS, pl.Int64)))
    rows = _by_name(check(a, p))
    assert rows["bubble"]["observed"] == pytest.approx(0.15)
    assert rows["bubble"]["predicted"] == pytest.approx(p.time.bubble_s + p.time.exposed_pp_s)
    assert "exposed_pp" not in rows
    assert rows["exposed_comm"]["observed"] == pytest.approx(0.05)
    assert rows["exposed_dp"]["observed"] == pytest.approx(0.05)  # the only collective kind left is DP


def test_world_size_mismatch_and_close_match_sentence():
    p = _prediction(Split(dp=8), gpus=8)
    step_ms = round(1e3 * p.step_time_s)
    compute_ms = round(1e3 * (p.time.compute_s + p.time.optimizer_s))
    a = _analysis(step_ms=step_ms, compute_ms=compute_ms, exposed_ms=1, wait_ms=0, idle_ms=0)
    result = check(a, p)
    assert result.notes == ("the trace's world size is 4, the prediction is for 8 GPUs",)
    assert result.sentence.startswith("Step time is 1.00× the prediction; no component")


def test_real_gloo_run_is_compared_and_cpu_limits_are_stated():
    """A real 4-rank gloo run (TP 2 × DP 2): gloo names no group, so TP and DP (both of size 2) stay apart."""
    run = tracediag.load(sorted((RUNS / "healthy_tp_dp").glob("rank*.pt.trace.json.gz")), jobs=1)
    result = check(tracediag.analyze(run), _prediction(Split(tp=2, dp=2)), run=run)
    rows = _by_name(result)
    assert rows["step_time"]["observed"] > 0.05
    assert rows["mfu"]["observed"] is None
    assert any("CPU-only" in n for n in result.notes)
    for kind in ("tp", "dp"):
        assert rows[f"exposed_{kind}"]["observed"] is None
        assert "kind the trace does not tell" in rows[f"exposed_{kind}"]["note"]
    assert rows["exposed_comm"]["observed"] > 0
    assert rows["bubble"]["note"] == "no pipeline"
    assert result.sentence
    orjson.dumps(result.to_dict())

"""Steps and per-step breakdown on hand-built CPU and GPU timelines with known answers (issue 3)."""

from __future__ import annotations

import polars as pl
from _events import events
from conftest import ROOT

from tracediag.derive.breakdown import breakdown
from tracediag.derive.steps import assign_steps, find_markers, step_spans

MS = 1_000_000


def _gloo_ddp() -> pl.DataFrame:
    """One 100 ms step: compute 0-60 on the training thread (tid 1), a gloo all-reduce on the runloop
    thread (tid 2) 40-90 (20 ms hidden by compute, 30 exposed), a c10d op nested in compute 50-55,
    data loading 0-10, the thread in no op 60-90, an optimizer op 90-95."""
    return events(
        [
            {"tid": 1, "kind": "step", "name": "ProfilerStep#7", "ts": 0, "dur": 100 * MS},
            {"tid": 1, "kind": "annotation", "name": "enumerate(DataLoader)#_Iter.__next__", "ts": 0, "dur": 10 * MS},
            {"tid": 1, "kind": "cpu_op", "name": "aten::linear", "ts": 10 * MS, "dur": 50 * MS},
            {
                "tid": 1,
                "kind": "cpu_op",
                "name": "c10d::allreduce_",
                "ts": 50 * MS,
                "dur": 5 * MS,
                "coll_op": "all_reduce",
            },
            {
                "tid": 2,
                "kind": "comm",
                "name": "gloo:all_reduce",
                "ts": 40 * MS,
                "dur": 50 * MS,
                "coll_op": "all_reduce",
            },
            {"tid": 1, "kind": "cpu_op", "name": "aten::add_", "ts": 90 * MS, "dur": 5 * MS},
        ]
    )


def test_cpu_breakdown_counts_nested_comm_and_loading_as_non_compute():
    ev = _gloo_ddp()
    spans = step_spans(ev, find_markers(ev))
    b = breakdown(assign_steps(ev, spans), spans).row(0, named=True)
    assert (b["rank"], b["step"], b["device"], b["dur_ns"]) == (0, 7, -1, 100 * MS)
    assert b["compute_ns"] == 50 * MS  # 10-50, 55-60, 90-95
    assert b["comm_ns"] == 50 * MS  # 40-90
    assert b["exposed_comm_ns"] == 35 * MS  # 50-55 (c10d op) and 60-90
    assert b["idle_ns"] == 15 * MS  # 0-10 loading, 95-100
    assert b["input_ns"] == 10 * MS
    assert b["host_gap_ns"] == 45 * MS  # 0-10 (annotation only), 60-90, 95-100
    assert b["stall_ns"] == 10 * MS
    assert b["lead_idle_ns"] == 10 * MS  # nothing runs before the first op at 10 ms


def _gpu_two_steps() -> pl.DataFrame:
    """Host steps 0-10 and 10-20 ms; step 1's kernels run late (after host step 2 began); a kernel
    launch in step 2 has no device row (the profiler stopped before it ran)."""
    host = [
        {"tid": 1, "kind": "step", "name": "ProfilerStep#1", "ts": 0, "dur": 10 * MS},
        {"tid": 1, "kind": "step", "name": "ProfilerStep#2", "ts": 10 * MS, "dur": 10 * MS},
        {"tid": 1, "kind": "runtime", "name": "cudaLaunchKernel", "ts": 1 * MS, "dur": 10, "correlation": 1},
        {"tid": 1, "kind": "runtime", "name": "cudaLaunchKernel", "ts": 2 * MS, "dur": 10, "correlation": 2},
        {"tid": 1, "kind": "runtime", "name": "cudaLaunchKernel", "ts": 11 * MS, "dur": 10, "correlation": 3},
        {"tid": 1, "kind": "runtime", "name": "cudaLaunchKernel", "ts": 12 * MS, "dur": 10, "correlation": 4},
    ]
    dev = {"device": 0, "pid": 0, "tid": 7, "stream": 7}
    kernels = [
        {**dev, "kind": "kernel", "name": "gemm", "ts": 3 * MS, "dur": 6 * MS, "correlation": 1},
        {**dev, "kind": "comm", "name": "ncclKernel_AllReduce", "ts": 7 * MS, "dur": 5 * MS, "correlation": 2},
        {**dev, "kind": "kernel", "name": "gemm", "ts": 14 * MS, "dur": 2 * MS, "correlation": 3},
    ]
    return events(host + kernels)


def test_gpu_steps_follow_launch_correlation_and_edge_step_with_lost_launch_is_partial():
    ev = _gpu_two_steps()
    spans = step_spans(ev, find_markers(ev))
    # the window's first step starts at its host start (the device waits for the host from 0 to 3 ms),
    # the last ends at the later of its host end and its last device work
    assert spans.select("step", "device", "start", "end", "partial").rows() == [
        (1, 0, 0, 14 * MS, False),
        (2, 0, 14 * MS, 20 * MS, True),
    ]
    assigned = assign_steps(ev, spans)
    late = assigned.filter(pl.col("name").cast(pl.String) == "ncclKernel_AllReduce")
    assert late["step"].to_list() == [1]  # ran during host step 2, launched in step 1
    b = breakdown(assigned, spans).filter(pl.col("step") == 1).row(0, named=True)
    assert b["compute_ns"] == 6 * MS
    assert b["comm_ns"] == 5 * MS
    assert b["exposed_comm_ns"] == 3 * MS  # 9-12
    assert b["idle_ns"] == 5 * MS  # 0-3 before the first kernel, 12-14 until step 2's first kernel
    # 0 until the launch call returns at 1 ms + 10 ns: nothing queued (host); then queued until 3 ms
    # (other); 12-14: step 2's kernel was launched at 11 ms, before the gap (other)
    assert (b["idle_host_ns"], b["idle_kernel_ns"], b["idle_other_ns"]) == (1 * MS + 10, 0, 4 * MS - 10)
    assert b["compute_ns"] + b["exposed_comm_ns"] + b["copy_ns"] + b["idle_ns"] == b["dur_ns"]
    step2 = breakdown(assigned, spans).filter(pl.col("step") == 2).row(0, named=True)
    assert step2["lead_idle_ns"] == 2 * MS  # the device gap between step 1's last and step 2's first work
    assert step2["idle_host_ns"] == 4 * MS  # 16-20: nothing more launched before the host step ends


def test_step_regex_numbers_markers_from_group_or_order():
    ev = events(
        [
            {"kind": "annotation", "name": "train step 5", "ts": 0, "dur": 10},
            {"kind": "annotation", "name": "train step 6", "ts": 10, "dur": 10},
            {"kind": "annotation", "name": "forward", "ts": 1, "dur": 2},
        ]
    )
    assert find_markers(ev, step_regex=r"^train step (\d+)$")["step"].to_list() == [5, 6]
    assert find_markers(ev, step_regex=r"^train step")["step"].to_list() == [0, 1]
    assert find_markers(ev).height == 0


def test_cpu_wait_for_an_in_flight_collective_counts_as_communication_when_the_work_is_not_traced():
    """A gloo trace that records only the enqueue operator (no gloo:* work row): the training thread
    computes 0-60 ms, enqueues an all-reduce 60-62, waits untraced (DDP's reducer) until 90, then runs
    the optimizer 90-95. The wait is exposed communication, not idle."""
    ev = events(
        [
            {"kind": "step", "name": "ProfilerStep#3", "ts": 0, "dur": 100 * MS},
            {"kind": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 60 * MS},
            {"kind": "cpu_op", "name": "c10d::allreduce_", "ts": 60 * MS, "dur": 2 * MS, "coll_op": "all_reduce"},
            {"kind": "cpu_op", "name": "aten::add_", "ts": 90 * MS, "dur": 5 * MS},
        ]
    )
    spans = step_spans(ev, find_markers(ev))
    b = breakdown(assign_steps(ev, spans), spans).row(0, named=True)
    assert (b["compute_ns"], b["exposed_comm_ns"], b["idle_ns"]) == (65 * MS, 30 * MS, 5 * MS)


def test_assign_steps_keeps_every_row_in_order_and_a_row_without_device_gets_no_step():
    """Only the step-deciding columns are joined: rows keep their order and columns, and a row whose
    device is unknown (neither host nor device timeline) stays, with no step, instead of vanishing."""
    import tracediag

    ev = tracediag.load(ROOT / "fixtures/kineto/hta_a100_nccl_rank0.json.gz").events
    spans = step_spans(ev, find_markers(ev))
    ref = assign_steps(ev, spans)
    dev_rows = ev.with_row_index("i").filter(pl.col("device") >= 0)["i"]
    host_rows = ev.with_row_index("i").filter(pl.col("device") == -1)["i"]
    assert ref["step"].gather(dev_rows).drop_nulls().len() > 0
    assert ref["step"].gather(host_rows).drop_nulls().len() > 0
    lost = int(dev_rows[len(dev_rows) // 2])
    blanked = ev.with_columns(device=pl.when(pl.int_range(pl.len()) == lost).then(None).otherwise(pl.col("device")))
    got = assign_steps(blanked, spans)
    assert got.height == ev.height
    assert got.drop("step", "device").equals(ev.drop("step", "device"))
    assert got["step"][lost] is None
    keep = pl.int_range(ev.height, eager=True) != lost
    assert got["step"].filter(keep).equals(ref["step"].filter(keep))


def test_steps_the_device_did_nothing_in_are_left_out_not_a_crash():
    """A loose --step-regex on a real GPU trace (`aten::` matches nested host operators): most of its
    markers hold no device work. Such a step used to reach the sweep with a start and no end (an
    internal error) and the what-if as a kept step without a duration; now it has no span, is partial,
    and is named in a warning."""
    from conftest import FIXTURES

    import tracediag

    run = tracediag.load(FIXTURES / "kineto/hta_a100_nccl_rank0.json.gz")
    spans = step_spans(run.events, find_markers(run.events, step_regex="aten::"))
    no_span = spans.filter(pl.col("start").is_null() | pl.col("end").is_null())
    assert no_span.height > 100
    assert no_span["partial"].all()
    assert spans.filter(pl.col("end") < pl.col("start")).height == 0
    analysis = tracediag.analyze(run, step_regex="aten::")
    assert any("with no device activity left out" in w for w in analysis.warnings)
    assert analysis.whatif is not None
    assert all(s.observed_ns > 0 for s in analysis.whatif.steps)

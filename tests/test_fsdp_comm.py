"""FSDP/ZeRO-3 collectives and the waits inside them are communication, never compute.

Real runs: fixtures/readers_runs/fsdp2_uneven_batch and fsdp1_uneven_batch (4 ranks, FSDP2 `fully_shard` /
FSDP1 `FullyShardedDataParallel` over gloo, rank 3 with 4x the batch; made by
fixtures/readers_runs/make_readers_runs.py). The other ranks wait for rank 3 in
FSDP's all-gathers and reduce-scatters; the wait shows as the own time of FSDP's autograd hooks.
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import FIXTURES

import tracediag
from tracediag.derive.kernels import _self_time
from tracediag.vocab import COMM_KERNEL, HOST_COLLECTIVE, coll_op

FSDP2 = FIXTURES / "readers_runs/fsdp2_uneven_batch"


@pytest.fixture(scope="module")
def run():
    return tracediag.load(FSDP2)


@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("c10d::_allgather_base_", "all_gather"),
        ("c10d::allgather_into_tensor_coalesced_", "all_gather"),
        ("c10d::_reduce_scatter_base_", "reduce_scatter"),
        ("c10d::reduce_scatter_tensor_coalesced_", "reduce_scatter"),
        ("nccl:_all_gather_base", "all_gather"),
        ("nccl:_reduce_scatter_base", "reduce_scatter"),
        ("gloo:all_gather", "all_gather"),
        ("gloo:reduce_scatter", "reduce_scatter"),
        ("record_param_comms", None),  # its `Collective name` arg names the operation
    ],
)
def test_fsdp1_and_fsdp2_host_collectives_by_name(name, op):
    frame = pl.DataFrame({"name": [name]}).select(
        host=pl.col("name").str.contains(HOST_COLLECTIVE), op=coll_op(pl.col("name"), default=None)
    )
    assert frame.row(0) == (True, op)


@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", "all_gather"),
        ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "reduce_scatter"),
    ],
)
def test_fsdp_nccl_kernels_are_communication(name, op):
    frame = pl.DataFrame({"name": [name]}).select(
        comm=pl.col("name").str.contains(COMM_KERNEL), op=coll_op(pl.col("name"))
    )
    assert frame.row(0) == (True, op)


def test_fsdp2_collective_rows_are_classified(run):
    """What FSDP2 over gloo records: the enqueue ops (`c10d::_allgather_base_`, `_reduce_scatter_base_`)
    and gloo's work on its own threads (`gloo:*`), each with its operation; FSDP's own annotations are
    annotations, not operators."""
    rows = run.events.with_columns(name=pl.col("name").cast(pl.String))
    table = {(n, k): op for n, k, op in rows.select("name", "kind", "coll_op").unique().iter_rows()}
    assert table[("c10d::_allgather_base_", "cpu_op")] == "all_gather"
    assert table[("c10d::_reduce_scatter_base_", "cpu_op")] == "reduce_scatter"
    assert table[("gloo:all_gather", "comm")] == "all_gather"
    gloo = rows.filter(pl.col("name").str.starts_with("gloo:"))
    assert gloo.height
    assert set(gloo["kind"]) == {"comm"}
    assert gloo["coll_op"].null_count() == 0
    fsdp = rows.filter(pl.col("name").str.starts_with("FSDP::"))
    assert fsdp.height
    assert set(fsdp["kind"]) == {"annotation"}


def _own_time(run, rank: int, name: str) -> float:
    """Ms of `name`'s own time (outside the operators nested in it) on `rank`, over the profiled steps."""
    ops = run.events.filter(pl.col("rank") == rank, pl.col("kind") == "cpu_op", pl.col("device") == -1)
    ops = ops.select("rank", "tid", "ts", "dur", "name").with_columns(step=pl.lit(0), category=pl.lit(""))
    own = _self_time(ops.lazy()).collect()
    return own.filter(pl.col("name").cast(pl.String) == name)["dur"].sum() / 1e6


@pytest.mark.parametrize(
    ("folder", "hook"),
    [
        ("fsdp2_uneven_batch", "RegisterPostBackwardFunctionBackward"),
        ("fsdp1_uneven_batch", "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"),
    ],
)
def test_the_waits_in_fsdp_hooks_are_communication_not_compute(folder, hook):
    """The ranks waiting for rank 3 spend most of each step in FSDP's collectives; the waits inside
    FSDP's autograd hooks (`hook`'s own time, with gloo's work in flight) are exposed communication, so
    rank 3 (4x the batch) computes about twice its peers, and is named. (Counted as compute, the waits
    made the peers compute 1.2x-1.4x less than rank 3, not 2x.)"""
    run = tracediag.load(FIXTURES / "readers_runs" / folder)
    analysis = tracediag.analyze(run)
    per_rank = (
        analysis.steps.group_by("rank")
        .agg(
            compute=pl.col("compute_ns").median(),
            exposed=pl.col("exposed_comm_ns").median(),
            dur=pl.col("dur_ns").median(),
        )
        .sort("rank")
    )
    peers = per_rank.filter(pl.col("rank") != 3)
    rank3 = per_rank.filter(pl.col("rank") == 3).row(0, named=True)
    assert (peers["exposed"] > peers["compute"]).all()  # waiting for rank 3 is most of a peer's step
    assert (peers["exposed"] / peers["dur"] > 0.45).all()
    assert rank3["compute"] > 1.8 * peers["compute"].median()
    waited = sum(_own_time(run, r, hook) for r in (0, 1, 2)) / 3
    assert waited > 50  # ms over the profiled steps: FSDP's waits live here
    finding = analysis.findings[0]
    assert finding.cause.value == "compute_straggler"
    assert finding.ranks == (3,)


def test_aten_operators_stay_compute_in_ddp():
    """The rule touches only operators other than ATen ones: in a DDP run the matrix products' own time
    (an `aten::mm` has operators nested in it) stays compute, so a healthy run keeps its breakdown."""
    healthy = tracediag.analyze(tracediag.load(FIXTURES / "runs/healthy_ddp"))
    share = healthy.steps.select((pl.col("compute_ns") / pl.col("dur_ns")).median()).item()
    assert share > 0.7
    assert [f.cause.value for f in healthy.findings] == ["healthy"]

"""`analyze` on each input format: the same analysis from Kineto, JAX and Nsight Systems tables (issue 6)."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import FIXTURES

import tracediag
from tracediag.detect import Thresholds

JAX_2PROC = [FIXTURES / f"jax/gen_jax0.10.2_cpu2proc_p{r}.trace.json.gz" for r in (0, 1)]


def test_jax_two_process_run_is_analyzed_per_rank_and_step() -> None:
    """A real 2-process JAX run (CPU backend, gloo collectives): XLA ops carry no launch correlation,
    so device work falls in the host `train#N` step it overlaps."""
    run = tracediag.load(JAX_2PROC, jobs=1, rank_from_filename=r"_p(\d)\.")
    analysis = tracediag.analyze(run)
    steps = analysis.steps.sort("rank", "step")
    assert steps.select("rank", "step").rows() == [(r, s) for r in (0, 1) for s in range(4)]
    assert (steps["compute_ns"] > 0).all()
    assert (steps["comm_ns"] > 0).all()
    assert (steps["compute_ns"] + steps["comm_ns"] <= steps["dur_ns"] * 2).all()
    # every psum instance is matched across both processes by its run_id
    psums = run.events.filter(pl.col("coll_op") == "all_reduce")
    per_rank = psums.group_by("rank").agg(pl.col("coll_seq").unique().sort())["coll_seq"].to_list()
    assert per_rank[0] == per_rank[1]
    assert analysis.collectives.height == len(per_rank[0])
    # a tiny step dominated by its cross-process psums over gloo: communication-bound on both ranks, every step
    (finding,) = analysis.findings
    assert (finding.cause, finding.ranks, finding.steps) == ("comm_bound", (0, 1), (0, 1, 2, 3))
    share = (steps["exposed_comm_ns"] / steps["dur_ns"]).median()
    assert finding.evidence["exposed_comm_share_median"] == pytest.approx(share, abs=0.06)
    assert share >= Thresholds().comm_share


def test_nsys_constructed_two_ranks_give_steps_and_collectives() -> None:
    """Constructed Nsight exports (reader rules, not diagnosis evidence): NVTX steps and NCCL kernels."""
    run = tracediag.load(sorted((FIXTURES / "nsys").glob("constructed_gpu_rank*.sqlite.gz")), jobs=1)
    analysis = tracediag.analyze(run)
    assert analysis.ranks == (0, 1)
    nvtx_steps = run.events.filter(pl.col("kind") == "step")["name"].cast(pl.String).unique().sort().to_list()
    assert [f"ProfilerStep#{s}" for s in analysis.step_numbers] == nvtx_steps
    kernel_ops = set(run.events.filter(pl.col("kind") == "comm")["coll_op"].cast(pl.String).to_list())
    assert set(analysis.collectives["op"].to_list()) == kernel_ops - {"other"}  # SendRecv: op unknown

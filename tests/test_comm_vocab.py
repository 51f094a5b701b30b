"""Communication kernels beyond NCCL (DeepEP, NVSHMEM, custom all-reduce, userbuffers) and `--comm-kernel`.

The kernel-name rule is checked on names alone (one parser rule); what it does to a diagnosis on the real
8 x V100 DLRM step (../shared), whose NCCL send/recv kernels are renamed as another library would name them.
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import FIXTURES, SAMPLES, needs_shared

import tracediag
from tracediag.cli import cli
from tracediag.errors import TracediagError
from tracediag.vocab import COMM_KERNEL, coll_op

DLRM = SAMPLES / "gpu-public/dlrm_v100_8rank/worker0_step_12.1694128201545.pt.trace.json"


@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("void deep_ep::internode::dispatch<8, 768, 128>(int4*, float*)", "all_to_all"),
        ("void deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(...)", "all_to_all"),
        ("void deep_ep::internode_ll::dispatch<false, 3, 7168>(...)", "all_to_all"),
        ("dpsk::ep::internode::dispatch", "all_to_all"),
        ("dpsk::ep::low_latency::combine<bf16>", "all_to_all"),
        ("nvshmemi_proxy_progress_kernel", "other"),
        ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(...)", "all_reduce"),
        ("void tensorrt_llm::kernels::oneShotAllReduceKernel<half, 8>(...)", "all_reduce"),
        ("void tensorrt_llm::kernels::ar_fusion::allreduce_fusion_kernel_oneshot_lamport<...>", "all_reduce"),
        ("void c10d::symmetric_memory::multimem_all_reduce_kernel<float, 4>(...)", "all_reduce"),
        ("userbuffers_fp16_sum_inplace_gpu_rr_rs", "other"),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "all_gather"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"),
    ],
)
def test_communication_kernels_by_name(name, op):
    frame = pl.DataFrame({"name": [name]}).select(
        comm=pl.col("name").str.contains(COMM_KERNEL), op=coll_op(pl.col("name"))
    )
    assert frame.row(0) == (True, op)


@pytest.mark.parametrize(
    "name",
    [
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>",
        "volta_sgemm_128x64_nn",
        "void cutlass::Kernel<cutlass_80_tensorop_combine_tile>",
        "void at::native::(anonymous namespace)::softmax_warp_forward<float, 8>",
        "triton_per_fused_native_layer_norm_dispatch_0",
    ],
)
def test_compute_kernels_are_not_communication(name):
    assert not pl.select(pl.lit(name).str.contains(COMM_KERNEL)).item()


def _renamed(tmp_path, new_name: str):
    text = DLRM.read_text()
    assert text.count('"name": "ncclKernel_SendRecv_') == 5
    path = tmp_path / DLRM.name
    path.write_text(text.replace('"name": "ncclKernel_SendRecv_', f'"name": "{new_name}'))
    return path


def _step(path, **kw) -> dict:
    return tracediag.analyze(tracediag.load(path, **kw)).steps.row(0, named=True)


@needs_shared(DLRM)
def test_deepep_kernels_count_as_communication_like_the_nccl_ones(tmp_path):
    """The DLRM step's embedding exchange, renamed as DeepEP's dispatch kernel: the same communication
    (all_to_all now, by the name), the same exposed communication and compute as with NCCL's names."""
    original = _step(DLRM)
    path = _renamed(tmp_path, "void deep_ep::internode::dispatch<8, 768>_")
    comm = tracediag.load(path).events.filter(pl.col("name").cast(pl.String).str.contains("deep_ep"))
    assert comm.height == 5
    assert set(comm["kind"].to_list()) == {"comm"}
    assert set(comm["coll_op"]) == {"all_to_all"}
    renamed = _step(path)
    assert original["exposed_comm_ns"] > 0
    for col in ("comm_ns", "exposed_comm_ns", "compute_ns"):
        assert renamed[col] == original[col], col


@needs_shared(DLRM)
def test_comm_kernel_option_makes_an_unknown_library_communication(tmp_path, runner):
    path = _renamed(tmp_path, "my_lib::exchange_kernel_")
    original = _step(DLRM)
    unknown = _step(path)
    assert unknown["comm_ns"] < original["comm_ns"]  # counted as compute without the option
    marked = tracediag.load(path, comm_kernel=r"^my_lib::exchange")
    rows = marked.events.filter(pl.col("name").cast(pl.String).str.starts_with("my_lib"))
    assert set(rows["kind"]) == {"comm"}
    assert set(rows["coll_op"]) == {"other"}
    step = tracediag.analyze(marked).steps.row(0, named=True)
    for col in ("comm_ns", "exposed_comm_ns", "compute_ns"):
        assert step[col] == original[col], col
    both = [
        runner.invoke(cli, ["analyze", str(path), "--format", "json", *extra])
        for extra in ([], ["--comm-kernel", "my_lib::exchange"])
    ]
    assert both[0].exit_code == both[1].exit_code == 0
    assert both[0].output != both[1].output
    ingest = runner.invoke(cli, ["ingest", str(path), "--comm-kernel", "my_lib::exchange"])
    assert ingest.exit_code == 0
    assert "comm 8" in ingest.output


def test_a_bad_comm_kernel_pattern_is_one_line(runner, tmp_path):
    with pytest.raises(TracediagError, match="--comm-kernel"):
        tracediag.load(tmp_path, comm_kernel="(")
    result = runner.invoke(cli, ["analyze", str(tmp_path), "--comm-kernel", "("])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1


A100_PAIR = [FIXTURES / "kineto" / f"hta_a100_nccl_rank{r}.json.gz" for r in (0, 1)]
"""Two real A100 ranks (NCCL kernels, GEMMs)."""


def test_comm_kernel_through_the_executor_equals_in_memory(tmp_path):
    """The workers apply --comm-kernel as `load` does: the same analysis from summaries, and not the
    one without the option (the A100 pair's GEMMs named communication)."""
    from tracediag.execute.driver import analyze_ranks

    pattern = r"(?i)gemm"
    want = tracediag.analyze(tracediag.load(A100_PAIR, comm_kernel=pattern)).to_dict()
    plain = tracediag.analyze(tracediag.load(A100_PAIR)).to_dict()
    got, _ = analyze_ranks(A100_PAIR, out=str(tmp_path / "out"), executor="local", workers=1, comm_kernel=pattern)
    assert got.to_dict() == want
    assert want["steps"] != plain["steps"]


def test_a_resumed_executor_run_with_another_comm_kernel_reads_the_files_again(tmp_path):
    from tracediag.execute.driver import summarize

    out = str(tmp_path / "out")
    first = summarize(A100_PAIR, out=out, executor="local", workers=1)
    again = summarize(A100_PAIR, out=out, executor="local", workers=1, resume=True, comm_kernel="(?i)gemm")
    assert set(first.manifest["key"]).isdisjoint(again.manifest["key"])


@pytest.mark.parametrize("command", ["analyze", "ingest"])
def test_a_bad_comm_kernel_with_the_executor_is_one_line(runner, tmp_path, command):
    out = tmp_path / "out"
    result = runner.invoke(
        cli, [command, *map(str, A100_PAIR), "--executor", "local", "--out", str(out), "--comm-kernel", "("]
    )
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert "--comm-kernel" in result.output

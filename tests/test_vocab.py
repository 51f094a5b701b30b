"""One vocabulary: every collective name means one `coll_op` in every reader (Kineto, Nsight, JAX).

Each name goes through the reader's own mapping step (the frame-to-frame function its pipeline
runs), not through `vocab` directly, so a reader that kept a table of its own fails here.
"""

from __future__ import annotations

import polars as pl
import pytest

from tracediag.errors import RankError
from tracediag.ingest import jax, kineto, nsys
from tracediag.vocab import resolve_rank

KERNELS = {
    # NCCL kernels, three naming generations, and RCCL
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "all_reduce",
    "ncclKernel_AllGather_RING_LL_Sum_int8_t": "all_gather",
    "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL": "reduce_scatter",
    "ncclDevKernel_Broadcast_RING_LL": "broadcast",
    "ncclDevKernel_Reduce_Sum_f32_RING_LL": "reduce",
    "ncclDevKernel_SendRecv": "other",
    "ncclDevKernel_Generic": "other",
    "ncclAllReduceRingLLKernel_sum_f32": "all_reduce",
    "rcclKernel_AllToAll": "all_to_all",
}
API = {
    # NCCL API calls (NVTX ranges of NCCL itself)
    "ncclAllReduce": "all_reduce",
    "ncclAllGather": "all_gather",
    "ncclReduceScatter": "reduce_scatter",
    "ncclBcast": "broadcast",
    "ncclBroadcast": "broadcast",
    "ncclBarrier": "barrier",
    "ncclReduce": "reduce",
    "ncclSend": "send",
    "ncclRecv": "recv",
}
ANNOTATIONS = {
    # PyTorch's nccl:* / gloo:* annotations and c10d ops
    "nccl:all_reduce": "all_reduce",
    "nccl:_reduce_scatter_base": "reduce_scatter",
    "nccl:_all_gather_base": "all_gather",
    "nccl:all_to_all": "all_to_all",
    "nccl:broadcast": "broadcast",
    "nccl:barrier": "barrier",
    "nccl:send": "send",
    "nccl:recv": "recv",
    "nccl:all_reduce_coalesced": "all_reduce",
    "gloo:all_reduce": "all_reduce",
    "gloo:broadcast": "broadcast",
    "gloo:barrier": "barrier",
    "gloo:send": "send",
    "c10d::allreduce_": "all_reduce",
    "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::broadcast_": "broadcast",
    "c10d::recv_": "recv",
}
PARAM_COMMS = {
    # record_param_comms `Collective name` values
    "allreduce": "all_reduce",
    "_allgather_base": "all_gather",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_allv": "all_to_all",
    "broadcast": "broadcast",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "gather": "gather",
    "scatter": "scatter",
}
HLO = {"all-reduce-start.3": "all_reduce", "all_gather.7": "all_gather", "psum": "all_reduce", "ppermute": "other"}

ALL_NAMES = {**KERNELS, **API, **ANNOTATIONS}


def _kineto(names: list[str], kind: str, coll_name: list[str | None] | None = None) -> list[str | None]:
    n = len(names)
    nulls = pl.Series([None] * n, dtype=pl.Int64)
    frame = pl.DataFrame(
        {
            "name": names,
            "kind": [kind] * n,
            "pid": [1] * n,
            "tid": [1] * n,
            "ts": list(range(n)),
            "dur": [1] * n,
            "external_id": nulls,
            "a_coll_name": pl.Series(coll_name or [None] * n, dtype=pl.String),
            **{c: nulls for c in ("a_in_nelems", "a_out_nelems", "a_group_size", "a_pg_id", "a_seq")},
            **{c: nulls for c in ("a_src_rank", "a_dst_rank")},
            **{c: pl.Series([None] * n, dtype=pl.String) for c in ("a_dtype", "a_pg_name")},
            **{c: pl.Series([None] * n, dtype=pl.Binary) for c in ("a_input_dims", "a_input_type")},
            "a_concrete_inputs": pl.Series([None] * n, dtype=pl.Binary),
        }
    )
    return kineto._collective_columns(frame)["coll_op"].to_list()


def _strings(names: list[str]) -> pl.DataFrame:
    return pl.DataFrame({"id": list(range(len(names))), "value": names})


def _nsys_kernels(names: list[str]) -> list[str | None]:
    n = len(names)
    raw = pl.DataFrame(
        {
            "start": [0] * n,
            "end": [1] * n,
            "globalPid": [0x1000000] * n,
            "streamId": [7] * n,
            "deviceId": [0] * n,
            "correlationId": list(range(n)),
            "shortName": list(range(n)),
            "demangledName": list(range(n)),
        }
    )
    rows, _ = nsys._kernels(raw, _strings(names))
    return rows["coll_op"].to_list()


def _nsys_nvtx(names: list[str]) -> list[str | None]:
    n = len(names)
    raw = pl.DataFrame(
        {
            "start": [0] * n,
            "end": [1] * n,
            "eventType": [59] * n,
            "globalTid": [0x1000001] * n,
            "text": names,
            "textId": pl.Series([None] * n, dtype=pl.Int64),
        }
    )
    rows, _ = nsys._nvtx(raw, _strings([]))
    return rows["coll_op"].to_list()


def _jax(names: list[str], hlo: list[str | None] | None = None) -> list[str | None]:
    n = len(names)
    frame = pl.DataFrame(
        {
            "name": names,
            "kind": ["comm"] * n,
            "a_hlo_op": pl.Series(hlo or [None] * n, dtype=pl.String),
            "a_run_id": pl.Series([None] * n, dtype=pl.String),
            "a_label": pl.Series([None] * n, dtype=pl.String),
            "pid": [1] * n,
            "tid": [1] * n,
            "ts": list(range(n)),
            "dur": [1] * n,
        }
    )
    return jax._fill_collectives(frame)["coll_op"].to_list()


NCCL_NAMES = {k: v for k, v in ALL_NAMES.items() if k.lower().startswith(("nccl", "rccl"))}
"""What Nsight sees: kernels and NVTX ranges of NCCL/RCCL (gloo and c10d names are PyTorch's)."""

READERS = {
    "kineto kernel": (lambda names: _kineto(names, "comm"), ALL_NAMES),
    "nsight kernel": (_nsys_kernels, NCCL_NAMES),
    # an NVTX range that names no collective is no collective (None), not "other"
    "nsight nvtx": (_nsys_nvtx, {k: v for k, v in NCCL_NAMES.items() if v != "other"}),
    "jax device op": (_jax, ALL_NAMES),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_maps_every_collective_name_the_same(reader):
    mapping, expected = READERS[reader]
    names = list(expected)
    assert len(names) >= 20
    assert dict(zip(names, mapping(names))) == expected


def test_host_names_and_param_comms_names_in_kineto():
    host = list(ANNOTATIONS)
    assert dict(zip(host, _kineto(host, "cpu_op"))) == ANNOTATIONS
    names = list(PARAM_COMMS)
    got = _kineto(["record_param_comms"] * len(names), "cpu_op", coll_name=names)
    assert dict(zip(names, got)) == PARAM_COMMS


def test_hlo_ops_in_jax_and_non_collective_host_rows():
    names = list(HLO)
    assert dict(zip(names, _jax(["fusion"] * len(names), hlo=names))) == HLO
    # a host op that is no collective carries none; an unknown NCCL range is no collective either
    assert _kineto(["aten::mm", "record_param_comms"], "cpu_op") == [None, None]
    assert _nsys_nvtx(["ncclGroupStart", "forward"]) == [None, None]


def test_rank_resolution_is_one_rule_with_one_message():
    w: list[str] = []
    args = {"source": "RANK", "missing": "no RANK environment string", "warnings": w}
    assert resolve_rank("f", given=None, named=(3,), default=None, **args) == 3
    assert resolve_rank("f", given=5, named=(3,), default=None, **args) == 5
    assert w == ["the file says RANK=3; using rank 5 as given"]
    assert resolve_rank("f", given=None, named=(), default=0, **args) == 0
    assert w[-1] == "the file names no rank; taken as rank 0"
    with pytest.raises(RankError, match=r"^f: the file names no rank \(no RANK environment string\); give it with"):
        resolve_rank("f", given=None, named=(), default=None, **args)
    with pytest.raises(RankError, match=r"^f: the file names several ranks \(RANK=0, RANK=1\)"):
        resolve_rank("f", given=None, named=(0, 1), default=None, **args)

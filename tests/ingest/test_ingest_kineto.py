"""The Kineto / Chrome JSON reader on real traces (issue 2)."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from typing import TYPE_CHECKING

import polars as pl
import pytest
from conftest import KINETO, SAMPLES, needs_shared

from tracediag.errors import RankError
from tracediag.ingest.read import read_file
from tracediag.schema import EVENT_SCHEMA, SKIP_REASONS

if TYPE_CHECKING:
    from pathlib import Path


def _load_json(path: Path) -> dict | list:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data, parse_float=Decimal)


def _events(trace: dict | list) -> list:
    return trace if isinstance(trace, list) else trace["traceEvents"]


def _is_num(v: object) -> bool:
    return isinstance(v, (int, Decimal)) and not isinstance(v, bool)


def _expected_rows(events: list) -> int:
    """Independent count: complete events with numeric ts and non-negative dur."""
    return sum(
        1 for e in events if e.get("ph") == "X" and _is_num(e.get("ts")) and _is_num(e.get("dur")) and e["dur"] >= 0
    )


def _expected_ns(trace: dict, value: Decimal | int) -> int:
    base = trace.get("baseTimeNanoseconds", 0) if isinstance(trace, dict) else 0
    return base + int((Decimal(value) * 1000).to_integral_value())


FIXTURE_FILES = sorted(p for p in KINETO.iterdir() if p.name.endswith((".json", ".json.gz")))


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
def test_every_fixture_event_is_a_row_or_counted(path: Path) -> None:
    trace = _load_json(path)
    events = _events(trace)
    ft = read_file(path, default_rank=0)
    assert ft.meta.events_in == len(events)
    assert ft.events.height + sum(ft.meta.skipped.values()) == len(events)
    assert ft.events.height == _expected_rows(events)
    assert ft.events.schema == pl.Schema(EVENT_SCHEMA)
    assert set(ft.meta.skipped) <= set(SKIP_REASONS)


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
def test_times_are_exact_absolute_ns(path: Path) -> None:
    """Every (ts, dur) equals the decimal text converted to ns (plus the base), as a multiset."""
    trace = _load_json(path)
    want = sorted(
        (_expected_ns(trace, e["ts"]), int((Decimal(e["dur"]) * 1000).to_integral_value()))
        for e in _events(trace)
        if e.get("ph") == "X" and _is_num(e.get("ts")) and _is_num(e.get("dur"))
    )
    ev = read_file(path, default_rank=0).events
    got = sorted(zip(ev["ts"].to_list(), ev["dur"].to_list()))
    assert got == want


def test_epoch_float_ns_decimals_keep_every_digit() -> None:
    """April-2024 Kineto: ts like 1712195495519689.047 µs — beyond float64 — must stay exact."""
    path = KINETO / "hta_ns_resolution_head.json.gz"
    ev = read_file(path).events
    assert 1712195495519689047 in set(ev["ts"].to_list())
    as_float = int(float("1712195495519689.047") * 1000)
    assert as_float != 1712195495519689047  # the trap the exact path avoids


def test_relative_times_use_base_nanoseconds() -> None:
    path = KINETO / "gen_torch2.13cpu_gloo_2rank_rank0.pt.trace.json.gz"
    trace = _load_json(path)
    ft = read_file(path)
    assert ft.meta.time_base == "epoch"
    step = ft.events.filter(pl.col("name") == "ProfilerStep#2")
    src = next(e for e in trace["traceEvents"] if e.get("name") == "ProfilerStep#2")
    assert step["ts"].item() == trace["baseTimeNanoseconds"] + int(Decimal(src["ts"]) * 1000)


def test_rank_and_process_groups_from_distributed_info() -> None:
    ft = read_file(KINETO / "hta_cpu_only_gloo_rank34.json.gz")
    assert ft.meta.rank == 34
    assert ft.meta.world_size == 300
    assert ft.meta.backend == "gloo"
    default = next(g for g in ft.meta.process_groups if g.name == "0")
    assert default.desc == "default_pg"
    assert default.size == 300
    assert default.ranks == tuple(range(300))
    assert set(ft.events["rank"].to_list()) == {34}


def test_missing_rank_is_an_error_naming_the_file_and_the_fix() -> None:
    path = KINETO / "hta_rank_not_found.json.gz"
    with pytest.raises(RankError) as err:
        read_file(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "--rank-from-filename" in msg
    assert "\n" not in msg
    assert read_file(path, rank=5).meta.rank == 5
    assert read_file(path, default_rank=0).meta.rank == 0


def test_gloo_trace_kinds_and_collectives() -> None:
    trace = _load_json(KINETO / "gen_torch2.13cpu_gloo_2rank_rank0.pt.trace.json.gz")
    ev = read_file(KINETO / "gen_torch2.13cpu_gloo_2rank_rank0.pt.trace.json.gz").events
    gloo_src = [e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("gloo:")]
    comm = ev.filter(pl.col("kind") == "comm")
    assert comm.height == len(gloo_src)
    assert sorted(comm["coll_op"].cast(pl.String).unique().to_list()) == ["all_gather", "all_reduce", "barrier", "send"]
    # all_reduce of the 9352 float gradients recorded in `Input Dims`
    assert set(comm.filter(pl.col("coll_op") == "all_reduce")["coll_bytes"].to_list()) == {9352 * 4}
    # the send's peer comes from the enclosing c10d::send (Concrete Inputs: dst rank 1)
    assert set(comm.filter(pl.col("coll_op") == "send")["coll_peer"].to_list()) == {1}
    steps = ev.filter(pl.col("kind") == "step")["name"].cast(pl.String).to_list()
    assert sorted(steps) == ["ProfilerStep#2", "ProfilerStep#3"]
    assert (ev.filter(pl.col("kind") == "cpu_op")["device"] == -1).all()


def test_nccl_trace_kernels_devices_and_links() -> None:
    path = KINETO / "hta_a100_nccl_rank0.json.gz"
    trace = _load_json(path)
    ev = read_file(path).events
    src_kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    nccl = [e for e in src_kernels if e["name"].lower().startswith("nccl")]
    assert ev.filter(pl.col("kind") == "comm").height == len(nccl)
    assert ev.filter(pl.col("kind") == "kernel").height == len(src_kernels) - len(nccl)
    gpu = ev.filter(pl.col("kind").is_in(["kernel", "comm"]))
    assert set(gpu["device"].to_list()) == {e["args"]["device"] for e in src_kernels}
    assert set(gpu["stream"].to_list()) == {e["args"]["stream"] for e in src_kernels}
    # every kernel's correlation id is found on a runtime launch of the same file
    runtime_corr = set(ev.filter(pl.col("kind") == "runtime")["correlation"].to_list())
    assert set(gpu["correlation"].to_list()) <= runtime_corr
    ops = set(ev.filter(pl.col("kind") == "comm")["coll_op"].cast(pl.String).to_list())
    assert ops == {"all_reduce", "all_gather", "all_to_all"}  # by their launch (test below)


def test_rocm_trace_reads_hip_runtime_and_kernels() -> None:
    ev = read_file(KINETO / "hta_rocm_mi250.json.gz", default_rank=0).events
    assert ev.filter(pl.col("kind") == "runtime")["name"].cast(pl.String).str.starts_with("hip").all()
    assert ev.filter(pl.col("kind") == "kernel").height == 14


def test_plain_json_and_array_form(tmp_path: Path) -> None:
    trace = _load_json(KINETO / "hta_backward_thread.json")
    array = tmp_path / "array.json"
    array.write_text(json.dumps(trace["traceEvents"], default=str).replace('"', '"'))
    obj = read_file(KINETO / "hta_backward_thread.json", default_rank=0)
    arr = read_file(array, default_rank=0)
    assert arr.events.height == obj.events.height == _expected_rows(trace["traceEvents"])


@needs_shared(SAMPLES)
def test_every_shared_sample_is_a_row_or_counted() -> None:
    """Rows + skipped = events for every JSON trace in ../shared/trace-samples (independent count)."""
    checked = 0
    for path in sorted(SAMPLES.rglob("*.json*")):
        trace = _load_json(path)
        if isinstance(trace, dict) and "traceEvents" not in trace:
            continue  # execution traces and other non-trace JSON
        events = _events(trace)
        ft = read_file(path, default_rank=0)
        assert ft.events.height + sum(ft.meta.skipped.values()) == len(events), path
        assert ft.meta.events_in == len(events), path
        if ft.meta.format == "kineto":
            assert ft.events.height == _expected_rows(events), path
        checked += 1
    assert checked >= 30


@pytest.mark.parametrize(
    "name",
    [
        "hta_a100_nccl_rank0.json.gz",
        "gen_torch2.13cpu_gloo_2rank_rank0.pt.trace.json.gz",
        "hta_ns_resolution_head.json.gz",
    ],
)
def test_decoding_in_pieces_equals_decoding_whole(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Large files are decoded in pieces cut between events; the table must not depend on the cuts."""
    from polars.testing import assert_frame_equal

    from tracediag.ingest import chrome

    whole = read_file(KINETO / name, default_rank=0)
    monkeypatch.setattr(chrome, "CHUNK_BYTES", 3000)
    pieces = read_file(KINETO / name, default_rank=0)
    assert_frame_equal(whole.events, pieces.events)
    assert whole.meta == pieces.meta


def test_piece_cut_inside_a_string_and_truncated_tail(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tracediag.ingest import chrome

    trace = json.loads(gzip.decompress((KINETO / "gen_torch2.13cpu_gloo_2rank_rank0.pt.trace.json.gz").read_bytes()))
    xs = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    for e in xs[::7]:
        e["name"] = "odd}, {name"  # a piece boundary pattern inside a string
    text = json.dumps(trace)
    path = tmp_path / "odd.json"
    path.write_text(text)
    monkeypatch.setattr(chrome, "CHUNK_BYTES", 2000)
    ft = read_file(path)
    assert ft.events.height == len(xs)
    assert ft.events.filter(pl.col("name") == "odd}, {name").height == len(xs[::7])
    cut = tmp_path / "cut.json"
    cut.write_text(text[: len(text) * 2 // 3])
    ft = read_file(cut)
    assert ft.meta.skipped.get("truncated") == 1
    assert ft.events.height + sum(ft.meta.skipped.values()) == ft.meta.events_in


def test_distributed_info_variants(tmp_path: Path) -> None:
    """Kineto's on-demand writer: rank as a string, `uid` for the description, ranks as "[0, 1]"."""
    text = gzip.decompress((KINETO / "gen_torch2.13cpu_gloo_2rank_rank1.pt.trace.json.gz").read_bytes())
    trace = json.loads(text)
    trace["distributedInfo"] = {
        "backend": "nccl",
        "rank": "1",
        "world_size": 2,
        "pg_config": [{"pg_name": "0", "uid": "default_pg", "pg_size": 2, "ranks": "[0, 1]"}],
        "nccl_version": "unknown",
    }
    path = tmp_path / "ondemand.json"
    path.write_text(json.dumps(trace))
    meta = read_file(path).meta
    assert meta.rank == 1
    assert meta.backend == "nccl"
    assert meta.process_groups[0].ranks == (0, 1)
    assert meta.process_groups[0].desc == "default_pg"


@pytest.mark.parametrize("chunk", [None, 3000], ids=["whole", "pieces"])
def test_base_time_after_trace_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int | None) -> None:
    """2024 Kineto wrote `baseTimeNanoseconds` after `traceEvents`; times must be the same."""
    from tracediag.ingest import chrome

    if chunk:
        monkeypatch.setattr(chrome, "CHUNK_BYTES", chunk)
    src = KINETO / "gen_torch2.13cpu_gloo_2rank_rank0.pt.trace.json.gz"
    trace = json.loads(gzip.decompress(src.read_bytes()))
    base = trace.pop("baseTimeNanoseconds")
    reordered = {**trace, "baseTimeNanoseconds": base}
    assert list(reordered)[-1] == "baseTimeNanoseconds"
    path = tmp_path / "late_base.json"
    path.write_text(json.dumps(reordered))
    assert read_file(path).events["ts"].to_list() == read_file(src).events["ts"].to_list()


def test_nccl_sendrecv_kernels_take_the_operation_their_launch_ran_inside():
    """A real A100 trace (HTA's sample): NCCL runs its all_reduce, all_gather and all_to_all here as
    `ncclKernel_SendRecv_…` kernels, whose name says no operation; the host collective around each
    kernel's `cudaLaunchKernel` (same correlation) names it, so they are matched as those instances."""
    events = read_file(KINETO / "hta_a100_nccl_rank0.json.gz").events
    kernels = events.filter(pl.col("kind") == "comm")
    assert kernels["name"].cast(pl.String).str.starts_with("ncclKernel_SendRecv_").all()
    got = kernels.group_by("coll_op").len().sort("coll_op")
    assert dict(zip(got["coll_op"].cast(pl.String), got["len"])) == {"all_gather": 2, "all_reduce": 4, "all_to_all": 4}
    hosts = events.filter(pl.col("name").cast(pl.String).str.starts_with("nccl:")).group_by("coll_op").len()
    assert dict(zip(hosts["coll_op"].cast(pl.String), hosts["len"])) == {
        "all_gather": 2,
        "all_reduce": 4,
        "all_to_all": 4,
    }

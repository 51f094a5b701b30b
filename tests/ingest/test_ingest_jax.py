"""The JAX profiler reader on real traces (issue 6, JAX part)."""

from __future__ import annotations

import gzip
import json
import shutil
from decimal import Decimal
from typing import TYPE_CHECKING

import polars as pl
import pytest
from conftest import FIXTURES

from tracediag.cli import cli
from tracediag.errors import RankError, TraceError
from tracediag.ingest.read import read_file
from tracediag.run import load
from tracediag.schema import EVENT_SCHEMA
from tracediag.vocab import HLO_COLLECTIVES, hlo_stem

if TYPE_CHECKING:
    from pathlib import Path

JAX = FIXTURES / "jax"
CPU2DEV = JAX / "gen_jax0.10.2_cpu2dev.trace.json.gz"
CPU4DEV = JAX / "gen_jax0.10.2_cpu4dev.trace.json.gz"
PROC = [JAX / f"gen_jax0.10.2_cpu2proc_p{i}.trace.json.gz" for i in (0, 1)]
JSON_FILES = sorted(JAX.glob("*.json.gz"))
PROFILE_START_NS = {  # Task Environment `profile_start_time`, read with jax.profiler.ProfileData
    "gen_jax0.10.2_cpu2dev": 1795963707654346107,
    "gen_jax0.10.2_cpu4dev": 1795967663476815022,
    "gen_jax0.10.2_cpu2proc_p0": 1795967666835040565,
    "gen_jax0.10.2_cpu2proc_p1": 1795967666837274181,
}


def _events(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)["traceEvents"]


def _stem(path: Path) -> str:
    return path.name.split(".trace.json")[0].split(".perfetto_trace.json")[0]


def _ns(value: Decimal | int) -> int:
    return int((Decimal(value) * 1000).to_integral_value())


def _complete(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and "ts" in e and "dur" in e]


@pytest.mark.parametrize("path", JSON_FILES, ids=lambda p: p.name)
def test_every_event_is_a_row_or_counted(path: Path) -> None:
    events = _events(path)
    ft = read_file(path, default_rank=0)
    assert ft.meta.format == "jax"
    assert ft.meta.events_in == len(events)
    assert ft.events.height == len(_complete(events))
    assert ft.events.height + sum(ft.meta.skipped.values()) == len(events)
    assert ft.meta.skipped["metadata"] == sum(e.get("ph") == "M" for e in events)
    assert ft.meta.skipped["malformed"] == 1  # JAX ends traceEvents with an empty `{}`
    assert ft.events.schema == pl.Schema(EVENT_SCHEMA)


@pytest.mark.parametrize("path", JSON_FILES, ids=lambda p: p.name)
def test_times_are_profile_start_plus_exact_decimal(path: Path) -> None:
    """The xplane.pb beside the file gives the epoch start; ts/dur keep every decimal digit."""
    start = PROFILE_START_NS[_stem(path)]
    want = sorted((start + _ns(e["ts"]), _ns(e["dur"])) for e in _complete(_events(path)))
    ft = read_file(path, default_rank=0)
    assert ft.meta.time_base == "epoch"
    assert sorted(ft.events.select("ts", "dur").iter_rows()) == want


def test_without_xplane_times_are_relative_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "host.trace.json.gz"
    shutil.copy(CPU2DEV, path)
    ft = read_file(path, default_rank=0)
    assert ft.meta.time_base == "relative"
    assert any("relative to the profile start" in w for w in ft.meta.warnings)
    train0 = ft.events.filter(pl.col("name") == "train#0")
    assert train0["ts"].item() == 20841
    assert train0["dur"].item() == 125259724


def test_raw_profile_folder_layout_finds_the_xplane(tmp_path: Path) -> None:
    """As JAX writes it: `<host>.xplane.pb` (not gzipped) beside `perfetto_trace.json.gz`."""
    shutil.copy(JAX / "gen_jax0.10.2_cpu2dev.perfetto_trace.json.gz", tmp_path / "perfetto_trace.json.gz")
    xplane = gzip.decompress((JAX / "gen_jax0.10.2_cpu2dev.xplane.pb.gz").read_bytes())
    (tmp_path / "vm.xplane.pb").write_bytes(xplane)
    ft = read_file(tmp_path / "perfetto_trace.json.gz", default_rank=0)
    assert ft.meta.time_base == "epoch"
    train0 = ft.events.filter(pl.col("name") == "train#0")["ts"].item()
    assert train0 == PROFILE_START_NS["gen_jax0.10.2_cpu2dev"] + 20841


def test_xplane_of_another_profile_is_not_used(tmp_path: Path) -> None:
    """cpu2dev runs 126 ms; the cpu2proc profile lasted 49 ms, so its start cannot be this trace's."""
    shutil.copy(CPU2DEV, tmp_path / "x.trace.json.gz")
    shutil.copy(JAX / "gen_jax0.10.2_cpu2proc_p0.xplane.pb.gz", tmp_path / "x.xplane.pb.gz")
    ft = read_file(tmp_path / "x.trace.json.gz", default_rank=0)
    assert ft.meta.time_base == "relative"
    assert any("another profile" in w for w in ft.meta.warnings)


def test_corrupt_xplane_is_a_warning_not_an_error(tmp_path: Path) -> None:
    shutil.copy(CPU2DEV, tmp_path / "x.trace.json.gz")
    (tmp_path / "x.xplane.pb").write_bytes(b"\x0a\xff\xff\xff\x0f garbage")
    ft = read_file(tmp_path / "x.trace.json.gz", default_rank=0)
    assert ft.meta.time_base == "relative"
    assert any("x.xplane.pb could not be read" in w for w in ft.meta.warnings)


@pytest.mark.parametrize(
    ("xplane", "why"),
    [
        (b"\x08\x05", "a plane is a number where a message goes"),  # XSpace.planes as a varint
        (b"\x0a\x06\x10\x80\x80\x80\x80\x40", "a plane's name is a number where a message goes"),  # name = 2**46
    ],
)
def test_an_xplane_field_of_the_wrong_wire_type_is_a_warning(tmp_path: Path, xplane: bytes, why: str) -> None:
    """Found by benchmarks/fuzz_campaign.py: a damaged xplane beside a real trace was an internal error
    (TypeError: len() of an int); a plane's name as a varint of 2**46 asked `bytes()` for 64 TB."""
    shutil.copy(CPU2DEV, tmp_path / "x.trace.json.gz")
    (tmp_path / "x.xplane.pb").write_bytes(xplane)
    ft = read_file(tmp_path / "x.trace.json.gz", default_rank=0)
    assert ft.meta.time_base == "relative"
    assert f"x.xplane.pb could not be read ({why}); times are relative" in ft.meta.warnings


def test_perfetto_and_trace_json_give_the_same_table() -> None:
    a = read_file(CPU2DEV, default_rank=0).events.sort("ts", "tid", "name", "dur")
    b = read_file(JAX / "gen_jax0.10.2_cpu2dev.perfetto_trace.json.gz", default_rank=0).events
    assert a.equals(b.sort("ts", "tid", "name", "dur"))


def test_step_rows_are_named_with_their_step_number() -> None:
    src = [e for e in _events(CPU4DEV) if "step_num" in e.get("args", {})]
    steps = read_file(CPU4DEV, default_rank=0).events.filter(pl.col("kind") == "step").sort("ts")
    assert steps["name"].cast(pl.String).to_list() == ["train#0", "train#1", "train#2", "train#3"]
    assert steps["dur"].to_list() == [_ns(e["dur"]) for e in sorted(src, key=lambda e: e["ts"])]
    assert set(steps["device"].to_list()) == {-1}


def test_collectives_are_classified_by_hlo_op() -> None:
    ev = read_file(CPU4DEV, default_rank=0).events
    comm = ev.filter(pl.col("kind") == "comm")
    ops = dict(comm.group_by("name").agg(pl.col("coll_op").cast(pl.String).unique()).iter_rows())
    assert ops == {
        "psum.7": ["all_reduce"],
        "all_gather.7": ["all_gather"],
        "reduce_scatter.7": ["reduce_scatter"],
        "all-to-all": ["all_to_all"],
        "ppermute.3": ["other"],
    }
    assert comm.height == 5 * 4 * 4  # five collectives, four devices, four steps
    assert comm["coll_group"].unique().to_list() == ["0,1,2,3"]
    assert comm["coll_group_size"].unique().to_list() == [4]
    # compute ops whose names contain collective words stay kernels; no collective is counted twice
    kernels = set(ev.filter(pl.col("kind") == "kernel")["name"].cast(pl.String).to_list())
    assert {"broadcast_multiply_fusion", "wrapped_reduce", "dot"} <= kernels
    assert ev.filter(pl.col("coll_op").is_not_null() & (pl.col("kind") != "comm")).height == 0
    helpers = ev.filter(pl.col("name").cast(pl.String).is_in(["Rendezvous", "end: psum.7"]))
    assert helpers.height == 80 + 16
    assert set(helpers["kind"].cast(pl.String).to_list()) == {"other"}


def test_collective_seq_is_the_run_id_and_pairs_devices() -> None:
    src = [e for e in _events(CPU4DEV) if e.get("args", {}).get("hlo_op") == "psum.7"]
    psum = read_file(CPU4DEV, default_rank=0).events.filter(pl.col("name") == "psum.7")
    assert sorted(psum["coll_seq"].to_list()) == sorted(int(e["args"]["run_id"]) for e in src)
    per_instance = psum.group_by("coll_seq").agg(pl.col("device").sort())
    assert per_instance.height == 4
    assert all(d == [0, 1, 2, 3] for d in per_instance["device"].to_list())


def test_xla_ops_take_device_from_ordinal_and_stream_from_thread() -> None:
    src = {
        (_ns(e["ts"]), e["tid"]): int(e["args"]["device_ordinal"])
        for e in _events(CPU2DEV)
        if "hlo_op" in e.get("args", {})
    }
    ft = read_file(CPU2DEV, default_rank=0)
    start = PROFILE_START_NS["gen_jax0.10.2_cpu2dev"]
    ops = ft.events.filter(pl.col("kind").is_in(["kernel", "comm"]))
    got = {(ts - start, tid): dev for ts, tid, dev in ops.select("ts", "tid", "device").iter_rows()}
    assert got == src
    assert (ops["stream"] == ops["tid"]).all()
    assert set(ft.events.filter(pl.col("kind") == "cpu_op")["device"].to_list()) == {-1}
    assert ft.meta.devices == ("cpu:0", "cpu:1")


def test_rank_rules() -> None:
    with pytest.raises(RankError) as err:
        read_file(CPU2DEV)
    msg = str(err.value)
    assert str(CPU2DEV) in msg
    assert "--rank-from-filename" in msg
    assert "--rank FILE=N" in msg
    assert "\n" not in msg
    given = read_file(CPU2DEV, rank=7, default_rank=0)
    assert given.meta.rank == 7
    assert set(given.events["rank"].to_list()) == {7}
    assert not any("taken as rank" in w for w in given.meta.warnings)
    default = read_file(CPU2DEV, default_rank=0)
    assert default.meta.rank == 0
    assert "the file names no rank; taken as rank 0" in default.meta.warnings


def test_two_process_run_lines_up_collectives_across_ranks() -> None:
    """Each psum instance (one run_id) has 4 participants over 2 ranks, overlapping in epoch time.

    Without the xplane start times the two processes' clocks are offset by 2.2 ms and the last
    instance's participants would not overlap.
    """
    run = load(PROC, rank_from_filename=r"_p(\d+)\.", jobs=1)
    assert run.meta.ranks == [0, 1]
    assert {f.time_base for f in run.meta.files} == {"epoch"}
    psum = run.events.filter(pl.col("kind") == "comm")
    inst = psum.group_by("coll_seq").agg(
        pl.len(),
        pl.col("rank").n_unique().alias("ranks"),
        pl.col("ts").max().alias("last_start"),
        (pl.col("ts") + pl.col("dur")).min().alias("first_end"),
    )
    assert inst.height == 4
    assert inst["len"].to_list() == [4] * 4
    assert inst["ranks"].to_list() == [2] * 4
    assert (inst["last_start"] <= inst["first_end"]).all()
    steps = run.events.filter(pl.col("kind") == "step").group_by("name").agg(pl.col("rank").sort())
    assert sorted(steps["name"].cast(pl.String).to_list()) == [f"train#{i}" for i in range(4)]
    assert all(r == [0, 1] for r in steps["rank"].to_list())


def test_cli_ingest_reads_jax_files_from_content(runner, tmp_path: Path) -> None:
    """Names that say nothing about the format: the content decides."""
    for i, src in enumerate(PROC):
        shutil.copy(src, tmp_path / f"proc{i}.json.gz")
    out = tmp_path / "run.parquet"
    result = runner.invoke(
        cli, ["ingest", str(tmp_path), "-o", str(out), "-j", "1", "--rank-from-filename", r"proc(\d+)"]
    )
    assert result.exit_code == 0, result.output
    run = load(out)
    assert run.meta.ranks == [0, 1]
    assert {f.format for f in run.meta.files} == {"jax"}
    assert run.events.filter(pl.col("kind") == "comm").height == 16


def test_truncated_trace_keeps_complete_events(tmp_path: Path) -> None:
    text = gzip.decompress(CPU2DEV.read_bytes())
    cut = text.rfind(b'{"ph":"X"', 0, len(text) // 2) + 30
    path = tmp_path / "cut.trace.json"
    path.write_bytes(text[:cut])
    complete = text[:cut].count(b'{"ph":"X"') - 1
    ft = read_file(path, default_rank=0)
    assert ft.meta.format == "jax"
    assert ft.events.height == complete
    assert ft.meta.skipped["truncated"] == 1
    assert any("file ends early" in w for w in ft.meta.warnings)


def test_corrupt_gzip_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.trace.json.gz"
    path.write_bytes(CPU2DEV.read_bytes()[:4000])
    with pytest.raises(TraceError) as err:
        read_file(path, default_rank=0)
    msg = str(err.value)
    assert msg.startswith(f"{path}: corrupt gzip")
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("op", "stem", "coll"),
    [
        ("psum.7", "psum", "all_reduce"),
        ("all-reduce-start.3", "all-reduce", "all_reduce"),
        ("all_gather.3", "all-gather", "all_gather"),
        ("reduce-scatter.1", "reduce-scatter", "reduce_scatter"),
        ("all-to-all", "all-to-all", "all_to_all"),
        ("collective-permute-done.2", "collective-permute", "other"),
        ("send.4", "send", "send"),
        ("recv-done.4", "recv", "recv"),
        ("broadcast_multiply_fusion", "broadcast-multiply-fusion", None),
        ("wrapped_reduce.2", "wrapped-reduce", None),
    ],
)
def test_hlo_stem_and_collective_names(op: str, stem: str, coll: str | None) -> None:
    got = pl.select(hlo_stem(pl.lit(op))).item()
    assert got == stem
    assert HLO_COLLECTIVES.get(got) == coll


def test_device_plane_rules_on_a_constructed_gpu_and_tpu_layout(tmp_path: Path) -> None:
    """Constructed (no GPU/TPU here): the layout of trace-formats.md §4.2. Stream lines are the
    GPU's work, `XLA Ops` is the TPU's; derived lines are annotations; host `hlo_op` rows are launches."""

    def x(pid, tid, name, ts, dur, **args):
        return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur, "args": args}

    def m(pid, tid, kind, label):
        return {"ph": "M", "pid": pid, "tid": tid, "name": kind, "args": {"name": label}}

    events = [
        m(701, None, "process_name", "/host:CPU"),
        m(1, None, "process_name", "/device:GPU:1"),
        m(2, None, "process_name", "/device:TPU:0"),
        m(1, 14, "thread_name", "Stream #14(Compute)"),
        m(1, 15, "thread_name", "Stream #15(MemcpyH2D)"),
        m(1, 1, "thread_name", "XLA Ops"),
        m(2, 3, "thread_name", "XLA Ops"),
        m(2, 4, "thread_name", "Steps"),
        x(701, 9, "train", 1, 100, step_num="5"),
        x(701, 9, "cuLaunchKernel", 2, 1),
        x(701, 9, "ThunkExecutor", 2, 1, hlo_op="fusion.3", device_ordinal="1"),
        x(1, 14, "fusion_kernel", 3, 10, hlo_op="fusion.3", run_id="11"),
        x(1, 14, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 14, 20, hlo_op="all-reduce-start.1", run_id="11"),
        x(1, 15, "MemcpyH2D", 40, 5),
        x(1, 1, "fusion.3", 3, 10, hlo_op="fusion.3"),
        x(2, 3, "all-reduce-start.2", 3, 2, hlo_op="all-reduce-start.2", run_id="12"),
        x(2, 3, "all-reduce-done.2", 6, 9, hlo_op="all-reduce-done.2", run_id="12"),
        x(2, 3, "fusion.1", 16, 4, hlo_op="fusion.1"),
        x(2, 4, "5", 3, 20),
    ]
    path = tmp_path / "gpu.trace.json"
    trace = {"displayTimeUnit": "ns", "metadata": {"highres-ticks": True}, "traceEvents": events}
    path.write_text(json.dumps(trace))
    ev = read_file(path, default_rank=0).events.sort("pid", "ts", "name")
    got = list(ev.select("name", "kind", "device", "stream", "coll_op", "coll_seq").iter_rows())
    assert got == [
        ("fusion.3", "annotation", 1, None, None, None),
        ("fusion_kernel", "kernel", 1, 14, None, None),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "comm", 1, 14, "all_reduce", 11),
        ("MemcpyH2D", "memcpy", 1, 15, None, None),
        ("5", "annotation", 0, None, None, None),
        ("all-reduce-start.2", "comm", 0, None, "all_reduce", 12),
        ("all-reduce-done.2", "sync", 0, None, None, None),
        ("fusion.1", "kernel", 0, None, None, None),
        ("train#5", "step", -1, None, None, None),
        ("ThunkExecutor", "cpu_op", -1, None, None, None),
        ("cuLaunchKernel", "runtime", -1, None, None, None),
    ]

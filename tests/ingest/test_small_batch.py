"""Small files read in batches (`ingest.read.read_small`) give what each file gives read alone: the same
event table (in time order, as `load` orders a file's events), metadata, counts and warnings; a damaged
or refused file in a batch is read alone and reported as alone, and the others are untouched."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import pickle
import shutil
import zlib

import pytest
from conftest import KINETO, RUNS, SAMPLES, needs_shared
from polars.testing import assert_frame_equal

import tracediag.ingest.read as read_module
import tracediag.run as run_module
from tracediag.ingest import chrome
from tracediag.ingest.read import read_small, read_traces
from tracediag.run import _by_time, _read_group, _read_one, load

KINETO_FILES = [
    *sorted((RUNS / "healthy_ddp").glob("rank*.pt.trace.json.gz")),
    KINETO / "gen_torch2.13cpu_gloo_2rank_rank0.pt.trace.json.gz",  # gloo collectives, recorded shapes
    KINETO / "hta_a100_nccl_rank1.json.gz",  # NCCL kernels, record_param_comms
    KINETO / "hta_backward_thread.json",  # plain JSON, no distributedInfo.rank
    KINETO / "hta_cpu_only_gloo_rank34.json.gz",
    KINETO / "hta_ns_resolution_head.json.gz",
    KINETO / "hta_rocm_mi250.json.gz",
    KINETO / "hta_triton_example.json.gz",
    *sorted((RUNS / "windows_repeat2").glob("*.pt.trace.json.gz"))[:2],
]


def _sorted(traces):
    return [dataclasses.replace(t, events=_by_time(t.events)) for t in traces]


def _alone(path, rank=None, default_rank=None):
    return _sorted(read_traces(path, rank=rank, default_rank=default_rank))


def _assert_same(together, alone):
    assert together is not None
    assert len(together) == len(alone) == 1
    assert_frame_equal(together[0].events, alone[0].events)
    assert together[0].meta == alone[0].meta


@pytest.mark.parametrize("rows", [None, 1], ids=["one-take", "a-take-a-file"])
def test_a_batch_of_real_traces_equals_each_read_alone(monkeypatch, rows):
    if rows is not None:  # the scanner's rows turned into frames after every file
        monkeypatch.setattr(chrome, "SMALL_BATCH_ROWS", rows)
    tasks = [(str(p), None, 0) for p in KINETO_FILES]
    together = read_small(tasks)
    assert all(t is not None for t in together)  # all of them small Kineto files: none read alone
    for (path, rank, default), trace in zip(tasks, together):
        _assert_same(trace, _alone(path, rank, default))
    metas = [t[0].meta for t in together]
    # what differs between the files, per file: their own counts, warnings and time bases
    assert len({m.events_in for m in metas}) > 3
    named_none = [m.warnings == ("the file names no rank; taken as rank 0",) for m in metas]
    assert any(named_none)
    assert not all(named_none)
    assert any(m.skipped.get("flow") for m in metas)
    assert any(not m.skipped.get("flow") for m in metas)
    assert any(t[0].events["coll_op"].is_not_null().any() for t in together)


def test_given_ranks_and_defaults_are_each_files_own():
    paths = [str(p) for p in KINETO_FILES[:4]]
    tasks = [(p, 10 + k, None) for k, p in enumerate(paths)]
    together = read_small(tasks)
    for (path, rank, default), trace in zip(tasks, together):
        _assert_same(trace, _alone(path, rank, default))
        assert trace[0].meta.rank == rank
        assert trace[0].events["rank"].unique().to_list() == [rank]
    assert together[1][0].meta.warnings == ("the file says distributedInfo.rank=1; using rank 11 as given",)


@needs_shared(SAMPLES / "hta")
def test_shared_samples_batched_equal_alone():
    paths = sorted(str(p) for p in (SAMPLES / "hta").rglob("*.json.gz"))
    tasks = [(p, None, 0) for p in paths]
    together = read_small(tasks)
    assert sum(t is not None for t in together) >= len(paths) // 2
    for (path, rank, default), trace in zip(tasks, together):
        if trace is not None:
            _assert_same(trace, _alone(path, rank, default))


def _damaged(tmp_path):
    """A batch with bad files in its middle: a cut gzip, a JSON cut short, a file naming no rank, not JSON."""
    good = [shutil.copy(p, tmp_path / f"rank{k}.pt.trace.json.gz") for k, p in enumerate(KINETO_FILES[:4])]
    raw = (RUNS / "healthy_ddp" / "rank0.pt.trace.json.gz").read_bytes()
    cut_gzip = tmp_path / "rank10.pt.trace.json.gz"
    cut_gzip.write_bytes(raw[: len(raw) // 2])
    text = gzip.decompress(raw)
    cut_json = tmp_path / "rank11.pt.trace.json"
    cut_json.write_bytes(text[: len(text) // 2])
    no_rank = shutil.copy(KINETO / "hta_triton_example.json.gz", tmp_path / "worker.json.gz")
    not_json = tmp_path / "rank12.json"
    not_json.write_bytes(b"rank,step,name\n")
    members = tmp_path / "rank13.pt.trace.json.gz"  # two gzip members: one trace, as `gzip` reads it
    members.write_bytes(gzip.compress(text[:1000]) + gzip.compress(text[1000:]))
    bad = (cut_gzip, cut_json, no_rank, not_json, members)
    return [str(p) for p in (good[0], bad[0], good[1], *bad[1:], good[2], good[3])]


def _isal() -> object:
    return pytest.importorskip("isal.isal_zlib", reason="the optional gunzip extra (isal) is not installed")


GUNZIPS = {
    "isal": lambda: functools.partial(read_module._gunzip, _isal()),
    "pyarrow": lambda: read_module._arrow_gunzip,
    "zlib": lambda: functools.partial(read_module._gunzip, zlib),
}


@pytest.mark.parametrize("gunzip", list(GUNZIPS))
def test_damaged_files_in_a_batch_are_reported_as_alone(tmp_path, monkeypatch, gunzip):
    chosen = GUNZIPS[gunzip]()
    monkeypatch.setattr(read_module, "_gunzipper", lambda _files: chosen)
    paths = _damaged(tmp_path)
    tasks = [(p, None, None, None) for p in paths]
    together = _read_group(tasks)
    for task, result in zip(tasks, together):
        alone = _read_one(task)
        if isinstance(alone, tuple):  # an error: word for word
            assert result == alone
        else:  # in time order, as `load` orders it (a file read alone comes in file order)
            _assert_same(_sorted(result), _sorted(alone))
    errors = [r[0] for r in together if isinstance(r, tuple)]
    assert len(errors) == 3  # the cut gzip, the file naming no rank, the file of no known format
    assert any("corrupt gzip" in e for e in errors)
    assert any("names no rank" in e for e in errors)
    cut = together[3]
    assert cut[0].meta.warnings[0].startswith("file ends early")
    assert cut[0].meta.skipped["truncated"] == 1


def _file_by_file(monkeypatch):
    monkeypatch.setattr(run_module, "read_small", lambda tasks: [None] * len(tasks))


@pytest.mark.parametrize("jobs", [1, 2])
def test_load_batched_equals_load_file_by_file(tmp_path, monkeypatch, jobs):
    paths = _damaged(tmp_path)
    for k, p in enumerate(KINETO_FILES[4:]):
        paths.append(shutil.copy(p, tmp_path / f"rank{20 + k}{''.join(p.suffixes[-2:])}"))
    batched = load(paths, jobs=jobs, rank_from_filename=r"rank(\d+)")
    _file_by_file(monkeypatch)
    alone = load(paths, jobs=1, rank_from_filename=r"rank(\d+)")
    assert_frame_equal(batched.events, alone.events)
    assert batched.meta == alone.meta
    assert len(batched.meta.errors) == 3
    assert len(batched.meta.files) == len(paths) - 3


def test_profiler_windows_in_a_batch_are_merged_as_ever(monkeypatch):
    folder = RUNS / "windows_repeat2"
    batched = load(folder)
    _file_by_file(monkeypatch)
    alone = load(folder)
    assert_frame_equal(batched.events, alone.events)
    assert batched.meta == alone.meta
    assert len(batched.meta.files) == 4
    assert all(len(f.windows) == 1 for f in batched.meta.files)


def test_run_metadata_dict_is_asdict():
    meta = load(RUNS / "windows_repeat2").meta
    meta = dataclasses.replace(meta, errors=("x.json: empty file",), ignored=("manifest.json: not a trace",))
    assert any(f.process_groups for f in meta.files)
    assert meta.to_dict() == dataclasses.asdict(meta)


def test_a_workers_results_ship_as_one_table_and_unpack_equal(tmp_path):
    tasks = [(p, None, None, None) for p in _damaged(tmp_path)]
    results = _read_group(tasks)
    shipped = run_module._Shipped.pack(results)
    assert isinstance(shipped, run_module._Shipped)
    back = pickle.loads(pickle.dumps(shipped)).unpack()
    assert len(back) == len(results)
    for got, want in zip(back, results):
        if isinstance(want, tuple):
            assert got == want
        else:
            _assert_same(got, want)


def test_small_files_are_grouped_so_that_every_process_reads():
    small = [(str(p), None, None, None) for p in KINETO_FILES[:4]]
    assert [len(g) for g in run_module._groups(small, 1)] == [4]
    assert [len(g) for g in run_module._groups(small, 2)] == [1, 1, 1, 1]  # -j 2: each process gets files
    many = small * 700
    assert {len(g) for g in run_module._groups(many, 1)} == {run_module.SMALL_GROUP, 2800 % run_module.SMALL_GROUP}
    assert max(len(g) for g in run_module._groups(many, 2)) == run_module.SMALL_GROUP
    assert {len(g) for g in run_module._groups(small * 200, 2)} == {800 // 8}  # 8 groups, 4 a process


def test_the_summary_path_reads_a_group_together_as_each_alone(tmp_path, monkeypatch):
    from tracediag.execute.task import RankTask, summarize_files

    paths = _damaged(tmp_path)

    def rows(out):
        got = summarize_files([RankTask(path=p, out=str(out), rank=k) for k, p in enumerate(paths)])
        return sorted(({k: v for k, v in r.items() if k not in ("seconds", "attempt")} for r in got), key=str)

    together = []

    def spy(tasks):
        together.extend(read_small(tasks))
        return together[-len(tasks) :]

    monkeypatch.setattr(read_module, "read_small", spy)
    batched = rows(tmp_path / "batched")
    assert sum(t is not None for t in together) == 5  # the good files and the file naming no rank (given one)
    monkeypatch.setattr(read_module, "read_small", lambda tasks: [None] * len(tasks))
    alone = rows(tmp_path / "alone")
    assert len(batched) == len(paths)
    assert sum(bool(r["ok"]) for r in batched) == len(paths) - 2  # the cut gzip, the file of no format
    for got, want in zip(batched, alone):
        assert {k: v for k, v in got.items() if k != "out"} == {k: v for k, v in want.items() if k != "out"}

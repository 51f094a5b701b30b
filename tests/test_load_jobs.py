"""How many processes `load` reads with: `jobs=0` starts a worker only per `WORKER_BYTES` of input
(a worker's start and the shipping of its tables cost more than they save below that); an explicit
`jobs` is kept, capped at the CPUs and the files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES

import tracediag
import tracediag.run as run_module
from tracediag.run import WORKER_BYTES, _paying_jobs

GLOO = [FIXTURES / "kineto" / f"gen_torch2.13cpu_gloo_2rank_rank{r}.pt.trace.json.gz" for r in (0, 1)]


def _sparse(path, size: int) -> str:
    with Path(path).open("wb") as fh:
        fh.truncate(size)  # no disk used: only the size is read
    return str(path)


def _tasks(paths):
    return [(p, None, None, None) for p in paths]


def test_one_process_per_worker_bytes_of_input(tmp_path):
    big = WORKER_BYTES + WORKER_BYTES // 4
    assert _paying_jobs(_tasks([_sparse(tmp_path / "a.json", big)])) == 1
    three = [_sparse(tmp_path / f"{k}.json", big) for k in "bcd"]
    assert _paying_jobs(_tasks(three)) == 3
    assert _paying_jobs(_tasks([_sparse(tmp_path / "s.json", WORKER_BYTES // 2)] * 2)) == 1


def test_gzip_counts_as_its_decoded_size_and_a_url_as_a_worker(tmp_path):
    gz = _sparse(tmp_path / "a.json.gz", WORKER_BYTES // 4)  # about 2 WORKER_BYTES of JSON
    assert _paying_jobs(_tasks([gz])) == 2
    assert _paying_jobs(_tasks(["s3://bucket/run/rank0.json", "s3://bucket/run/rank1.json"])) == 2
    assert _paying_jobs(_tasks([str(tmp_path / "missing.json")])) == 1


def test_small_runs_are_read_here_and_an_explicit_jobs_is_kept(tmp_path, monkeypatch):
    started = []

    def record(fn, tasks, jobs, **_kw):
        started.append(jobs)
        return [fn(t) for t in tasks]

    monkeypatch.setattr(run_module, "map_in_workers", record)
    files = [shutil.copy(src, tmp_path / src.name) for src in GLOO]
    assert tracediag.load(files).events.height > 0
    assert started == []  # two small files: no worker
    tracediag.load(files, jobs=2)
    if (os.cpu_count() or 1) >= 2:
        assert started == [2]
    else:
        pytest.skip("one CPU: jobs=2 is capped at 1")

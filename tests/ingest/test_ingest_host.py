"""The host a trace names (`FileMeta.host`), on every reader path that has one: Kineto's top-level
`host_name` (C scanner, msgspec, small-file batch) and Nsight's `TARGET_INFO_SYSTEM_ENV` `Hostname`."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import FIXTURES, SAMPLES, needs_shared

import tracediag
from tracediag.ingest import native
from tracediag.ingest.read import read_file

HEALTHY = FIXTURES / "runs/healthy_ddp"
NSYS = SAMPLES / "gpu-public/formats/saxpy-mpi-cuda_nsys_perlmutter0.sqlite"


@pytest.mark.parametrize("scanner", [True, False], ids=["scanner", "msgspec"])
def test_every_kineto_path_reads_the_host(monkeypatch, scanner):
    with monkeypatch.context() as m:
        if not scanner:
            m.setattr(native, "_chromescan", None)
        assert read_file(HEALTHY / "rank0.pt.trace.json.gz").meta.host == "vm"
        assert tracediag.load(HEALTHY).meta.hosts == {0: "vm", 1: "vm", 2: "vm", 3: "vm"}  # small-file batch


def test_a_trace_without_host_name_has_none(tmp_path):
    doc = json.loads(gzip.decompress((HEALTHY / "rank0.pt.trace.json.gz").read_bytes()))
    del doc["host_name"]
    (tmp_path / "rank0.json").write_text(json.dumps(doc))
    assert read_file(tmp_path / "rank0.json").meta.host is None


@needs_shared(NSYS)
def test_nsight_reads_the_hostname():
    assert read_file(NSYS, rank=0).meta.host == "nid001608"  # TARGET_INFO_SYSTEM_ENV

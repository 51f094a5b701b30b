"""One clock per host: the offsets estimated per host where the traces name it (real fixtures).

The fixture runs were recorded on one machine (`host_name` "vm" in every trace), so their ranks share one
clock and need no offset; estimated per rank, the offsets of a gloo ring whose ranks leave an all-reduce at
different times are not 0. A copy of half the ranks claimed on another host, its clock shifted, is aligned.
"""

from __future__ import annotations

import gzip
import json
from typing import TYPE_CHECKING

from conftest import FIXTURES

import tracediag
from tracediag.derive.collectives import align_and_match
from tracediag.reduce import derive_facts

if TYPE_CHECKING:
    from pathlib import Path

SLOW_LINK = FIXTURES / "runs/slow_link"
HEALTHY = FIXTURES / "runs/healthy_ddp"
SHIFT_NS = 50_000_000
"""The clock error given to the copy's other host (50 ms: far beyond any collective's end skew here)."""


def test_one_host_needs_no_offset_where_ranks_do_not_leave_together():
    derived = derive_facts(tracediag.load(SLOW_LINK))
    assert set(derived.replay.offsets["offset_ns"]) == {0}
    per_rank, _, _ = align_and_match(derived.replay.matched.select(*_INSTANCE))  # the estimate without hosts
    assert per_rank["offset_ns"].abs().max() > 100_000  # what the per-host estimate leaves out


_INSTANCE = ("rank", "group", "op", "seq", "step", "bytes", "group_size", "ts", "end")


def _shifted_copy(src: Path, dst: Path, ranks: set[int], host: str = "other") -> None:
    """`src`'s traces, those of `ranks` claimed on `host` with a clock `SHIFT_NS` ahead."""
    dst.mkdir()
    for path in sorted(src.glob("rank*.pt.trace.json.gz")):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        if doc["distributedInfo"]["rank"] in ranks:
            doc["host_name"] = host
            doc["baseTimeNanoseconds"] += SHIFT_NS
        (dst / path.name).write_bytes(gzip.compress(json.dumps(doc).encode()))


def test_another_hosts_clock_is_aligned(tmp_path):
    _shifted_copy(HEALTHY, tmp_path / "run", {2, 3})
    run = tracediag.load(tmp_path / "run")
    assert run.meta.hosts == {0: "vm", 1: "vm", 2: "other", 3: "other"}
    offsets = dict(derive_facts(run).replay.offsets.rows())
    assert offsets[0] == offsets[1] == 0
    assert offsets[2] == offsets[3]  # one clock: one offset
    assert abs(offsets[2] - SHIFT_NS) < 1_000_000  # the shift, to the end skew of one host's ranks
    same = tracediag.analyze(tracediag.load(HEALTHY))
    shifted = tracediag.analyze(run)
    assert [(f.cause, f.ranks) for f in shifted.findings] == [(f.cause, f.ranks) for f in same.findings]


STRAGGLER = FIXTURES / "runs/straggler_persistent"


def test_a_host_name_that_keeps_no_one_clock_is_aligned_rank_by_rank(tmp_path):
    """Ranks 2 and 3 still name host "vm" with their clock 50 ms ahead: their all-reduces end before ranks 0
    and 1 start them, so "vm" is not one clock; aligned rank by rank, the straggler is found as on the
    true run, and the warning says why."""
    _shifted_copy(STRAGGLER, tmp_path / "run", {2, 3}, host="vm")
    run = tracediag.load(tmp_path / "run")
    assert set(run.meta.hosts.values()) == {"vm"}
    derived = derive_facts(run)
    offsets = dict(derived.replay.offsets.rows())
    assert abs(offsets[2] - offsets[0] - SHIFT_NS) < 1_000_000
    assert abs(offsets[3] - offsets[0] - SHIFT_NS) < 1_000_000
    assert any("host 'vm' do not keep one clock" in w for w in derived.warnings)
    same = tracediag.analyze(tracediag.load(STRAGGLER))
    shifted = tracediag.analyze(run)
    assert same.findings[0].cause == "compute_straggler"
    assert [(f.cause, f.ranks) for f in shifted.findings] == [(f.cause, f.ranks) for f in same.findings]


def test_one_clock_is_kept_where_no_collective_breaks_the_order():
    derived = derive_facts(tracediag.load(STRAGGLER))
    assert not any("keep one clock" in w for w in derived.warnings)
    assert set(derived.replay.offsets["offset_ns"]) == {0}

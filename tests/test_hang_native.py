"""The C scanner for Flight Recorder pickles (`ingest/_frscan.c`) against the restricted unpickler: the
same tables on every real dump of fixtures/hang, and on mutated ones either the same answer or a
one-line `TracediagError`, never another exception, on both paths."""

from __future__ import annotations

import random

import pytest
from conftest import FIXTURES

from tracediag.errors import TracediagError
from tracediag.ingest import flight, frscan

HANG = FIXTURES / "hang"
PICKLES = sorted(HANG.glob("*/nccl_trace_rank_*"))
native = pytest.mark.skipif(not frscan.AVAILABLE, reason="the C scanner is not built (no C compiler)")


def _tables(d: flight.FlightDumps) -> tuple:
    return (d.entries, d.stacks, d.groups, d.status, d.dumps, d.skipped)


def _read(path, *, use_c: bool, monkeypatch) -> flight.FlightDumps:
    with monkeypatch.context() as m:
        if not use_c:
            m.setattr(frscan, "_frscan", None)
        return flight.read_dump(str(path))


def _same(a: flight.FlightDumps, b: flight.FlightDumps) -> bool:
    return all(x.equals(y) if hasattr(x, "equals") else x == y for x, y in zip(_tables(a), _tables(b), strict=True))


@native
@pytest.mark.parametrize("path", PICKLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_c_scanner_reads_every_fixture_as_the_unpickler_does(path, monkeypatch):
    assert not isinstance(frscan._frscan.scan(path.read_bytes(), 100), str)  # the scanner answered itself
    c = _read(path, use_c=True, monkeypatch=monkeypatch)
    py = _read(path, use_c=False, monkeypatch=monkeypatch)
    assert c.entries.height > 0
    assert _same(c, py)


@native
def test_c_scanner_declines_code_and_the_unpickler_refuses_it(tmp_path):
    # {"entries": [], "pg_config": {}, "x": print} written opcode by opcode: pickling the live `print` would name
    # whatever replaced it in this process (Ray, once imported by another test, swaps builtins.print).
    data = b"\x80\x02}(X\x07\x00\x00\x00entries]X\t\x00\x00\x00pg_config}X\x01\x00\x00\x00xc__builtin__\nprint\nu."
    assert frscan._frscan.scan(data, 100) == "an opcode outside plain data"
    bad = tmp_path / "nccl_trace_rank_0"
    bad.write_bytes(data)
    with pytest.raises(TracediagError, match=r"refused pickle: it names __builtin__\.print \(not run\)"):
        flight.read_dump(str(bad))


@native
def test_c_scanner_keeps_the_newest_entries_like_the_unpickler(tmp_path, monkeypatch):
    path = HANG / "host_stuck" / "nccl_trace_rank_2"
    c = flight.read_dump(str(path), max_entries=5)
    with monkeypatch.context() as m:
        m.setattr(frscan, "_frscan", None)
        py = flight.read_dump(str(path), max_entries=5)
    assert c.entries["collective_seq_id"].to_list() == [20, 21, 22, 23, 24]
    assert c.skipped == py.skipped == {"entries past the newest 5": 11}
    assert _same(c, py)


@pytest.mark.parametrize("use_c", [True, False], ids=["c", "python"])
def test_mutated_dumps_give_results_or_one_line_errors(tmp_path, monkeypatch, use_c):
    """300 seeded mutations (bytes flipped, cut, spliced) of real dumps: a table or a TracediagError."""
    if use_c and not frscan.AVAILABLE:
        pytest.skip("the C scanner is not built (no C compiler)")
    rng = random.Random(25)
    outcomes = {"read": 0, "error": 0}
    for i in range(300):
        data = bytearray(rng.choice(PICKLES).read_bytes())
        kind = i % 3
        if kind == 0:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 1:
            data = data[: rng.randrange(1, len(data))]
        else:
            at = rng.randrange(len(data))
            data[at:at] = data[rng.randrange(len(data)) :][: rng.randint(1, 64)]
        path = tmp_path / f"nccl_trace_rank_{i}"
        path.write_bytes(bytes(data))
        try:
            _read(path, use_c=use_c, monkeypatch=monkeypatch)
            outcomes["read"] += 1
        except TracediagError as e:
            message = str(e).split("\n\nHint")[0]
            outcomes["error"] += 1
            outcomes["multi-line"] = outcomes.get("multi-line", 0) + ("\n" in message)
    assert outcomes["read"] > 0
    assert outcomes["error"] > 0
    assert outcomes.get("multi-line", 0) == 0

"""Damaged copies of real fixtures: every reader either reads them or raises one TracediagError, never
anything else (a fixed-seed fuzz over truncation, byte flips, cut gzip and stray JSON tokens)."""

from __future__ import annotations

import gzip
import random
from typing import TYPE_CHECKING

import pytest
from conftest import FIXTURES

from tracediag.errors import TracediagError
from tracediag.ingest.read import read_file

if TYPE_CHECKING:
    from pathlib import Path

SOURCES = sorted(p for p in FIXTURES.rglob("*") if p.name.endswith((".json", ".json.gz", ".sqlite.gz")))


def _damage(data: bytes, rng: random.Random) -> bytes:
    op = rng.choice(["truncate", "flip", "cut_gzip", "insert"])
    if op == "truncate":
        return data[: rng.randrange(len(data))]
    if op == "flip":
        b = bytearray(data)
        for _ in range(rng.randint(1, 20)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if op == "cut_gzip":
        packed = gzip.compress(data)
        return packed[: rng.randrange(10, len(packed))]
    at = rng.randrange(len(data))
    return data[:at] + rng.choice([b'"', b"{", b"]", b",", b"null", b'"ts": "x",']) + data[at:]


@pytest.mark.parametrize("seed", range(4))
def test_damaged_files_are_read_or_refused_with_one_error(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(25):
        src = rng.choice(SOURCES)
        raw = src.read_bytes()
        data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        path = tmp_path / f"damaged{i}{''.join(src.suffixes)}"
        path.write_bytes(_damage(data, rng))
        try:
            ft = read_file(path, default_rank=0)
        except TracediagError as e:
            message = str(e)
        else:
            assert ft.events.height + sum(ft.meta.skipped.values()) == ft.meta.events_in
            continue
        assert "\n" not in message  # refused: one line, naming the file
        assert str(path) in message


def test_trace_cut_before_its_first_complete_event(tmp_path: Path) -> None:
    """Nothing complete is left: an error or an empty table, never a crash (was: a negative length)."""
    text = gzip.decompress((FIXTURES / "kineto/gen_torch2.13cpu_gloo_2rank_rank1.pt.trace.json.gz").read_bytes())
    path = tmp_path / "cut.json"
    path.write_bytes(text[: text.index(b'"traceEvents"') + 200])
    try:
        ft = read_file(path)
    except TracediagError:
        return
    assert ft.events.height == 0
    assert ft.meta.events_in == sum(ft.meta.skipped.values())

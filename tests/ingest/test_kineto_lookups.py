"""The Kineto reader's shortcuts give what the direct computation gives, on the real fixtures:
rules run once per distinct (category, name) pair, args placed by `order`, `coll_op` in one pass."""

from __future__ import annotations

import gzip
import re

import polars as pl
import pytest
from conftest import KINETO
from polars.testing import assert_frame_equal

from tracediag.ingest import chrome, kineto
from tracediag.ingest.read import read_file
from tracediag.ingest.sniff import iter_blocks
from tracediag.vocab import OP_RULES, coll_op

TRACES = sorted(p for p in KINETO.iterdir() if p.name.endswith((".json", ".json.gz")))


def _decoded(path) -> chrome.Decoded:
    return chrome.decode(iter_blocks(str(path)), str(path))


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_pair_rules_equal_the_rules_on_every_row(path) -> None:
    slices = _decoded(path).slices
    assert slices.schema["cat"] == slices.schema["name"] == pl.Categorical  # as `Decoded.slices` holds them
    got = kineto._per_distinct(slices["cat"], slices["name"], **kineto._PAIR_RULES)
    assert_frame_equal(got, slices.select(pl.col("cat", "name").cast(pl.String)).select(**kineto._PAIR_RULES))
    assert got["kind"].n_unique() > 1


def test_pair_rules_when_the_codes_are_spread_far() -> None:
    """In a long-lived process the category codes run far past a file's rows: they are renumbered
    (and a null category or name is a combination of its own)."""
    many = pl.Series([f"other-file-name-{i}" for i in range(50_000)]).cast(pl.Categorical)
    rows = pl.DataFrame(
        {
            "cat": ["kernel", None, "user_annotation", "kernel", "cpu_op", "gpu_user_annotation"] * 5,
            "name": ["ncclDevKernel_AllReduce", "x", "ProfilerStep#7", None, "c10d::send", "ProfilerStep#7"] * 5,
        }
    )
    for frame in (rows, pl.concat([rows] * 500)):  # codes far past the rows; then within reach, their pairs not
        keys = (frame["cat"].cast(pl.Categorical), frame["name"].cast(pl.Categorical))
        assert_frame_equal(kineto._per_distinct(*keys, **kineto._PAIR_RULES), frame.select(**kineto._PAIR_RULES))
    assert many.len() == 50_000


def _frames(slices: pl.DataFrame) -> list[pl.DataFrame]:
    """The rows as decoded (each `order` its row number), shuffled, every third, the first, the first and
    the last (orders too far apart for a table: the join)."""
    shuffled = slices.sample(fraction=1.0, shuffle=True, seed=7)
    return [slices, shuffled, slices[::3], slices.head(1), slices[[0, slices.height - 1]]]


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_args_placed_by_order_equal_the_join(path) -> None:
    dec = _decoded(path)
    fields = ("a_device", "a_stream", "a_coll_name", "a_input_dims")
    for frame in _frames(dec.slices):
        assert_frame_equal(kineto._with_args(dec, frame, *fields), dec.with_args(frame, *fields))


def test_a_kernel_whose_args_name_a_collective_is_communication(tmp_path) -> None:
    """A kernel with a `Collective name` arg is communication (args are read on the rows a collective's name
    may carry them: `vocab.COLLECTIVE_ROW`): only those rows are looked up, wherever they lie in the frame. A
    real trace whose compute kernels are, one in seven, named as a c10d op and given the arg."""
    text = gzip.decompress((KINETO / "hta_a100_nccl_rank0.json.gz").read_bytes())
    seen = []

    def name_it(m: re.Match) -> bytes:
        seen.append(m)
        if len(seen) % 7:
            return m.group(0)
        return b'"cat": "kernel", "name": "c10d::_allgather_base", ' + m.group(1) + b'"Collective name": "allgather", '

    text = re.sub(rb'"cat": "kernel", "name": "void [^"]*", ([^{}]*"args": \{)', name_it, text)
    path = tmp_path / "named.json"
    path.write_bytes(text)
    dec = chrome.decode(text, str(path))
    for frame in _frames(dec.slices):
        got = kineto._classify(kineto._with_args(dec, frame, "a_device", "a_stream"), kineto._rows_named(dec, frame))
        pair = frame.select(pl.col("cat", "name").cast(pl.String)).select(**kineto._PAIR_RULES)["kind"]
        named = dec.with_args(frame, "a_coll_name")["a_coll_name"].is_not_null()
        want = pl.select(pl.when((pair == "kernel") & named).then(pl.lit("comm")).otherwise(pair)).to_series()
        assert got["kind"].cast(pl.String).to_list() == want.cast(pl.String).to_list()
    events = read_file(path).events
    gathers = events.filter((pl.col("kind") == "comm") & (pl.col("coll_op") == "all_gather"))
    renamed = gathers.filter(pl.col("name") == "c10d::_allgather_base")
    assert len(seen) > 70
    assert renamed.height == len(seen) // 7
    # and the trace's own two NCCL SendRecv kernels launched inside `nccl:_all_gather_base` (their name says
    # no operation; their launch does)
    own = gathers.filter(pl.col("name") != "c10d::_allgather_base")["name"].cast(pl.String)
    assert own.len() == 2
    assert own.str.starts_with("ncclKernel_SendRecv_").all()


def _first_rule(text: str | None, default: str | None) -> str | None:
    """`coll_op` as its rule says: the first rule whose text the normalised name contains."""
    if text is None:
        return None
    norm = re.sub(r"[^a-z]", "", text.lower())
    return next((op for needle, op in OP_RULES if needle in norm), default)


def test_coll_op_is_the_first_rule_that_matches() -> None:
    names = set()
    for path in TRACES:
        names.update(_decoded(path).slices["name"].unique().drop_nulls().to_list())
    nested = ["allreduce_sendrecv", "ReduceScatter", "gatherallreduce", "recvsend", "Send", "bcast_reduce", "nccl:_x"]
    texts = [*sorted(names), *nested, None]
    frame = pl.DataFrame({"t": pl.Series(texts, dtype=pl.String)})
    for default in ("other", None):
        got = frame.select(coll_op(pl.col("t"), default=default)).to_series().to_list()
        assert got == [_first_rule(t, default) for t in texts]
    assert _first_rule("allreduce_sendrecv", None) == "other"  # sendrecv is the first rule


def test_coll_op_of_one_text_equals_the_query_rule() -> None:
    """The reader classifies each distinct op text in Python (`kineto._coll_op_of`): the same answer as
    `vocab.coll_op` on every name of the fixtures and on texts whose case mapping leaves ASCII."""
    names = set()
    for path in TRACES:
        names.update(_decoded(path).slices["name"].unique().drop_nulls().to_list())
    odd = ["ALL_REDUCE", "\u212aernel_send", "\u0130recv", "all-r\u00e9duce", "\uff21ll\uff32educe", "", "\u1e9ecatter"]
    texts = [*sorted(names), *odd]
    want = pl.DataFrame({"t": texts}).select(coll_op(pl.col("t"))).to_series().to_list()
    assert [kineto._coll_op_of(t) for t in texts] == want
    assert {"all_reduce", "other"} <= set(want)

"""The C scanner (`tracediag/ingest/native.py`) against the msgspec path it speeds up.

Wherever the scanner answers, the file's table, metadata, counts and warnings must be exactly those of
the msgspec path; wherever it declines, the msgspec path reads the document. Checked on every fixture
(whole and cut into small pieces) and on real traces mutated where the scanner's rules are decided
(time text, id and args types, escapes, phases, duplicate keys, UTF-8, nesting, truncation).
"""

from __future__ import annotations

import gzip
import json
import random
import re
from typing import TYPE_CHECKING

import msgspec
import orjson
import polars as pl
import pytest
from conftest import FIXTURES
from fuzz import mutate
from polars.testing import assert_frame_equal

from tracediag.errors import TracediagError
from tracediag.ingest import chrome, native
from tracediag.ingest.read import read_file
from tracediag.ingest.sniff import map_plain

if TYPE_CHECKING:
    from pathlib import Path

SOURCES = sorted(p for p in FIXTURES.rglob("*") if p.name.endswith((".json", ".json.gz")) and "manifest" not in p.name)
KINETO = [
    FIXTURES / "kineto/gen_torch2.13cpu_gloo_2rank_rank0.pt.trace.json.gz",
    FIXTURES / "kineto/hta_a100_nccl_rank0.json.gz",
    FIXTURES / "kineto/hta_ns_resolution_head.json.gz",
    FIXTURES / "kineto/hta_rocm_mi250.json.gz",  # "stream": "0x0" strings
]


def _text(path: Path) -> bytes:
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def _read(path: Path) -> tuple:
    try:
        ft = read_file(path, default_rank=0)
    except TracediagError as e:
        return ("error", str(e))
    return ("ok", ft)


def _both(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[tuple, tuple]:
    scanned = _read(path)
    with monkeypatch.context() as m:
        m.setattr(native, "_chromescan", None)
        decoded = _read(path)
    return scanned, decoded


def _scan(doc: bytes, is_array: bool) -> tuple[native.Fed | None, native.Scanner]:
    scanner = native.Scanner()
    return scanner.feed(doc, is_array), scanner


def _assert_same(scanned: tuple, decoded: tuple, what: str) -> None:
    assert scanned[0] == decoded[0], (what, scanned, decoded)
    if scanned[0] == "error":
        assert scanned[1] == decoded[1], what
        return
    assert_frame_equal(scanned[1].events, decoded[1].events)
    assert scanned[1].meta == decoded[1].meta, what


def test_the_scanner_is_built() -> None:
    """The install compiles it (setup.py); without it every file takes the slower msgspec path."""
    assert native.AVAILABLE, "tracediag/ingest/_chromescan.c was not built: `pip install -e .` needs a C compiler"


def test_a_scanned_file_builds_no_msgspec_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The msgspec decoders are built on first use, as building one resolves the type hints of every struct it
    decodes into (start-up, issue 31): a file the scanner reads builds none, the msgspec path the ones it uses."""
    path = FIXTURES / "kineto/hta_a100_nccl_rank0.json.gz"
    chrome._decoder.cache_clear()
    assert _read(path)[0] == "ok"
    assert chrome._decoder.cache_info().currsize == 0
    _both(path, monkeypatch)
    assert chrome._decoder.cache_info().currsize == 1  # the tagged union's decoder of the Object form


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_same_table_as_msgspec_on_every_fixture(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _assert_same(*_both(path, monkeypatch), path.name)


@pytest.mark.parametrize("path", [*KINETO, *sorted((FIXTURES / "jax").glob("*.json*"))], ids=lambda p: p.name)
def test_same_table_when_scanned_in_small_batches(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of the scanner's rows without metadata (every one but the last of a Kineto file) are taken
    as the scanner gives them, and a tier of rows without a category is skipped where every row has one:
    the same table as the msgspec path, which has neither shortcut."""
    monkeypatch.setattr(chrome, "CHUNK_BYTES", 20_000)
    monkeypatch.setattr(chrome, "SCANNED_ROWS", 300)
    _assert_same(*_both(path, monkeypatch), path.name)


@pytest.mark.parametrize("path", KINETO, ids=lambda p: p.name)
def test_the_scanner_reads_real_kineto_traces(path: Path) -> None:
    """The equality above is not the fallback agreeing with itself: these files are scanned."""
    text = _text(path)
    fed, scanner = _scan(text, False)
    assert fed is not None
    assert fed.n_events == text.count(b'"ph"')  # every event has one ph key in these files
    rows = scanner.take()
    assert rows.height == fed.n_events - sum(fed.skipped.values())
    assert rows.filter(pl.col("order") >= 0).height == fed.kept  # order -1: an M row


@pytest.mark.parametrize("path", KINETO[:2], ids=lambda p: p.name)
def test_same_table_when_read_in_pieces(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = _read(path)
    monkeypatch.setattr(chrome, "CHUNK_BYTES", 3000)
    scanned, decoded = _both(path, monkeypatch)
    _assert_same(scanned, decoded, path.name)
    _assert_same(scanned, whole, path.name)


@pytest.mark.parametrize("chunk", [3000, 40_000])
def test_a_mapped_file_reads_as_its_streamed_bytes(chunk: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain local file is read through a copy-on-write mapping (pieces bracketed in place, pages
    dropped behind the cut); the same bytes streamed as blocks give the same table. The file is left
    as it was."""
    text = _text(KINETO[1])
    path = tmp_path / "plain.json"
    path.write_bytes(text)
    assert map_plain(path) is not None
    assert map_plain(KINETO[1]) is None
    monkeypatch.setattr(chrome, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(chrome, "SCANNED_ROWS", 200)
    mapped = read_file(path, default_rank=0)
    monkeypatch.setattr("tracediag.ingest.read.map_plain", lambda p: None)
    streamed = read_file(path, default_rank=0)
    assert_frame_equal(mapped.events, streamed.events)
    assert mapped.meta == streamed.meta
    assert mapped.events.height > 1000
    assert path.read_bytes() == text


def test_three_decimal_times_are_exact_ns(tmp_path: Path) -> None:
    """Epoch µs with ns digits (HTA's ns-resolution trace) keep every ns on both paths, including a
    time whose float64 is a whole number (…738.001 is …738.0 as a float)."""
    text = _text(FIXTURES / "kineto/hta_ns_resolution_head.json.gz")
    first = re.search(rb'"ts": (\d+)\.(\d{3})', text)
    assert first is not None
    assert int(first.group(1)) >= 2**43
    text = text[: first.start()] + b'"ts": ' + first.group(1) + b".001" + text[first.end() :]
    path = tmp_path / "t.json"
    path.write_bytes(text)
    ft = read_file(path)
    assert int(first.group(1)) * 1000 + 1 in ft.events["ts"].to_list()


_MUTATIONS: list[tuple[bytes, list[bytes]]] = [
    # (pattern of a value in the file, replacements tried there)
    (
        rb'"ts": [0-9.]+',
        [
            b'"ts": 12.5',
            b'"ts": 7.1234',
            b'"ts": 1e3',
            b'"ts": "5"',
            b'"ts": null',
            b'"ts": -3.25',
            b'"ts": 4611686018427388',
            b'"ts": 9007199254740993',
            b'"ts": true',
            b'"ts": 0.001',
            b'"ts": 20.841000000000001',
            b'"ts": -0.0005',
            b'"ts": 8796093022207.9999',
            b'"ts": 8796093022208.5',
            b'"ts": 1661203462598738.25',
            b'"ts": 2.5e-4',
            b'"ts": 1E400',
        ],
    ),
    (rb'"dur": [0-9.]+', [b'"dur": -5', b'"dur": 2.5', b'"dur": 1E2', b'"dur": [1]', b'"dur": 01']),
    (
        rb'"pid": [0-9]+',
        [
            b'"pid": "Spans"',
            b'"pid": 1.5',
            b'"pid": 99999999999999999999',
            b'"pid": null',
            b'"pid": -9223372036854775808',
            b'"pid": {"a": 1}',
        ],
    ),
    (rb'"tid": [0-9]+', [b'"tid": "thread"', b'"tid": 2.0', b'"tid": -1']),
    (
        rb'"name": "[^"]*"',
        [
            b'"name": "a\\nb\\u00e9\\t\\"q\\""',
            b'"name": 7',
            b'"name": ["x"]',
            b'"name": null',
            b'"name": "\\ud83d\\ude00"',
            b'"name": "\xff\xfe"',
            b'"name": "\x01"',
            b'"name": "\\x"',
            '"name": "caf\u00e9 \u4e2d"'.encode(),
            b'"name": "\\u0000"',
            b'"name": "a", "name": "b"',
        ],
    ),
    (
        rb'"ph": "X"',
        [
            b'"ph": "Z"',
            b'"ph": 1',
            b'"ph": "\\u0058"',
            b'"ph": "i"',
            b'"ph": "M"',
            b'"ph": "B"',
            b'"ph": "E"',
            b'"ph": "XX"',
            b'"ph": "X", "ph": "X"',
            b'"xph": "X"',
        ],
    ),
    (
        rb'"External id": [0-9]+',
        [
            b'"External id": "7"',
            b'"External id": 7.5',
            b'"External id": null',
            b'"External id": true',
            b'"External id": 18446744073709551616',
        ],
    ),
    (
        rb'"args": \{',
        [
            b'"args": {"device": "0", ',
            b'"args": {"Process Group Name": 7, ',
            b'"args": {"step_num": 12, ',
            b'"args": {"step_num": -0, ',
            b'"args": {"Seq": 1.0, ',
            b'"args": {"x": ' + b"[" * 70 + b"]" * 70 + b", ",
            b'"args": {"Input Dims": [[1, 2]], ',
            b'"args": {"a\\u0062": 1, ',
            b'"args": {"stream": 7, "stream": 8, ',
            # strings in integer args: polars' cast reads "5", "+5", "007" and nulls "0x0" (ROCm's stream)
            b'"args": {"stream": "0x0", ',
            b'"args": {"device": "5", ',
            b'"args": {"device": "+5", ',
            b'"args": {"device": "007", ',
            b'"args": {"device": "1e2", ',
            b'"args": {"device": " 7", ',
            b'"args": {"device": "", ',
            b'"args": {"device": "\\u0035", ',
            b'"args": {"Seq": "-0", ',
            b'"args": {"bytes": "99999999999999999999", ',
            b'"args": {"device": true, ',
        ],
    ),
    (rb'"args": \{[^{}]*\}', [b'"args": null', b'"args": []', b'"args": {}']),
    (rb"\}, *\n *\{", [b"},\n{", b"}, ,{", b"}{", b"},\n 5, {", b"},\n[], {"]),
]


def _mutate(text: bytes, rng: random.Random) -> bytes:
    pattern, replacements = rng.choice(_MUTATIONS)
    found = list(re.finditer(pattern, text))
    if not found:
        return text
    for _ in range(rng.choice([1, 1, 3])):
        m = rng.choice(found)
        text = text[: m.start()] + rng.choice(replacements) + text[m.end() :]
        found = [f for f in re.finditer(pattern, text)] or found
        if not found:
            break
    if rng.random() < 0.15:
        text = text[: rng.randrange(len(text) // 2, len(text))]
    return text


@pytest.mark.parametrize("seed", range(3))
def test_mutated_real_traces_read_the_same_on_both_paths(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    texts = {p: _text(p) for p in KINETO}
    scanned_any = declined_any = 0
    for i in range(40):
        src = rng.choice(KINETO)
        text = _mutate(texts[src], rng)
        path = tmp_path / f"m{i}.json"
        path.write_bytes(text)
        is_array = text.lstrip()[:1] == b"["
        if _scan(text, is_array)[0] is None:
            declined_any += 1
        else:
            scanned_any += 1
        _assert_same(*_both(path, monkeypatch), f"seed {seed} case {i} from {src.name}")
    assert scanned_any
    assert declined_any


@pytest.mark.parametrize("mutator", mutate.PIPELINE_MUTATORS, ids=lambda m: m.__name__)
def test_what_pipelines_make_of_whole_traces_reads_the_same_on_both_paths(
    mutator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fuzzer's whole-trace mutations (events twice, CRLF, another time unit, quoted numbers, negative
    ids, another job's world size) on each real Kineto trace: the same table, or the same one-line error."""
    for i, src in enumerate(KINETO):
        path = tmp_path / f"p{i}.json"
        path.write_bytes(mutator(_text(src), random.Random(i)))
        _assert_same(*_both(path, monkeypatch), f"{mutator.__name__} on {src.name}")


def test_declines_what_it_does_not_read_exactly() -> None:
    """One rule each: the scanner answers None and leaves the document to msgspec."""
    ok = b'[{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]'
    assert _scan(ok, True)[0] is not None
    for bad in (
        ok.replace(b'"ts": 1', b'"ts": 9007199254740993'),  # past 2**53 us: float64 rounds it
        # ns digits past 2**43 us (the exact re-read) with a time of more decimals in the same document
        ok.replace(b'"ts": 1,', b'"ts": 1661203462598738.25,').replace(b'"dur": 2', b'"dur": 0.0001'),
        ok.replace(b'"ph": "X"', b'"ph": 1'),
        ok.replace(b'"pid": 1', b'"pid": 1.5'),
        ok.replace(b'"name": "a"', b'"name": "\\ud800"'),
        ok.replace(b'"name": "a"', b'"name": "a", "name": "b"'),
        ok.replace(b"}]", b"}"),  # truncated
        ok + b"x",
    ):
        fed, scanner = _scan(bad, True)
        assert fed is None, bad
        assert scanner.take().height == 0  # a declined document leaves no rows


def test_a_missing_or_unknown_phase_makes_every_event_a_row() -> None:
    """As msgspec's plain decode (JAX ends its events with `{}`): the flow, the unknown phase and the
    empty event become rows, to be counted by phase with the rest; only `M` stays metadata."""
    doc = (
        b'[{"ph": "f", "id": 1, "ts": 1}, {"ph": "X", "name": "a", "ts": 1, "dur": 1}, {"ph": "Q"},'
        b' {"ph": "M", "name": "process_name"}, {}]'
    )
    fed, scanner = _scan(doc, True)
    assert fed is not None
    assert (fed.n_events, fed.kept, fed.skipped) == (5, 4, {})
    rows = scanner.take()
    assert rows["ph"].to_list() == ["f", "X", "Q", "M", None]
    assert rows["order"].to_list() == [0, 1, 2, -1, 3]


def test_times_with_more_decimals_as_float64_reads_them() -> None:
    """JAX writes relative µs like 20.841000000000001: read as the msgspec path's float64 arithmetic."""
    doc = b'[{"ph": "X", "name": "a", "ts": 20.841000000000001, "dur": 1e3}, {"ph": "X", "name": "b", "ts": -0.0005}]'
    fed, scanner = _scan(doc, True)
    assert fed is not None
    rows = scanner.take()
    assert rows["ts"].to_list() == [20841, 0]
    assert rows["dur"].to_list() == [1_000_000, None]


def test_reads_the_columns_it_promises() -> None:
    doc = (
        b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "n\\u00e9\\n", "ts": 1.5, "dur": 0.25, "pid": "Spans",'
        b' "tid": "t", "args": {"device": 3, "stream": 7, "Input Dims": [[1, 2], []], "step_num": 12,'
        b' "External id": -4}}, {"ph": "M", "name": "process_name", "pid": 5, "args": {"name": "gpu"}},'
        b' {"ph": "f", "id": 1}], "distributedInfo": {"rank": 3}}'
    )
    fed, scanner = _scan(doc, False)
    assert fed is not None
    assert (fed.n_events, fed.kept, fed.skipped) == (3, 1, {"flow": 1})
    assert fed.top == {"distributedInfo": {"rank": 3}}
    rows = scanner.take()
    assert rows.columns == list(native.COLUMNS)
    types = {pl.String: "str", pl.Int64: "int", pl.Boolean: "bool", pl.Binary: "raw"}
    assert {c: types[t] for c, t in rows.schema.items() if c in ("ph", "pid", "pid_str", "has_args", "input_dims")} == {
        "ph": "str",
        "pid": "int",
        "pid_str": "str",
        "has_args": "bool",
        "input_dims": "raw",
    }
    row = rows.row(0, named=True)
    assert (row["ph"], row["name"], row["ts"], row["dur"]) == ("X", "n\u00e9\n", 1500, 250)
    assert (row["pid"], row["pid_str"], row["tid"]) == (None, "Spans", None)
    assert (row["device"], row["stream"], row["step_num"], row["external_id"]) == (3, 7, "12", -4)
    assert rows["input_dims"].to_list() == [b"[[1, 2], []]", None]
    assert rows.row(1, named=True)["label"] == "gpu"


def test_a_top_level_value_msgspec_refuses_declines_the_document() -> None:
    """Valid JSON that msgspec will not decode (a number out of float range) goes to the msgspec path,
    which reports it; the scanner keeps none of that document's rows."""
    scanner = native.Scanner()
    assert scanner.feed(b'[{"ph": "X", "name": "a", "ts": 1, "dur": 1}]', True) is not None
    assert scanner.feed(b'{"traceEvents": [{"ph": "X", "name": "b"}], "metadata": 1e400}', False) is None
    assert scanner.pieces == 1
    assert scanner.take()["name"].to_list() == ["a"]


def test_a_declined_piece_between_scanned_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One event the scanner leaves to msgspec, mid-file: the pieces before and after are scanned and
    the table is still the msgspec path's, in file order."""
    text = _text(FIXTURES / "kineto/hta_a100_nccl_rank0.json.gz")
    pids = list(re.finditer(rb'"pid": [0-9]+', text))
    middle = pids[len(pids) // 2]
    path = tmp_path / "mixed.json"
    path.write_bytes(text[: middle.start()] + b'"pid": 1.5' + text[middle.end() :])
    monkeypatch.setattr(chrome, "CHUNK_BYTES", 20_000)
    outcomes = []
    feed = native.Scanner.feed

    def spy(self: native.Scanner, *args: object) -> native.Fed | None:
        fed = feed(self, *args)
        outcomes.append(fed is not None)
        return fed

    monkeypatch.setattr(native.Scanner, "feed", spy)
    scanned = _read(path)
    assert outcomes.count(False) == 1
    assert outcomes.count(True) > 10
    with monkeypatch.context() as m:
        m.setattr(native, "_chromescan", None)
        decoded = _read(path)
    _assert_same(scanned, decoded, "mixed")


_VALUES = [
    None,
    True,
    0,
    -1,
    2**63 - 1,
    -(2**63) + 1,
    12.125,
    0.5,
    "",
    "x",
    "\u00e9\u4e2d\U0001f600",
    'a"b\\c\n\t\u0000',
    [],
    {},
    [[1, 2]],
    {"a": [1, {"b": None}]},
    "12",
    "-0",
]


@pytest.mark.parametrize("seed", range(2))
def test_events_with_values_of_every_json_type_read_the_same(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Valid JSON, real events, a few fields (and args) set to values of other types, escaped or not:
    where the scanner reads a document it must read it as msgspec does, and it must read some."""
    rng = random.Random(seed)
    events = orjson.loads(_text(FIXTURES / "kineto/hta_a100_nccl_rank0.json.gz"))["traceEvents"]
    keys = ["ph", "name", "cat", "ts", "dur", "pid", "tid", "args"]
    arg_keys = ["External id", "device", "stream", "Input Dims", "name", "step_num", "Seq", "bytes", "dtype"]
    scanned = 0
    for i in range(25):
        sample = [dict(e) for e in rng.sample(events, 150)]
        for e in rng.sample(sample, rng.randint(0, 2)):
            e[rng.choice(keys)] = rng.choice([*_VALUES, rng.choice("XBEMifsC")])
            if isinstance(e.get("args"), dict):
                e["args"] = {**e["args"], rng.choice(arg_keys): rng.choice(_VALUES)}
        doc = {"traceEvents": sample, "distributedInfo": {"rank": 0}}
        text = json.dumps(doc, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 2])).encode()
        scanned += _scan(text, False)[0] is not None
        path = tmp_path / f"v{i}.json"
        path.write_bytes(text)
        _assert_same(*_both(path, monkeypatch), f"seed {seed} doc {i}")
    assert scanned >= 5


@pytest.mark.parametrize("suffix", ["", ".125", "e2"])
def test_integers_of_every_length_read_the_same(suffix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Times, ids and args numbers of 1 to 20 integer digits (the scanner reads up to 8 at a time),
    signed or not, with a fraction or an exponent, followed by every kind of byte, the last ones near
    the document's end: read as msgspec reads them; the scanner reads every document of integers
    of up to 15 digits."""
    rng = random.Random(len(suffix))
    for digits in range(1, 21):
        events = []
        for _ in range(40):
            n = str(rng.randrange(10 ** (digits - 1), 10**digits)) if digits > 1 else str(rng.randrange(10))
            text = rng.choice(["-", ""]) + n + suffix
            key = rng.choice(["ts", "dur", "pid", "tid", "External id", "Seq", "bytes"])
            fields = {"ph": '"X"', "name": '"k"', "ts": "1", "dur": "2", "pid": "3", "tid": "4"}
            args = {"External id": "5", "Seq": "6", "bytes": "7"}
            (args if key in args else fields)[key] = text
            fields["args"] = "{" + ",".join(f'"{k}":{v}' for k, v in args.items()) + "}"
            body = [f'"{k}":{v}' for k, v in fields.items()]
            rng.shuffle(body)
            events.append("{" + rng.choice([",", ", ", ",\n  "]).join(body) + "}")
        doc = ('{"traceEvents":[' + ",".join(events) + "]}").encode()
        if not suffix and digits <= 15:  # longer times are left to msgspec (2**62 ns)
            assert _scan(doc, False)[0] is not None, digits
        path = tmp_path / f"n{digits}.json"
        path.write_bytes(doc)
        _assert_same(*_both(path, monkeypatch), f"{suffix} digits {digits}")


@pytest.mark.parametrize("sep", [", ", ",", ",\n    "])
def test_keys_named_by_the_bytes_met_before_read_the_same(
    sep: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scanner names a member by comparing its bytes with those met at the same position of the
    previous event: runs of events with the same keys, then at that position a key the old one is a
    prefix of, an escaped spelling of it, a duplicate of an earlier key, or other whitespace. Each
    document reads as msgspec reads it, and the plain ones are read by the scanner."""
    plain = {"ph": '"X"', "cat": '"kernel"', "name": '"k"', "ts": "10", "dur": "2", "pid": "3", "tid": "4"}
    args = '{"External id": 5, "Input Dims": [[1, 2], []], "stream": 7}'
    twists = {
        "prefix key": ('"ts"', '"tsx"'),
        "escaped key": ('"ts"', '"t\\u0073"'),
        "duplicate key": ('"dur"', '"ph"'),
        "prefix arg key": ('"stream"', '"streams"'),
        "duplicate arg key": ('"stream"', '"External id"'),
        "spaced colon": ('"ts": ', '"ts" : '),
        "no space": ('"ts": ', '"ts":'),
    }

    def event(i: int) -> str:
        fields = {**plain, "ts": str(10 + i), "args": args}
        return "{" + sep.join(f'"{k}": {v}' for k, v in fields.items()) + "}"

    for what, (old, new) in twists.items():
        events = [event(i) for i in range(6)]
        events[3] = events[3].replace(old, new, 1)
        doc = ('{"traceEvents": [' + ",\n".join(events) + '], "distributedInfo": {"rank": 0}}').encode()
        if what in ("prefix key", "prefix arg key", "spaced colon", "no space"):
            assert _scan(doc, False)[0] is not None, what
        else:
            assert _scan(doc, False)[0] is None, what  # declined: the msgspec path decides
        path = tmp_path / "memo.json"
        path.write_bytes(doc)
        scanned, decoded = _both(path, monkeypatch)
        _assert_same(scanned, decoded, what)
        assert scanned[0] == "ok", what
        assert scanned[1].events.height + sum(scanned[1].meta.skipped.values()) == 6, what  # each event counted


@pytest.mark.parametrize("scanned", [True, False], ids=["scanner", "msgspec"])
def test_names_are_categorical_and_the_name_tier_holds_the_rows_a_per_row_regex_picks(
    scanned: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Decoded.slices` holds `name` and `cat` Categorical on both paths (the scanner hands them over
    dictionary-encoded), and the args tier of the collectives and GEMM ops, whose name pattern is
    matched once per distinct name of each batch, holds exactly the rows a regex over every row's
    name picks (the file read in small pieces and batches, so each batch has names of its own)."""
    path = FIXTURES / "kineto/hta_a100_nccl_rank0.json.gz"
    text = _text(path)
    fed, scanner = _scan(text, False)
    every = scanner.take()
    assert fed is not None
    assert every.schema["name"] == every.schema["cat"] == pl.Categorical
    monkeypatch.setattr(chrome, "CHUNK_BYTES", 40_000)
    monkeypatch.setattr(chrome, "SCANNED_ROWS", 200)
    if not scanned:
        monkeypatch.setattr(native, "_chromescan", None)
    dec = chrome.decode(text, str(path))
    assert dec.slices.schema["name"] == dec.slices.schema["cat"] == pl.Categorical
    assert dec.metadata.schema["name"] == pl.String
    pattern, fields = chrome._ARG_TIERS[1]
    assert isinstance(pattern, str)
    assert "coll_name" in fields
    picked = every.filter(
        (pl.col("order") >= 0) & pl.col("has_args") & pl.col("name").cast(pl.String).str.contains(pattern)
    )
    tier = dec.rare[1]
    assert tier["order"].to_list() == picked["order"].to_list()
    names = set(picked["name"].cast(pl.String).to_list())
    assert {"aten::mm", "record_param_comms", "nccl:all_reduce"} <= names  # GEMMs and collectives
    assert tier["a_input_dims"].drop_nulls().len() > 100  # the GEMM shapes calibrate reads


# Arrays as Kineto writes them in skipped or raw args, and near misses. The scanner's fast path for
# arrays of integers, plain strings and such arrays must accept exactly the valid ones.
_ARRAYS = [
    b"[]",
    b"[ ]",
    b"[[1024, 512], [], [512]]",
    b'["float", "", "Scalar"]',
    b"[[-3, 0], [10]]",
    b'[ [ 1 ] , "a b" ]',
    b"[\n  [1,2],\n\t[]\r\n]",
    b'["]", "[", "[[]"]',
    b"[0, -0, 9007199254740993]",
    b"[1.5, 2e3, -0.25]",
    b'["\\u00e9", "\\"", "\xc3\xa9"]',
    b'[{"a": [1]}, true, false, null]',
    b'["\x7f"]',
    b"[1,,2]",
    b"[01]",
    b"[1 2]",
    b'["a" "b"]',
    b"[[1],]",
    b"[,]",
    b"[,1]",
    b"[1,]",
    b"[-]",
    b"[-a]",
    b"[--1]",
    b"[+1]",
    b"[1a]",
    b"[.5]",
    b"[1.]",
    b"[[1]",
    b"[[1]]]",
    b"[1}",
    b"[[]][]",
    b"['a']",
    b'["a\tb"]',
    b'["a\nb"]',
    b'["a\\x"]',
    b'["\xff"]',
    b'["\xc3"]',
    b"[\x0b]",
    b"[1\x00]",
    b"[tru]",
    b"[nul]",
]


@pytest.mark.parametrize("key", ["Input Dims", "Call stack"])  # read as raw text; skipped
@pytest.mark.parametrize("value", _ARRAYS)
def test_arrays_in_args_are_read_exactly_when_valid_json(key: str, value: bytes) -> None:
    """The scanner reads a document iff msgspec decodes it, and keeps an array's text as msgspec.Raw
    does; truncated inside the array (a piece cut there) it declines."""
    doc = b'[{"ph": "X", "name": "a", "ts": 1, "dur": 2, "args": {"%s": %s, "Seq": 1}}]' % (key.encode(), value)
    try:
        msgspec.json.decode(doc)
        valid = True
    except msgspec.DecodeError:
        valid = False
    fed, scanner = _scan(doc, True)
    assert (fed is not None) == valid, value
    if valid:
        rows = scanner.take()
        assert rows["seq"].to_list() == [1]
        if key == "Input Dims":
            assert rows["input_dims"].to_list() == [value]
    start = doc.index(value)
    for cut in range(start + 1, start + len(value)):
        assert _scan(doc[:cut], True)[0] is None, (value, cut)


_STRINGS = [
    b'""',
    b'"a"',
    b'"Scalar"',
    b'"fifteen chars.."',
    b'"sixteen chars..."',
    b'"a \\" b"',
    b'"\\n"',
    b'"\\u00e9"',
    b'"\xc3\xa9"',
    b'"\x7f"',
    b'"a]"',
    b'"\\x"',
    b'"a\x01"',
    b'"a\tb"',
    b'"\xff"',
    b'"\xc3"',
    b'"\\ud800"',
]


@pytest.mark.parametrize("key", ["name", "Call stack"])  # read as a string (the label); skipped
@pytest.mark.parametrize("value", _STRINGS)
def test_strings_in_args_are_read_exactly_when_valid_json(key: str, value: bytes) -> None:
    """Short strings (the inline check) and longer ones (the full scan): read iff msgspec decodes the
    document, to the same text; truncated inside the string, declined."""
    doc = b'[{"ph": "X", "name": "a", "ts": 1, "dur": 2, "args": {"%s": %s, "Seq": 1}}]' % (key.encode(), value)
    try:
        decoded = msgspec.json.decode(doc)[0]["args"][key]
    except msgspec.DecodeError:
        decoded = None
    fed, scanner = _scan(doc, True)
    assert (fed is not None) == (decoded is not None), value
    if fed is not None:
        rows = scanner.take()
        assert rows["seq"].to_list() == [1]
        if key == "name":
            assert rows["label"].to_list() == [decoded]
    start = doc.index(value)
    for cut in range(start + 1, start + len(value)):
        assert _scan(doc[:cut], True)[0] is None, (value, cut)


def test_nested_arrays_decline_past_the_depth_limit_on_both_paths() -> None:
    """An array nested n deep inside the args is read up to one depth, the same whether the fast path
    (integers) or the general path (a fraction) skips it."""
    read = {}
    for inner in (b"1", b"1.5"):
        read[inner] = [
            _scan(b'[{"ph": "X", "ts": 1, "args": {"x": %s%s%s}}]' % (b"[" * n, inner, b"]" * n), True)[0] is not None
            for n in range(55, 70)
        ]
    assert read[b"1"] == read[b"1.5"]
    assert read[b"1"] == sorted(read[b"1"], reverse=True)
    assert 0 < sum(read[b"1"]) < 15


@pytest.mark.parametrize("value", [b"1.5", b"15e1", b"15E1", b"1234567.5", b"7e-1", b"12345678", b"0", b"-5"])
def test_numbers_in_an_event_that_is_only_counted_are_read(value: bytes) -> None:
    """An instant event's pid and tid are checked as JSON, their type unused: the scanner reads the
    document whatever number they hold, a fraction or an exponent after a short integer included."""
    doc = b'[{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 2}, {"ph": "i", "pid": %s, "tid": %s}]'
    fed, scanner = _scan(doc % (value, value), True)
    assert fed is not None
    assert fed.skipped == {"instant": 1}
    assert scanner.take()["pid"].to_list() == [1]


@pytest.mark.parametrize("key", [b"ts", b"dur"])
def test_whole_microsecond_times_read_up_to_2_62_ns(key: bytes) -> None:
    """Whole µs (the short integer step) and the same with a decimal point (the general one) are read
    to the same ns below 2**62 ns and left to the msgspec path from there (its check is per piece)."""
    doc = b'[{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 2}, {"ph": "X", "%s": %s, "tid": 3}]'
    for us, ns in [(b"999", 999_000), (b"4611686018427386", 4_611_686_018_427_386_000), (b"4611686018427387", None)]:
        for text in (us, us + b".0"):
            fed, scanner = _scan(doc % (key, text), True)
            if ns is None:
                assert fed is None, text
            else:
                assert fed is not None, text
                assert scanner.take()[key.decode()][1] == ns, text


def _reason_or_rows(doc: bytes) -> str | pl.DataFrame:
    """The scanner's answer for one array document with a fresh scanner: its decline reason, or its
    rows (strings as String, without `order`: comparable across scanners)."""
    scanner = native._chromescan.Scanner()
    result = scanner.feed(doc, True, None, 0)
    if isinstance(result, str):
        return result
    rows = pl.DataFrame(scanner.take()[0]).drop("order")
    return rows.with_columns(pl.col(pl.Categorical).cast(pl.String))


def _warm_reads_as_cold(events: list[bytes], what: object) -> bool:
    """The events in one document (each member compared with the bytes met at its position in the
    events before, values kept) read as each event read alone by a fresh scanner (nothing kept): the
    same rows, or the same reason to decline. True when the document was read. Spaces follow the
    last event: the bytes met before are compared only with 64 bytes left."""
    pad = b" " * 80
    warm = _reason_or_rows(b"[" + b",\n".join(events) + pad + b"]")
    cold = [_reason_or_rows(b"[" + e + pad + b"]") for e in events]
    reasons = [c for c in cold if isinstance(c, str)]
    if reasons:
        assert warm == reasons[0], what
        return False
    assert isinstance(warm, pl.DataFrame), (what, warm)
    assert_frame_equal(warm, pl.concat(cold), check_dtypes=False)
    return True


def _value_of_length(kind: str, n: int) -> bytes:
    """A JSON value of kind `kind` exactly n bytes long (n >= 3)."""
    if kind == "str":
        return b'"' + bytes(97 + k % 26 for k in range(n - 2)) + b'"'
    if kind in ("num", "neg"):
        return (b"1" if kind == "num" else b"-1") + b"0" * (n - 1 - (kind == "neg"))
    return b"[" + b"0, " * ((n - 3) // 3) + b"7" * ((n - 3) % 3 + 1) + b"]"  # arr


# (args key, value kind): a skipped string, a label, an integer, a raw array, a skipped array and number
_KEPT = [
    ("Call stack", "str"),
    ("name", "str"),
    ("stream", "num"),
    ("Input Dims", "arr"),
    ("Call stack", "arr"),
    ("Fwd thread id", "num"),
    ("stream", "neg"),
]


@pytest.mark.parametrize(("key", "kind"), _KEPT)
def test_kept_member_bytes_are_compared_to_the_last_byte(key: str, kind: str) -> None:
    """A member met at the same position of the events before is named, and its value read, by
    comparing bytes 16 at a time with those kept (key and value, up to 56 bytes; arrays also by a
    hash of their bytes): members of every length around those widths, with one byte changed at each
    offset in the last event (or a digit just after the value), read as each event alone reads, or
    declined for the same reason. The events alternate with an optional key before the member (two
    kept per position)."""
    read = used = 0
    for length in (15, 16, 17, 31, 32, 33, 47, 48, 49, 55, 56, 57, 63, 64, 65):
        if length - len(key) - 6 < 3 or (kind in ("num", "neg") and length - len(key) - 6 > 18):
            continue
        used += 1
        member = b', "%s": %s' % (key.encode(), _value_of_length(kind, length - len(key) - 6))
        assert len(member) == length

        def event(i: int, member: bytes = member, length: int = length) -> bytes:
            extra = b', "Sequence number": 9' if (i + length) % 2 else b""
            return (
                b'{"ph": "X", "cat": "c", "name": "n", "pid": 3, "tid": 4, "ts": %d, "dur": 2,'
                b' "args": {"External id": 5%s%s}}' % (10 + i, extra, member)
            )

        base = [event(i) for i in range(7)]
        read += _warm_reads_as_cold(base, (key, length))
        value_at = len(key) + 6
        # the bytes at each end of every 8 and 16 wide block, and around the key and the value's ends
        offsets = {at for at in range(length + 1) if at % 8 in (0, 7)}
        offsets |= {0, 1, 2, value_at - 1, value_at, length - 1, length}
        changes = [member + b"7"]  # a digit after the value: a longer number, or invalid JSON
        for at in sorted(offsets):
            changed = member + b"}"  # the byte after the value too
            changes.append(changed[:at] + bytes([changed[at] ^ 1]) + changed[at + 1 : -1])
        for changed in changes:
            events = [*base[:-1], event(6, changed)]  # the last one: the bytes after it are those after it alone
            read += _warm_reads_as_cold(events, (key, length, changed))
    assert read > 2 * used  # many changes keep the JSON valid


def test_an_array_found_by_its_bytes_holds_only_as_deep_as_it_was_read() -> None:
    """An array read at one depth (`[[[1]]]`) and found again by its bytes (and the 32 after them)
    deeper down, in arrays nested to the depth limit, must decline as a fresh scanner declines it
    (that array's depth check fails there), and still be read where it was."""
    tail = b', "' + b"a" * 30 + b'"]'  # the bytes after the array: the same in both places

    def event(outer: int) -> bytes:
        value = b"[" * outer + b"[1.5, [[[1]]]" + tail + b"]" * outer  # the fraction: the general path
        return b'{"ph": "X", "name": "a", "ts": 1, "dur": 2, "args": {"x": %s, "Seq": 1}}' % value

    def doc(*outer: int) -> bytes:
        return b"[%s]" % b", ".join(event(k) for k in outer)

    def outcome(result: object) -> object:
        return result if isinstance(result, str) else "read"

    # the outer nesting at which the event alone (a fresh scanner, nothing kept) is too deep
    n = next(n for n in range(40, 70) if outcome(native._chromescan.Scanner().feed(doc(n), True)) != "read")
    assert outcome(native._chromescan.Scanner().feed(doc(n), True)) == "nested too deeply"
    assert outcome(native._chromescan.Scanner().feed(doc(n - 1), True)) == "read"
    scanner = native._chromescan.Scanner()  # `[[[1]]]` read at the shallow event first, then found deeper
    assert [outcome(scanner.feed(doc(0, k), True)) for k in (n - 1, n, n - 1)] == ["read", "nested too deeply", "read"]


def test_nulls_among_integers_that_share_half_of_the_null_marker() -> None:
    """The validity of an integer column (null: the int64 minimum, compared two rows at a time by
    halves) and of a dictionary-encoded one (null: code -1): integers whose low or high 32 bits are
    those of the marker stay values, in runs longer and shorter than a byte of rows."""
    values = [None, -(2**63) + 1, 2**32, 0, 2**31, None, -1, -(2**32), 5, None, 2**63 - 1, -(2**31)]
    pids = values * 2 + values[:5]
    events = []
    for i, pid in enumerate(pids):
        fields = {"ph": "X", "ts": i, "dur": 1, **({"pid": pid} if pid is not None else {})}
        if i % 3:
            fields["name"] = f"op{i % 4}"
        events.append(fields)
    fed, scanner = _scan(json.dumps(events).encode(), True)
    assert fed is not None
    rows = scanner.take()
    assert rows["pid"].to_list() == pids
    assert rows["name"].cast(pl.String).to_list() == [f"op{i % 4}" if i % 3 else None for i in range(len(pids))]

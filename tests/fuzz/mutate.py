"""Seeded mutations of real input files: bytes (flips, cuts, splices), JSON structure (hostile values put
in real events), encodings (byte-order marks, UTF-16), what pipelines make of a whole trace (its events
twice, CRLF line endings, another time unit, quoted numbers, negative ids, another job's world size),
containers (gzip cut, doubled, with a tail), SQLite pages, values and schemas (another release's), and
Flight Recorder pickles (values swapped, then pickled again).

Each mutator takes the file's bytes and a `random.Random` and returns new bytes; everything is decided by
the generator, so a seed replays a case exactly (`describe` names what was done).
"""

from __future__ import annotations

import copy
import gzip
import pickle
import sqlite3
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import random
    from collections.abc import Callable

# -------------------------------------------------------------------------------------------- values

_LITERAL = "\x00fuzz-literal:"
"""A string standing for JSON text orjson cannot write (NaN, 1e400, deep nesting): replaced after dumping."""


def _literal(text: str) -> str:
    return _LITERAL + text


HOSTILE_TEXT = [
    "NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" + "0" * 400, "-0", "0.1e-400", "1.00000000000000000001",
    str(2**63), str(2**64), str(-(2**63) - 1), "123456789012345678901234567890.5", "[" * 3000 + "]" * 3000,
]  # fmt: skip
"""JSON (or JSON-like) text: non-standard literals, numbers past every range, nesting past any stack."""

HOSTILE_VALUES: list[Any] = [
    True, False, None, 0, -1, 2**62, -(2**62), 1e308, -1e308, 5e-324, 0.5, "", "x", "12", "1e3", " 7",
    "\u202e\u2028", "\ud7ff", [], {}, [1, 2], {"a": None}, "<script>alert(1)</script>",
]  # fmt: skip
"""Values orjson writes as they are: booleans where numbers go, numbers as strings, wrong containers."""


def hostile_value(rng: random.Random) -> Any:
    """A hostile value: one orjson writes (a copy: a later mutation of the document writes into a list or
    object put there, which shared would carry into every later case and make a seed's replay another
    case), or a literal of `HOSTILE_TEXT`."""
    if rng.random() < 0.4:
        return _literal(rng.choice(HOSTILE_TEXT))
    return copy.deepcopy(rng.choice(HOSTILE_VALUES))


def dump_json(doc: Any) -> bytes:
    """`doc` as JSON, with the literal placeholders of `hostile_value` put in as raw text."""
    text = orjson.dumps(doc)
    marker = orjson.dumps(_LITERAL)[1:-1]
    while (at := text.find(b'"' + marker)) >= 0:
        end = text.index(b'"', at + 1 + len(marker))
        text = text[:at] + text[at + 1 + len(marker) : end] + text[end + 1 :]
    return text


# --------------------------------------------------------------------------------------------- bytes


def flip(data: bytes, rng: random.Random) -> bytes:
    """1 to 16 bytes set to random values."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 16)):
        b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b)


def cut(data: bytes, rng: random.Random) -> bytes:
    """The file cut short (at a random byte, often near the end: a file still being written)."""
    return data[: rng.choice([rng.randrange(len(data)), len(data) - rng.randint(1, min(64, len(data)))])]


def splice(data: bytes, rng: random.Random) -> bytes:
    """A slice of the file copied over another place (events duplicated or cut mid-token)."""
    a, b = sorted(rng.randrange(len(data)) for _ in range(2))
    at = rng.randrange(len(data))
    return data[:at] + data[a : min(b, a + 4096)] + data[at:]


def insert_token(data: bytes, rng: random.Random) -> bytes:
    """A stray JSON token (or a NUL run) at a random place."""
    token = rng.choice([b'"', b"{", b"}", b"[", b"]", b",", b":", b"null", b"\\", b"\x00" * 64, b"\xff\xfe", b"NaN"])
    at = rng.randrange(len(data))
    return data[:at] + token + data[at:]


BYTE_MUTATORS = [flip, cut, splice, insert_token]


# --------------------------------------------------------------------------------------------- JSON

_EVENT_KEYS = ["ph", "name", "cat", "ts", "dur", "pid", "tid", "args", "id", "s", "bp"]
_ARG_KEYS = [
    "External id", "correlation", "device", "stream", "Collective name", "In msg nelems", "Out msg nelems", "dtype",
    "Group size", "Process Group Name", "Process Group ID", "Seq", "Src Rank", "Dst Rank", "bytes", "step_num",
    "device_ordinal", "hlo_op", "hlo_module", "run_id", "name", "labels", "Input Dims", "Input type",
]  # fmt: skip
_TOP_KEYS = ["distributedInfo", "baseTimeNanoseconds", "deviceProperties", "displayTimeUnit", "traceEvents"]


def _events(doc: Any) -> list[Any] | None:
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return doc["traceEvents"]
    return None


def json_structure(data: bytes, rng: random.Random) -> bytes:
    """1 to 8 hostile values put in real events (a field, an arg, a phase) or at the top level (the rank,
    the time base), or events dropped, repeated or reordered."""
    doc = orjson.loads(data)
    events = _events(doc)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(10)
        if not events or (op == 0 and isinstance(doc, dict)):
            key = rng.choice(_TOP_KEYS)
            if key == "distributedInfo" and rng.random() < 0.5:
                doc[key] = {"rank": hostile_value(rng), "world_size": hostile_value(rng)}
            elif isinstance(doc, dict):
                doc[key] = hostile_value(rng)
            events = _events(doc)
            continue
        i = rng.randrange(len(events))
        event = events[i]
        if op <= 4 and isinstance(event, dict):
            event[rng.choice(_EVENT_KEYS)] = hostile_value(rng)
        elif op <= 6 and isinstance(event, dict):
            args = event.get("args")
            if not isinstance(args, dict):
                args = event["args"] = {}
            args[rng.choice(_ARG_KEYS)] = hostile_value(rng)
        elif op == 7:
            del events[i]
        elif op == 8:
            events.insert(rng.randrange(len(events) + 1), rng.choice([event, hostile_value(rng)]))
        else:
            rng.shuffle(events)
    return dump_json(doc)


def encoding(data: bytes, rng: random.Random) -> bytes:
    """A byte-order mark, UTF-16 (LE or BE, with or without its mark), Latin-1 or invalid UTF-8 bytes."""
    op = rng.randrange(5)
    if op == 0:
        return b"\xef\xbb\xbf" + data
    text = data.decode("utf-8", "replace")
    if op == 1:
        return text.encode("utf-16")
    if op == 2:
        return text.encode("utf-16-be")
    if op == 3:
        return text.encode("latin-1", "replace")
    at = data.find(b'"name"', rng.randrange(len(data)))
    return data if at < 0 else data[: at + 8] + b"\xc3\x28\xed\xa0\x80" + data[at + 8 :]


def json_values(data: bytes, rng: random.Random) -> bytes:
    """1 to 6 values anywhere in a JSON document swapped for hostile ones, or keys dropped."""
    doc = orjson.loads(data)
    for _ in range(rng.randint(1, 6)):
        where = _walk(doc, rng)
        if where is None:
            doc = hostile_value(rng)
            break
        node, key = where
        if rng.random() < 0.15 and isinstance(node, dict):
            del node[key]
        else:
            node[key] = hostile_value(rng)
    return dump_json(doc)


def _each_event(data: bytes, change: Callable[[dict], None]) -> bytes:
    """`data` (a Chrome JSON trace) with `change` applied to each of its events that is an object."""
    doc = orjson.loads(data)
    for event in _events(doc) or []:
        if isinstance(event, dict):
            change(event)
    return dump_json(doc)


def doubled_events(data: bytes, rng: random.Random) -> bytes:
    """The event list twice over, as a merge that took one rank's file twice writes it (`jq -s` over the
    same file, a pipeline that appended a trace to itself)."""
    doc = orjson.loads(data)
    events = _events(doc)
    if not events:
        msg = "no event list"  # `mutate` goes on without it, so the case is not named for it
        raise ValueError(msg)
    events.extend(list(events))
    return dump_json(doc)


def line_endings(data: bytes, rng: random.Random) -> bytes:
    """Windows line endings (or old Mac ones, a lone CR), as a file copied through a Windows tool has them."""
    return data.replace(b"\n", rng.choice([b"\r\n", b"\r"]))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def time_unit(data: bytes, rng: random.Random) -> bytes:
    """Every `ts` and `dur` in another unit (seconds, milliseconds or nanoseconds where microseconds go), as
    an exporter writing its own clock does."""
    scale = rng.choice([1e-6, 1e-3, 1000])

    def change(event: dict) -> None:
        for key in ("ts", "dur"):
            if _number(event.get(key)):
                event[key] = event[key] * scale

    return _each_event(data, change)


def as_strings(data: bytes, rng: random.Random) -> bytes:
    """One field of every event (`ts`, `dur`, `pid` or `tid`) written as a string, as a pipeline that
    quotes every value writes it."""
    key = rng.choice(["ts", "dur", "pid", "tid"])

    def change(event: dict) -> None:
        if _number(event.get(key)):
            event[key] = str(event[key])

    return _each_event(data, change)


def negated_ids(data: bytes, rng: random.Random) -> bytes:
    """`pid` and `tid` of every event negated (ids written as signed 32-bit numbers past 2**31)."""

    def change(event: dict) -> None:
        for key in ("pid", "tid"):
            if _number(event.get(key)):
                event[key] = -event[key]

    return _each_event(data, change)


def other_job(data: bytes, rng: random.Random) -> bytes:
    """`distributedInfo` of another job: another world size (and maybe rank), as a rank's file from another
    run left in the folder says."""
    doc = orjson.loads(data)
    info = doc.get("distributedInfo") if isinstance(doc, dict) else None
    if isinstance(info, dict):
        info["world_size"] = rng.choice([1, 4, 8, 64])
        if rng.random() < 0.5:
            info["rank"] = rng.randrange(info["world_size"])
    return dump_json(doc)


PIPELINE_MUTATORS = [doubled_events, line_endings, time_unit, as_strings, negated_ids, other_job]
"""What real exporters and broken pipelines make of a whole trace (not damage at one place)."""
LOUD = {"doubled_events"}
"""Mutators whose file must never be read as if nothing were wrong: refused, or read with a warning."""
JSON_MUTATORS = [*BYTE_MUTATORS, json_structure, json_structure, json_values, encoding, *PIPELINE_MUTATORS]
DOC_MUTATORS = [*BYTE_MUTATORS, *[json_values] * 8, encoding]
"""For the JSON files beside traces (a plan, a profile)."""


# ----------------------------------------------------------------------------------------- containers


def container(data: bytes, rng: random.Random) -> bytes:
    """The content gzipped and then damaged: cut, gzipped twice, two members, a garbage tail, a bad CRC."""
    packed = gzip.compress(data, mtime=0)
    op = rng.randrange(5)
    if op == 0:
        return packed[: rng.randrange(10, len(packed))]
    if op == 1:
        return gzip.compress(packed, mtime=0)
    if op == 2:
        half = len(data) // 2
        return gzip.compress(data[:half], mtime=0) + gzip.compress(data[half:], mtime=0)
    if op == 3:
        return packed + rng.randbytes(rng.randint(1, 64))
    return packed[:-8] + bytes(8)  # CRC and size zeroed


# ----------------------------------------------------------------------------------------------- SQLite

PAGE = 4096


def sqlite_pages(data: bytes, rng: random.Random) -> bytes:
    """A page of the database overwritten (random bytes, zeros, or another page), or the file cut at a page."""
    pages = max(1, len(data) // PAGE)
    op = rng.randrange(4)
    if op == 3:
        return data[: rng.randrange(1, pages + 1) * PAGE - rng.choice([0, 1, 100])]
    n = rng.randrange(pages)
    if op == 0:
        fresh = rng.randbytes(PAGE)
    elif op == 1:
        fresh = bytes(PAGE)
    else:
        other = rng.randrange(pages)
        fresh = data[other * PAGE : (other + 1) * PAGE]
    offset = n * PAGE + (100 if n == 0 and rng.random() < 0.7 else 0)  # keep the header's magic, usually
    return data[:offset] + fresh[: PAGE - (offset - n * PAGE)] + data[(n + 1) * PAGE :]


_SQL_VALUES = [
    "NULL", "-1", "0", str(2**63 - 1), str(-(2**63)), "1e308", "'x'", "'12'", "X'00ff'", "9.5", "-9e18",
]  # fmt: skip


def sqlite_values(data: bytes, rng: random.Random) -> bytes:
    """1 to 4 columns of a table set, in some rows, to a hostile value (NULL, text, blob, extremes)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "db.sqlite"
        path.write_bytes(data)
        with sqlite3.connect(path) as db:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            for _ in range(rng.randint(1, 4)):
                table = rng.choice(tables)
                columns = [r[1] for r in db.execute(f'PRAGMA table_info("{table}")')]
                if not columns:
                    continue
                column = rng.choice(columns)
                value = rng.choice(_SQL_VALUES)
                limit = rng.choice([1, 5, -1])
                db.execute(
                    f'UPDATE "{table}" SET "{column}" = {value} WHERE rowid IN '
                    f'(SELECT rowid FROM "{table}" ORDER BY random() LIMIT {limit})'
                )
            if rng.random() < 0.2:
                db.execute(f'DROP TABLE "{rng.choice(tables)}"')
        return path.read_bytes()


def sqlite_schema(data: bytes, rng: random.Random) -> bytes:
    """The schema of another Nsight Systems release: a column dropped or renamed, a table renamed, or a
    column and a table added."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "db.sqlite"
        path.write_bytes(data)
        with sqlite3.connect(path) as db:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            table = rng.choice(tables)
            columns = [r[1] for r in db.execute(f'PRAGMA table_info("{table}")')]
            column = rng.choice(columns)
            op = rng.randrange(4)
            if op == 0:
                db.execute(f'ALTER TABLE "{table}" DROP COLUMN "{column}"')
            elif op == 1:
                db.execute(f'ALTER TABLE "{table}" RENAME COLUMN "{column}" TO "{column}V2"')
            elif op == 2:
                db.execute(f'ALTER TABLE "{table}" RENAME TO "{table}_V2"')
            else:
                db.execute(f'ALTER TABLE "{table}" ADD COLUMN "newField" INTEGER DEFAULT 7')
                db.execute('CREATE TABLE "NEW_TABLE" (id INTEGER PRIMARY KEY, value TEXT)')
        return path.read_bytes()


SQLITE_MUTATORS = [sqlite_pages, sqlite_values, sqlite_values, flip, cut, sqlite_schema, sqlite_schema]


# ----------------------------------------------------------------------------------------------- pickles


def _walk(obj: Any, rng: random.Random) -> Any:
    """A random container in `obj` and one of its keys (or indices), or None."""
    node, key = None, None
    current = obj
    for _ in range(rng.randint(1, 5)):
        if isinstance(current, dict) and current:
            k = rng.choice(list(current))
        elif isinstance(current, list) and current:
            k = rng.randrange(len(current))
        else:
            break
        node, key = current, k
        current = current[k]
    return None if node is None else (node, key)


_PICKLE_VALUES: list[Any] = [*HOSTILE_VALUES, float("nan"), float("inf"), 2**80, b"\xff", ("a", 1), (), 1j]


def pickle_values(data: bytes, rng: random.Random) -> bytes:
    """A real Flight Recorder dump with 1 to 6 values swapped for hostile ones (deep in the entries too),
    pickled again (protocol 2, as torch writes)."""
    obj = pickle.loads(data)
    for _ in range(rng.randint(1, 6)):
        where = _walk(obj, rng)
        if where is None:
            continue
        node, key = where
        if rng.random() < 0.15 and isinstance(node, dict):
            del node[key]
        else:
            node[key] = rng.choice(_PICKLE_VALUES)
    return pickle.dumps(obj, protocol=2)


PICKLE_MUTATORS = [pickle_values, pickle_values, pickle_values, pickle_values, flip, cut, splice]


def mutate(data: bytes, rng: random.Random, mutators: list) -> tuple[bytes, str]:
    """`data` through one to three of `mutators`; (the bytes, the names of those applied)."""
    names = []
    for _ in range(rng.choice([1, 1, 1, 1, 2, 3])):
        m = rng.choice(mutators)
        try:
            data = m(data, rng) if data else data
        except Exception:  # an earlier mutation left bytes this one cannot parse
            continue  # the bytes stay as they are
        names.append(m.__name__)
    return data, "+".join(names) or "none"

"""Decode the Chrome Trace Event container (Kineto and JAX JSON) into columns.

Each document (a file, or a piece of a large one) is read by the C scanner of `native.py` straight
into columns where it can; otherwise (and where the extension was not built) msgspec decodes it into
slotted, untracked structs that keep only the fields tracediag uses (unknown keys are skipped by the
C decoder, bulky `args` values stay raw), which are then turned into polars columns. Both give the
same columns (tests/ingest/test_native_scan.py). Format semantics (what a `cat` means) live in the dialect
modules (`kineto.py`, `jax.py`); this module only knows the container: phases, truncated files,
time units, B/E pairing and the rule that every input event is a row or a counted skip.
"""

from __future__ import annotations

import itertools
import mmap
import re
from collections import Counter
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cache
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Union

import msgspec
import orjson
import polars as pl

from tracediag.errors import NotATraceError, TraceError
from tracediag.ingest import native
from tracediag.schema import MAX_NS
from tracediag.vocab import COLLECTIVE_ROW, DEVICE_CATS, SEQUENCE_INPUT_OP, category, distinct_names, name_matches

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

_RAW_EMPTY = msgspec.Raw(b"")


class _Args(msgspec.Struct, gc=False, frozen=True):
    """The `args` keys tracediag reads; bulky list-valued ones stay undecoded (`Raw`)."""

    external_id: int | None = msgspec.field(default=None, name="External id")
    correlation: int | None = None
    device: Any = None
    stream: Any = None
    coll_name: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_id: Any = msgspec.field(default=None, name="Process Group ID")
    seq: Any = msgspec.field(default=None, name="Seq")
    src_rank: Any = msgspec.field(default=None, name="Src Rank")
    dst_rank: Any = msgspec.field(default=None, name="Dst Rank")
    nbytes: Any = msgspec.field(default=None, name="bytes")
    step_num: Any = None
    device_ordinal: Any = None
    hlo_op: Any = None
    hlo_module: Any = None
    run_id: Any = None
    label: Any = msgspec.field(default=None, name="name")
    labels: Any = None
    input_dims: msgspec.Raw = msgspec.field(default=_RAW_EMPTY, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_RAW_EMPTY, name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=_RAW_EMPTY, name="Concrete Inputs")


_NO_ARGS = _Args()
"""Shared by every event without `args`, so columns are read without None checks."""


_EVENT_FIELDS = (
    [(f, Any, None) for f in ("name", "cat", "ts", "dur")]
    + [(f, int | str | None, None) for f in ("pid", "tid")]
    + [("args", _Args, _NO_ARGS)]
)
"""Ids are typed (a wrong-typed one sends the piece to the lenient path, which counts the event
as malformed); names and times stay untyped and are checked as columns."""


class _Event(msgspec.Struct, gc=False):
    """Any event, whatever its phase (the fallback when a file has phases the tagged union lacks)."""

    ph: Any = None
    name: Any = None
    cat: Any = None
    ts: Any = None
    dur: Any = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: _Args = _NO_ARGS

    @property
    def phase(self) -> Any:
        return self.ph


class _Tagged(msgspec.Struct, gc=False, tag_field="ph"):
    """Events decoded by phase: the phases that become rows (or metadata) get every field; the
    phases only counted (flows, instants, counters, ...) get none, so the decoder skips their
    fields instead of building objects for them (Kineto's flow arrows are a third of its events)."""


def _tagged(phase: str, fields: list) -> type:
    return msgspec.defstruct(
        f"_Phase_{ord(phase)}", fields, bases=(_Tagged,), tag=phase, namespace={"phase": phase}, gc=False
    )


_ROW_PHASES = ("X", "B", "E", "M")
_OTHER_PHASES = ("c", "(", ")", "V", "v")
_PHASE_SKIP = {
    "i": "instant",
    "I": "instant",
    "R": "instant",
    "C": "counter",
    "s": "flow",
    "t": "flow",
    "f": "flow",
    "b": "async",
    "n": "async",
    "e": "async",
    "S": "async",
    "T": "async",
    "p": "async",
    "F": "async",
    "N": "object",
    "O": "object",
    "D": "object",
    "P": "object",
}
"""Phases that never become rows, by skip reason (`M` is counted as metadata once decoded)."""

_ROW_TYPES = {_tagged(p, _EVENT_FIELDS) for p in _ROW_PHASES} | {_Event}
_META_TYPE = next(t for t in _ROW_TYPES if t is not _Event and t.phase == "M")
_SKIP_TYPES = {_tagged(p, []): reason for p, reason in _PHASE_SKIP.items()}
_SKIP_TYPES.update({_tagged(p, []): "other_phase" for p in _OTHER_PHASES})
_TaggedEvent = Union[tuple(_ROW_TYPES - {_Event}) + tuple(_SKIP_TYPES)]  # noqa: UP007 - built at run time


@cache
def _object_type(event: Any) -> type:
    return msgspec.defstruct(
        "_Object",
        [
            ("traceEvents", list[event], msgspec.field(default_factory=list)),
            *[(k, Any, None) for k in _TOP_KEYS],
        ],
        gc=False,
    )


ENDS_EARLY = "file ends early"
"""How the warning of a file cut short begins (its complete events were read): a watcher
(`tracediag.watch`) takes such a file as still being written."""
_TOP_KEYS = ("baseTimeNanoseconds", "distributedInfo", "deviceProperties", "metadata", "displayTimeUnit", "host_name")
"""The Object form's top-level keys tracediag reads; every other one is ignored."""


@cache
def _decoder(event: Any, is_array: bool, exact: bool) -> msgspec.json.Decoder:
    """The decoder of `event`s (an array, or the Object form); exact keeps floats as `Decimal` (their
    decimal text). Built on first use: the C scanner reads most documents without one, and building
    one resolves the type hints of every struct it decodes into."""
    return msgspec.json.Decoder(list[event] if is_array else _object_type(event), float_hook=Decimal if exact else None)


def _decode_fast(doc: bytes, is_array: bool, *, exact: bool = False) -> Any:
    """Decode with the tagged union, or, when a phase is unknown or missing, with plain events.

    Raises msgspec's DecodeError (bad JSON) or ValidationError (wrong-typed fields).
    """
    try:
        return _decoder(_TaggedEvent, is_array, exact).decode(doc)
    except msgspec.ValidationError:
        return _decoder(_Event, is_array, exact).decode(doc)


_EXACT_LIMIT_US = float(2**43)
"""Below 2**43 µs (~102 days) a float64's ulp is under 1 ns, so the 3-decimal text is recoverable."""


CHUNK_BYTES = 4 << 20
"""Files are decoded in pieces of about this size, so a worker holds the file's bytes plus the
columns, never the Python objects of the whole file at once."""
SCANNED_ROWS = 50_000
"""The scanner's rows go to polars (and are released) once it holds about this many: fewer, larger
batches cost less CPU, smaller ones less memory. Counted in rows, not bytes: a compact trace holds
three times the rows of a pretty-printed one per MB."""
_EVENTS_KEY = re.compile(rb'(?<!\\)"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


@dataclass(eq=False)
class Decoded:
    """A Chrome trace decoded to columns, before any format semantics."""

    slices: pl.DataFrame
    """Duration events (X, and matched B/E): ph, cat, name, pid, pid_str, tid, ts (ns), dur (ns),
    order (index in the file), a_external_id, a_correlation. `cat` and `name` are Categorical (a
    trace's rows hold a few hundred distinct ones: match a pattern on the distinct names, not per
    row); the other strings String."""
    rare: tuple[pl.DataFrame, ...]
    """The less common args, one frame per `_ARG_TIERS` entry: `order` plus `a_<field>` for the rows
    of that tier only. Join what you need with `with_args`."""
    metadata: pl.DataFrame
    """`M` events: name (process_name, thread_name, ...), pid, pid_str, tid, label, labels (strings String)."""
    top: dict[str, Any]
    """Top-level keys of the Object form (baseTimeNanoseconds, distributedInfo, ...)."""
    events_in: int
    skipped: dict[str, int]
    warnings: list[str] = field(default_factory=list)

    def with_args(self, frame: pl.DataFrame, *fields: str) -> pl.DataFrame:
        """`frame` (with an `order` column) plus the named `a_*` rare-arg columns (null where absent).

        Only the `order` column takes part in the join, and the result's new columns are added to
        `frame`: its other columns are shared, never copied (a join of the whole frame would hold
        it twice at once).
        """
        keys = frame.select("order")
        for tier in self.rare:
            wanted = [f for f in fields if f in tier.columns]
            if wanted and tier.height == 0:
                frame = frame.with_columns(pl.lit(None, dtype=tier.schema[f]).alias(f) for f in wanted)
            elif wanted:
                found = keys.join(tier.select("order", *wanted), on="order", how="left", maintain_order="left")
                frame = frame.with_columns(found.drop("order"))
        return frame


def decode(source: bytes | Iterable[bytes] | mmap.mmap, path: str, *, lead: int = 0) -> Decoded:
    """Decode Chrome-trace JSON (its bytes, a stream of byte blocks, or the file mapped copy-on-write by
    `sniff.map_plain`, which is then closed) into columns.

    Every event is a slice or a counted skip. `lead`: the bytes of the file before a stream's first
    block (whitespace `sniff.peek_head` skipped), so that an error's offset is the file's.
    """
    warnings: list[str] = []
    skipped: dict[str, int] = {}
    padding = _Padding()
    if isinstance(source, mmap.mmap):
        buffer: _Buffer = _Mapped(source, end=padding.end_of(source))
    else:
        blocks = iter([source] if isinstance(source, (bytes, bytearray)) else source)
        buffer = _Buffer(padding.held_back(blocks), consumed=lead)
    top: dict[str, Any] = {}
    bases: list[pl.DataFrame] = []
    metas: list[pl.DataFrame] = []
    rare = _RareArgs()
    n_events = 0  # input events seen
    scanner = native.Scanner(SCANNED_ROWS)  # its `next_order`: the `order` of the next row reaching the frame
    held = 0  # rows the scanner holds
    for events, piece_top, piece, piece_is_array in _pieces(buffer, path, warnings, skipped, scanner):
        top.update({k: v for k, v in piece_top.items() if v is not None})
        if isinstance(events, native.Fed):
            n_events += events.n_events
            for reason, n in events.skipped.items():
                skipped[reason] = skipped.get(reason, 0) + n
            held += events.rows
            if held >= SCANNED_ROWS:
                _add_scanned(scanner, bases, metas, rare, skipped)
                held = 0
            continue
        if held:  # a piece the scanner declined: the rows scanned before it come first
            _add_scanned(scanner, bases, metas, rare, skipped)
            held = 0
        n_events += len(events)
        kept, meta = _split_metadata(_drop_counted(events, skipped))
        if meta:
            skipped["metadata"] = skipped.get("metadata", 0) + len(meta)
            metas.append(_metadata_frame(meta))
        base, args = _piece_frame(kept, scanner.next_order, piece, piece_is_array, warnings)
        rare.add(base, args, scanner.next_order)
        scanner.next_order += len(kept)
        bases.append(base)
    if held:
        _add_scanned(scanner, bases, metas, rare, skipped)
    if not bases:  # no event at all (`[]`, `{"traceEvents": []}`): the columns, without rows
        bases.append(_piece_frame([], 0, b"", False, warnings)[0])
    if padding.nuls:
        warnings.append(padding.warning())
    frame = _contiguous(bases)
    # events dropped while decoding (cut off, or not convertible) never reached the frame
    events_in = n_events + skipped.get("malformed", 0) + skipped.get("truncated", 0)
    metadata = pl.concat(metas) if metas else _metadata_frame([])
    decoded = Decoded(frame, rare.frames(), metadata, top, events_in, skipped, warnings)
    # whether every row is complete, and how many are bad: one pass, in the common case all `_slices_from` needs
    all_complete, n_bad = frame.select(all_x=pl.col("ph").eq_missing("X").all(), n_bad=_BAD_SLICE.sum()).row(0)
    for phase, count in [] if all_complete else frame.group_by("ph").len().iter_rows():
        if phase in ("X", "B", "E"):
            continue
        reason = "malformed" if phase is None else _PHASE_SKIP.get(phase)
        skipped[reason or "other_phase"] = skipped.get(reason or "other_phase", 0) + count
    decoded.slices = _slices_from(
        frame, skipped, warnings, all_complete=all_complete, n_bad=n_bad if all_complete else None
    )
    return decoded


SMALL_BYTES = 2 * CHUNK_BYTES
"""A document below this size is decoded whole by `decode` (one piece): `decode_small` may read it with others."""
SMALL_BATCH_ROWS = 20 * SCANNED_ROWS
"""`decode_small` turns the scanner's rows (all its columns: about 300 MB at 1M rows) into compact frames
once it holds this many (at the end of the file that reaches it), so a batch of large files never holds
them all. A group of 256 Kineto windows (850k rows) takes one: at 200k rows, 5% more CPU joining the takes."""


@dataclass(eq=False)
class Batch:
    """Small files decoded together (`decode_small`): one set of columns, a `file` column (UInt32, the
    file's index in the batch) on `slices` and `metadata`; `order` runs on across the files (each
    file's rows keep their own order, from `first_order[i]`). The per-file parts of `Decoded` are lists."""

    decoded: Decoded
    """The files' columns together (its `top`, `events_in`, `skipped` and `warnings` are unused)."""
    files: list[int]
    """The batch indices of the files read (the others, declined, read alone as before)."""
    first_order: list[int]
    """By file read: the batch `order` of its first row (its own order is 0 there)."""
    tops: list[dict[str, Any]]
    events_in: list[int]
    skipped: list[dict[str, int]]

    def without(self, drop: set[int]) -> Batch:
        """The batch less the files of batch indices `drop` (their rows, metadata and rare args)."""
        if not drop & set(self.files):
            return self
        dec = self.decoded
        keep = [k for k, f in enumerate(self.files) if f not in drop]
        kept_file = ~pl.col("file").is_in(sorted(drop))
        slices = dec.slices.filter(kept_file)
        orders = slices.get_column("order")
        rare = tuple(t.filter(pl.col("order").is_in(orders.implode())) for t in dec.rare)
        return Batch(
            Decoded(slices, rare, dec.metadata.filter(kept_file), {}, 0, {}),
            *([column[k] for k in keep] for column in (self.files, self.first_order, self.tops)),
            *([column[k] for k in keep] for column in (self.events_in, self.skipped)),
        )


def decode_small(docs: Iterable[bytes | memoryview | None]) -> tuple[Batch | None, list[int]]:
    """Decode many small whole documents (each a file's content, under `SMALL_BYTES`, starting with `{` or
    `[`) as `decode` decodes each, into one set of columns; and the indices of the documents declined (to
    be read alone by `decode`, as ever): those the C scanner does not read, files without rows (an
    Object form without `traceEvents` too), and files with B/E or other non-X rows, or without usable times.
    No batch (None) where every document was declined.

    A document may be None (declined). Each file's slices, rare args and metadata equal `decode`'s of it
    alone (tests/ingest/test_small_batch.py).
    """
    scanner = native.Scanner(SMALL_BATCH_ROWS)
    declined: list[int] = []
    files, first_order, tops, events_in, skipped = [], [], [], [], []
    bases: list[pl.DataFrame] = []
    metas: list[pl.DataFrame] = []
    rare_args = _RareArgs()
    held: list[tuple[int, int]] = []  # (file, rows) of the files the scanner holds

    def add_held() -> None:
        """The scanner's rows as frames, each row's file told by the rows each file added."""
        taken = scanner.take()
        slot = pl.Series("file", [f for f, _ in held], dtype=pl.UInt32)
        at = pl.Series([0, *itertools.accumulate(n for _, n in held)][:-1], dtype=pl.UInt32)
        rows = pl.int_range(taken.height, eager=True, dtype=pl.UInt32)
        taken = taken.with_columns(file=slot.gather(at.search_sorted(rows, side="right") - 1))
        _add_taken(taken, scanner.strings, bases, metas, rare_args, {})  # metadata counted by file below
        held.clear()

    for i, doc in enumerate(docs):
        if doc is None:
            declined.append(i)
            continue
        is_array = bytes(doc[:1]) == b"["
        start = scanner.next_order
        fed = scanner.feed(doc, is_array, None, len(doc))
        if fed is None or not fed.rows:  # no row (no `traceEvents`?): `decode` types empty columns otherwise
            declined.append(i)
            continue
        files.append(i)
        first_order.append(start)
        tops.append({k: v for k, v in fed.top.items() if v is not None})
        events_in.append(fed.n_events)
        skipped.append(dict(fed.skipped))
        held.append((i, fed.rows))
        if sum(n for _, n in held) >= SMALL_BATCH_ROWS:  # the scanner's wide rows go to compact frames
            add_held()
    if not files:
        return None, declined
    if held:
        add_held()
    frame = bases[0] if len(bases) == 1 else _contiguous(bases)
    metadata = pl.concat(metas) if metas else _metadata_frame([]).with_columns(file=pl.lit(0, dtype=pl.UInt32)).clear()
    rare = rare_args.frames()
    index = {f: k for k, f in enumerate(files)}
    for f, n in metadata.group_by("file").len().iter_rows():
        skipped[index[f]]["metadata"] = n
    batch = Batch(Decoded(frame, rare, metadata, {}, 0, {}), files, first_order, tops, events_in, skipped)
    odd = frame.filter(pl.col("ph").ne_missing("X") | _BAD_SLICE).get_column("file").unique().to_list()
    return batch.without(set(odd)), sorted([*declined, *odd])


_BASE_COLUMNS = ("ph", "cat", "name", "pid", "tid", "pid_str", "ts", "dur", "order", "a_external_id", "a_correlation")
_META_COLUMNS = ("name", "pid", "pid_str", "tid", "label", "labels")


def _add_scanned(
    scanner: native.Scanner,
    bases: list[pl.DataFrame],
    metas: list[pl.DataFrame],
    rare: _RareArgs,
    skipped: dict[str, int],
) -> None:
    """The scanner's rows as a base frame and a metadata frame, appended to `bases` and `metas`;
    their rare args go to `rare`. One polars call for all of them.

    The base frame goes through the filter even where every row is kept (a batch without `M` rows: in
    Kineto every batch but the last, metadata closes the file): taking the scanner's columns as they
    are kept the batch alive until the pieces were joined, and the next batches then faulted in fresh
    pages (measured: more CPU than the query saves). The metadata query runs only on a batch with `M`
    rows, and a tier whose rule is "no category" only where some row lacks one."""
    _add_taken(scanner.take(), scanner.strings, bases, metas, rare, skipped)


def _add_taken(
    taken: pl.DataFrame,
    strings: pl.Series,
    bases: list[pl.DataFrame],
    metas: list[pl.DataFrame],
    rare: _RareArgs,
    skipped: dict[str, int],
) -> None:
    """`_add_scanned` of the rows `taken` from a scanner (`strings`: its `Scanner.strings`); a `file`
    column (`decode_small`) stays on the base and metadata frames."""
    extra = ["file"] if "file" in taken.columns else []
    has_meta = bool(taken.height) and taken.get_column("order").min() < 0  # `M` rows have order -1
    rows = taken.lazy()
    kept = pl.col("order") >= 0
    cat_nulls = taken.get_column("cat").null_count()
    # each query selects its columns before it filters: a filter shared by all would be computed once
    # over every column (common subplans are cached), a copy of the whole batch
    base = rows.select(
        *_BASE_COLUMNS[:-2], *extra, a_external_id=pl.col("external_id"), a_correlation=pl.col("correlation")
    ).filter(kept)
    tiers: list[pl.LazyFrame | pl.DataFrame] = [
        _no_rows(taken, fields)
        if rule is _NO_CAT and not cat_nulls
        else rows.select("order", "ph", "cat", "name", "has_args", *fields)
        .filter(kept & pl.col("has_args") & mask)
        .select("order", *(pl.col(f).alias(f"a_{f}") for f in fields))
        for mask, (rule, fields) in zip(_tier_masks(taken, strings), _ARG_TIERS)
    ]
    queries = [base, *(t for t in tiers if isinstance(t, pl.LazyFrame))]
    if has_meta:
        queries.append(
            rows.select(*_META_COLUMNS, *extra, "order")
            .filter(~kept)
            .drop("order")
            .with_columns(pl.col("name").cast(pl.String))
        )
    done = pl.collect_all(queries, engine="in-memory")
    bases.append(done[0])
    lazy = iter(done[1:])
    rare.add_frames([t if isinstance(t, pl.DataFrame) else next(lazy) for t in tiers])
    meta = next(lazy, None)
    if meta is not None and meta.height:
        skipped["metadata"] = skipped.get("metadata", 0) + meta.height
        metas.append(meta)


def _no_rows(taken: pl.DataFrame, fields: tuple[str, ...]) -> pl.DataFrame:
    """A tier's frame without rows, typed as the scanned columns (what its query would give). Built from
    the types alone: an empty slice of a scanned column would keep the whole batch alive."""
    schema = taken.schema
    return pl.DataFrame(schema={"order": schema["order"], **{f"a_{f}": schema[f] for f in fields}})


def _contiguous(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """The pieces' frames as one frame of single-chunk columns, built column by column (each
    column's pieces are released as it is joined), so the file's columns are never held twice.

    Single chunks matter: an expression over columns of different chunk layouts (a piece-chunked
    column and a joined one) copies the chunked one whole, in every later expression.
    """
    columns = []
    for name in parts[0].columns:
        columns.append(pl.concat([p.drop_in_place(name) for p in parts], rechunk=True))
    return pl.DataFrame(columns)


def _split_metadata(events: list[Any]) -> tuple[list[Any], list[Any]]:
    """(the other events, the `M` events): metadata never enters the event frame (a trace may hold
    hundreds of thousands of repeated process and thread names)."""
    types = set(map(type, events))
    if _META_TYPE not in types and _Event not in types:
        return events, []
    return [e for e in events if e.phase != "M"], [e for e in events if e.phase == "M"]


def _metadata_frame(meta: list[Any]) -> pl.DataFrame:
    """`M` events: name (process_name, thread_name, ...), pid, pid_str, tid, label, labels."""
    pid = [e.pid for e in meta]
    pid_int = _int_series(pid)
    return pl.DataFrame(
        {
            "name": _texts([e.name for e in meta]),
            "pid": pid_int,
            "pid_str": pl.Series([p if type(p) is str else None for p in pid], dtype=pl.String),
            "tid": _tid_series([e.tid for e in meta]),
            "label": _arg_series("label", [e.args.label for e in meta]),
            "labels": _arg_series("labels", [e.args.labels for e in meta]),
        }
    )


def _drop_counted(events: list[Any], skipped: dict[str, int]) -> list[Any]:
    """The events that carry fields (rows and metadata); the field-less phases only add to `skipped`."""
    types = Counter(map(type, events))
    if all(t in _ROW_TYPES for t in types):
        return events
    for t, n in types.items():
        reason = _SKIP_TYPES.get(t)
        if reason is not None:
            skipped[reason] = skipped.get(reason, 0) + n
    return [e for e in events if type(e) in _ROW_TYPES]


def _pieces(
    buf: _Buffer, path: str, warnings: list[str], skipped: dict[str, int], scanner: native.Scanner
) -> Iterator[tuple[list[_Event] | native.Fed, dict[str, Any], bytes | None, bool]]:
    """Decode a streamed file in pieces of about CHUNK_BYTES, each made a complete JSON document.

    Only a few pieces' bytes are held at a time. Cuts fall between two events (`}, {` after the
    events' opening bracket): the head keeps the keys before the events and is closed with an end
    marker event and `]}`; middle pieces become arrays; the tail is opened with `{"traceEvents":[`,
    keeps the keys after the events and gets the truncation repair. A cut that lands inside a
    string makes its piece fail as "truncated", and the piece is extended (by a doubling step, so
    a huge string costs linear time). Every piece is checked to lie inside the events array: the
    head's end marker must be its last event, and a middle piece that crosses the array's end is
    not valid JSON; either way the rest of the file is decoded as one document, so objects of a
    later top-level list never become events. Files that fit in two pieces, or where the events
    cannot be located, are decoded whole. Yields (events, top-level keys, the piece's bytes (None
    for a scanned piece: only the msgspec path reads them again), whether the piece is in Array form).
    """
    buf.fill(2 * CHUNK_BYTES)
    buf.strip_leading()
    is_array = buf.view()[:1] == b"["
    start = _events_start(buf.view(), is_array)
    if buf.eof or start is None:
        yield _rest(buf, path, is_array, warnings, skipped, scanner, head=True)
        return
    head = True
    while True:
        at = start + CHUNK_BYTES
        buf.fill(at + CHUNK_BYTES)
        m = _boundary(buf, at)
        step = CHUNK_BYTES
        while m is not None:
            # the head + its end marker, or `[` + the events + `]`: in place, never a copy of the piece
            prefix, suffix = (b"", _HEAD_END[is_array]) if head else (b"[", b"]")
            with buf.opened(prefix, m[0] + 1, suffix) as doc:
                fed = scanner.feed(doc, is_array or not head, _END_NAME if head else None, buf.rest())
                piece = None if fed is not None else bytes(doc)
            piece_is_array = is_array if head else True
            piece_warnings: list[str] = []
            piece_skipped: dict[str, int] = {}  # counted only once the piece is accepted
            if fed is not None:
                events, top = fed, fed.top
                if head and not fed.ended:
                    scanner.drop_last()
                    m = None  # the events array closed before the cut
                break
            try:
                events, top = _decode_doc(piece, path, piece_is_array, piece_warnings, piece_skipped, repair=False)
            except msgspec.DecodeError as e:
                if "truncated" in str(e).lower():  # the cut fell inside a string or an event's args
                    step *= 2
                    buf.fill(m[1] + step + CHUNK_BYTES)
                    m = _boundary(buf, m[1] + step)
                    continue
                m = None  # the piece crosses the end of the events (or the JSON is bad): read the rest whole
                break
            if head and not _drop_end_marker(events):
                m = None  # the events array closed before the cut
            break
        if m is None:
            yield _rest(buf, path, is_array, warnings, skipped, scanner, head=head)
            return
        buf.drop(m[1] - 1)
        warnings.extend(piece_warnings)
        for reason, n in piece_skipped.items():
            skipped[reason] = skipped.get(reason, 0) + n
        yield events, top, piece, piece_is_array
        start, head = 0, False


def _boundary(buf: _Buffer, at: int) -> tuple[int, int] | None:
    """(start, end) of the first cut between two events at or after `at` (offsets from `buf.lo`)."""
    m = _BOUNDARY.search(buf.view(), at)
    return (m.start(), m.end()) if m else None


_END_NAME = "\x00tracediag: end of piece"
_END_EVENT = b'{"ph":"M","name":"\\u0000tracediag: end of piece"}'
_HEAD_END = {True: b"," + _END_EVENT + b"]", False: b"," + _END_EVENT + b"]}"}
"""Closes a head piece; the marker must come back as the last event, or the cut was not inside
the events array."""


def _drop_end_marker(events: list[Any]) -> bool:
    """Remove the head piece's end marker; False when it is not the last event."""
    if events and getattr(events[-1], "name", None) == _END_NAME and events[-1].phase == "M":
        events.pop()
        return True
    return False


def _rest(
    buf: _Buffer,
    path: str,
    is_array: bool,
    warnings: list[str],
    skipped: dict[str, int],
    scanner: native.Scanner,
    *,
    head: bool,
) -> tuple[list[_Event] | native.Fed, dict[str, Any], bytes | None, bool]:
    """Decode everything not yet decoded as one document (the whole file when nothing was)."""
    prefix = b"" if head else b"[" if is_array else b'{"traceEvents":['
    _refuse_first_error(buf, prefix, path)
    base = buf.consumed - len(prefix)  # the file offset of the document's first byte
    buf.fill(None)
    with buf.opened(prefix, buf.size, b"") as doc:
        fed = scanner.feed(doc, is_array, None, buf.rest())
        piece = None if fed is not None else bytes(doc)
    buf.release()
    if fed is not None:
        return fed, fed.top, None, is_array
    events, top = _decode_doc(piece, path, is_array, warnings, skipped, repair=True, whole=head, base=base)
    return events, top, piece, is_array


_SKIM = msgspec.json.Decoder(msgspec.Raw)
"""Checks JSON syntax without building a value (what `_first_error` needs)."""
_AT_BYTE = re.compile(r"\s*\(byte (\d+)\)")
_MALFORMED = "JSON is malformed: "


def _refuse_first_error(buf: _Buffer, prefix: bytes, path: str) -> None:
    """Before the rest of a file is read as one document: raise at its first invalid byte, read in
    windows that double from what is held, so a bad file is read at most about twice as far as its
    first error, never to its end (a 4 GB file of NUL bytes after `{"traceEvents": [` stops at byte
    17, having read 8 MB). The last window, the file's end, is left to the decode itself."""
    size = max(buf.size, CHUNK_BYTES)
    while not buf.eof:
        with buf.opened(prefix, buf.size, b"") as doc:
            error = _first_error(doc)
        if error is not None:
            at, what = error
            raise TraceError(path, f"invalid JSON at byte {buf.consumed - len(prefix) + at} ({what})")
        size *= 2
        buf.fill(size)


def _first_error(window: memoryview) -> tuple[int, str] | None:
    """(offset, problem) of the first byte where a JSON document beginning `window` is invalid, whatever
    follows the window; None if none is. An error at the window's end (a token cut by it) is none, nor
    a trailing comma (a file cut short after one is repaired)."""
    try:
        _SKIM.decode(window)
    except msgspec.DecodeError as e:
        text = str(e)
        m = _AT_BYTE.search(text)
        if m and int(m[1]) < len(window) and "trailing comma" not in text:
            return int(m[1]), _AT_BYTE.sub("", text).removeprefix(_MALFORMED)
    except RecursionError:
        pass
    return None


def _json_error(error: str, base: int, data: bytes | memoryview | None = None) -> str:
    """The message of msgspec's error with its `(byte N)` (an offset in the decoded document) as the file's offset;
    for bytes that are not UTF-8, which msgspec places nowhere, the offset and the bytes found in `data`."""
    text = error.removeprefix(_MALFORMED)
    m = _AT_BYTE.search(text)
    if m is None and data is not None and "UTF-8" in text:
        try:
            bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            return f"invalid JSON at byte {base + e.start} ({text}: {bytes(data[e.start : e.start + 4])!r})"
    if m is None:
        return f"invalid JSON ({text})"
    return f"invalid JSON at byte {max(base + int(m[1]), 0)} ({_AT_BYTE.sub('', text)})"


_LEADING_SPACE = re.compile(rb"[ \t\r\n]*")


class _Buffer:
    """The not yet decoded bytes of a streamed file: `buf[lo:hi]`.

    Dropping bytes moves `lo`; a block is copied in after `hi`, and the held bytes move to the front
    only when it does not fit. So each byte of the file is copied about once, whatever the piece
    size. `ROOM` bytes before `lo` are free, for the prefix `opened` writes there.
    """

    ROOM = 16

    def __init__(self, blocks: Iterator[bytes], *, consumed: int = 0) -> None:
        self.blocks = blocks
        self.buf = bytearray(self.ROOM)
        self.lo = self.hi = self.ROOM
        self.eof = False
        self.consumed = consumed
        """The bytes of the file before `lo` (dropped, or skipped before the first block)."""

    @property
    def size(self) -> int:
        return self.hi - self.lo

    def rest(self) -> int | None:
        """The bytes from `lo` to the end of the file, where known (a mapped file)."""
        return None

    def view(self, start: int = 0, stop: int | None = None) -> memoryview:
        """The held bytes from `start` to `stop` (offsets from `lo`)."""
        return memoryview(self.buf)[self.lo + start : self.hi if stop is None else self.lo + stop]

    def fill(self, size: int | None) -> None:
        """Read blocks until `size` bytes are held (None: to the end of the file)."""
        while not self.eof and (size is None or self.hi - self.lo < size):
            block = next(self.blocks, None)
            if block is None:
                self.eof = True
                break
            n = len(block)
            if self.hi + n > len(self.buf) and self.ROOM + self.size + n <= len(self.buf):
                # the held bytes to the front; memoryview to memoryview is a memmove (bytearray slice
                # assignment memcpys, wrong where the two overlap)
                memoryview(self.buf)[self.ROOM : self.ROOM + self.size] = memoryview(self.buf)[self.lo : self.hi]
                self.lo, self.hi = self.ROOM, self.ROOM + self.size
            if self.hi + n > len(self.buf):
                del self.buf[self.hi :]
                self.buf += block  # grows in place (realloc): no view of the buffer lives across `fill`
            else:
                self.buf[self.hi : self.hi + n] = block
            self.hi += n

    @contextmanager
    def opened(self, prefix: bytes, end: int, suffix: bytes) -> Iterator[memoryview]:
        """`prefix` + the held bytes up to `end` + `suffix`, without copying them: the prefix is
        written in the free bytes before `lo`, the suffix over the bytes at `end` (put back after)."""
        start, stop = self.lo - len(prefix), self.lo + end
        saved = bytes(self.buf[stop : stop + len(suffix)])
        if len(saved) < len(suffix):  # no byte held there (the file's end): one copy
            with memoryview(b"".join((prefix, self.view(0, end), suffix))) as doc:
                yield doc
            return
        self.buf[start : self.lo] = prefix
        self.buf[stop : stop + len(suffix)] = suffix
        try:
            with memoryview(self.buf)[start : stop + len(suffix)] as doc:
                yield doc
        finally:
            self.buf[stop : stop + len(suffix)] = saved

    def release(self) -> None:
        """Hold nothing more."""
        self.buf, self.lo, self.hi = bytearray(self.ROOM), self.ROOM, self.ROOM

    def strip_leading(self) -> None:
        """Drop a UTF-8 byte-order mark and the whitespace before the document."""
        if self.view(0, 3) == b"\xef\xbb\xbf":
            self.drop(3)
        while True:
            self.drop(_LEADING_SPACE.match(self.view()).end())
            if self.size or self.eof:
                return
            self.fill(CHUNK_BYTES)

    def drop(self, n: int) -> None:
        self.lo += n
        self.consumed += n


class _Padding:
    """NUL bytes ending a file, left out of its document: a file whose writer's host crashed ends in
    zeros (the file system had grown it, the data never came), after a whole document or one cut short.
    Read without them, the document is what it is (whole, or cut short and read to its last event) and a
    warning counts them; read with them, it was "invalid JSON" at the first NUL."""

    MAX = 16 << 20
    """Longer runs of NULs are no padding but a hole (a sparse file): left in, they are refused at their
    first byte, without reading (or gunzipping) the rest (`tests/ingest/test_first_error.py`)."""

    def __init__(self) -> None:
        self.nuls = 0

    def end_of(self, mapped: mmap.mmap) -> int:
        """Where `mapped`'s document ends (its NUL bytes at the end counted); one byte looked at when the
        file ends in none, at most `MAX` when it ends in a hole."""
        end = len(mapped)
        while end and mapped[end - 1] == 0 and len(mapped) - end < self.MAX:
            start = max(0, end - CHUNK_BYTES, len(mapped) - self.MAX)
            kept = len(mapped[start:end].rstrip(b"\0"))
            end = start + kept
            if kept:
                break
        if end and mapped[end - 1] == 0:  # a hole, not padding
            return len(mapped)
        self.nuls = len(mapped) - end
        return end

    def held_back(self, blocks: Iterator[bytes]) -> Iterator[bytes]:
        """`blocks` with the NUL bytes that end them held back (and counted): a run of NULs is passed on
        only when a later byte is not one."""
        pending = 0
        for block in blocks:
            if not block:
                continue
            data = bytes(block).rstrip(b"\0") if block[-1:] == b"\0" else block
            if data:
                if pending:
                    yield bytes(pending)
                yield data
                pending = 0
            pending += len(block) - len(data)
            if pending > self.MAX:  # a hole: passed on, and the rest as it comes
                yield bytes(pending)
                yield from blocks
                return
        self.nuls = pending

    def warning(self) -> str:
        return f"{self.nuls:,} NUL bytes end the file (its writer's host crashed?): left out, read without them"


class _Mapped(_Buffer):
    """A file mapped copy-on-write, read as a `_Buffer`: bytes are held without a copy, and the pages
    below the cut are dropped as the pieces go (so the process never holds the whole file)."""

    def __init__(self, mapped: mmap.mmap, *, end: int | None = None) -> None:
        self.buf = mapped
        self.end = len(mapped) if end is None else end
        """Where the document ends: the file's end, less the NUL bytes padding it (`_Padding`)."""
        self.lo = self.hi = self.dropped = 0
        self.eof = False

    @property
    def consumed(self) -> int:
        return self.lo

    def rest(self) -> int | None:
        return self.end - self.lo

    def fill(self, size: int | None) -> None:
        end = self.end
        self.hi = end if size is None else min(end, max(self.hi, self.lo + size))
        self.eof = self.hi == end

    def drop(self, n: int) -> None:
        self.lo += n
        below = (self.lo - self.ROOM) // mmap.PAGESIZE * mmap.PAGESIZE  # `opened` writes just before `lo`
        if below - self.dropped >= CHUNK_BYTES and hasattr(mmap, "MADV_DONTNEED"):
            self.buf.madvise(mmap.MADV_DONTNEED, self.dropped, below - self.dropped)
            self.dropped = below

    def release(self) -> None:
        with suppress(BufferError):  # a view still alive: the mapping goes with it
            self.buf.close()


def _events_start(data: memoryview, is_array: bool) -> int | None:
    """Offset just after the `[` that opens the events (the first byte in Array form), or None if it
    cannot be found."""
    if is_array:
        return 1
    m = _EVENTS_KEY.search(data)
    return m.end() if m else None


def _decode_doc(
    doc: bytes,
    path: str,
    is_array: bool,
    warnings: list[str],
    skipped: dict[str, int],
    *,
    repair: bool,
    whole: bool = False,
    base: int = 0,
) -> tuple[list[_Event], dict[str, Any]]:
    """Events and top-level keys of one complete JSON document (the file, or a piece of it).

    `repair`: `doc` ends where the file ends, so a truncated end is repaired; otherwise msgspec's
    DecodeError propagates to the caller. `whole`: `doc` is the whole file, so an object without
    `traceEvents` is not a trace. `base`: the file offset of `doc`'s first byte (for the error's offset).
    """
    try:
        try:
            parsed = _decode_fast(doc, is_array)
        except msgspec.ValidationError:
            parsed = _decode_leniently(doc, path, is_array, skipped)
        except msgspec.DecodeError as e:
            if not repair:
                raise
            parsed = _decode_truncated(doc, path, is_array, str(e), warnings, skipped, base)
    except RecursionError:
        raise TraceError(path, "JSON nested too deeply to decode (an event's args go 1,000 levels deep)") from None
    events, top = (parsed, {}) if is_array else (parsed.traceEvents, _top_dict(parsed))
    if not is_array and doc.count(b'"traceEvents"') > 1 and len(_EVENTS_KEY.findall(doc)) > 1:
        # msgspec keeps the last of duplicate keys: the events of the other list would vanish uncounted
        # (the C scanner declines such a document, so every read of it comes here)
        raise TraceError(path, "`traceEvents` appears twice: which list holds the events is ambiguous")
    if whole and not is_array and not events and "traceEvents" not in _peek_keys(doc):
        raise NotATraceError(path, "not a trace: JSON object without a `traceEvents` list")
    return events, top


def _top_dict(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in _TOP_KEYS}


def _peek_keys(data: bytes) -> set[str]:
    try:
        loaded = orjson.loads(data)
    except orjson.JSONDecodeError:
        return set()
    return set(loaded) if isinstance(loaded, dict) else set()


_JSON_TYPES = {str: "a string", int: "a number", float: "a number", bool: "true or false", type(None): "null"}


def _decode_leniently(data: bytes, path: str, is_array: bool, skipped: dict[str, int]) -> Any:
    """Slow path for valid JSON with wrong-typed parts: keep each event that converts, count the rest."""
    try:
        loaded = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise TraceError(path, f"invalid JSON ({e})") from None
    if not is_array and not isinstance(loaded, dict):
        raise NotATraceError(path, f"not a trace: the JSON is {_JSON_TYPES[type(loaded)]}, not an object or an array")
    raw_events = loaded if is_array else loaded.get("traceEvents")
    if not isinstance(raw_events, list):
        raise NotATraceError(path, "not a trace: `traceEvents` is not a list")
    if is_array and raw_events and not any(isinstance(item, dict) for item in raw_events):
        raise NotATraceError(path, "not a trace: a JSON array without event objects")
    events = []
    bad = 0
    for item in raw_events:
        try:
            events.append(msgspec.convert(item, _Event))
        except msgspec.ValidationError:
            if isinstance(item, dict) and "args" in item:
                try:
                    events.append(msgspec.convert({k: v for k, v in item.items() if k != "args"}, _Event))
                    continue
                except msgspec.ValidationError:
                    pass
            bad += 1
    if bad:
        skipped["malformed"] = skipped.get("malformed", 0) + bad
    if is_array:
        return events
    rest = {k: v for k, v in loaded.items() if k in _TOP_KEYS}
    return _object_type(_Event)(traceEvents=events, **rest)


def _decode_truncated(
    data: bytes, path: str, is_array: bool, error: str, warnings: list[str], skipped: dict[str, int], base: int
) -> Any:
    """Read what is complete in a file cut short (the Chrome format allows a missing final `]`).

    Cuts after the last complete event and closes the brackets; what followed that cut is counted
    under "truncated". Only files that end early are repaired; other JSON errors are reported.
    """
    if "truncated" not in error.lower() and "trailing comma" not in error.lower():
        raise TraceError(path, _json_error(error, base, data))
    closing = b"]" if is_array else b"]}"
    end = len(data)
    for _ in range(64):
        cut = data.rfind(b"}", 0, end)
        if cut < 0:
            break
        try:
            parsed = _decode_fast(data[: cut + 1] + closing, is_array)
        except msgspec.ValidationError:
            parsed = _decode_leniently(data[: cut + 1] + closing, path, is_array, skipped)
        except msgspec.DecodeError:
            end = cut
            continue
        tail = data[cut + 1 :].translate(None, b" \t\r\n,]}")
        n_cut = 1 if tail else 0
        skipped["truncated"] = skipped.get("truncated", 0) + n_cut
        warnings.append(f"{ENDS_EARLY} ({error}); read the complete events, {n_cut} partial event cut")
        return parsed
    raise TraceError(path, f"{_json_error(error, base)}, and no complete event could be recovered")


def _exact_events(piece: bytes, is_array: bool, warnings: list[str]) -> list[Any] | None:
    """Re-read a piece with floats kept as decimal text, for epoch-µs floats with ns digits (the
    events with fields only, aligned with `_drop_counted`'s)."""
    try:
        reparsed = _decode_fast(piece, is_array, exact=True)
    except (msgspec.MsgspecError, RecursionError):
        warnings.append("timestamps kept at float64 precision (the exact re-read failed)")
        return None
    # the same events as the piece's frame: rows only, metadata (and a head piece's end marker) left out
    return [e for e in (reparsed if is_array else reparsed.traceEvents) if type(e) in _ROW_TYPES and e.phase != "M"]


def _exact_ns(values: list[Any]) -> pl.Series:
    """Decimal/int µs values (from the exact re-read) to integer ns, rounding half up."""
    out: list[int | None] = []
    for v in values:
        if isinstance(v, Decimal) and v.is_finite():
            ns = int((v * 1000).to_integral_value())
        elif type(v) is int:
            ns = v * 1000
        else:
            ns = None
        out.append(ns if ns is not None and -MAX_NS <= ns <= MAX_NS else None)
    return pl.Series(out, dtype=pl.Int64)


def _us_to_ns(s: pl.Series) -> pl.Series:
    """µs floats to integer ns without float64 loss for values below 2**43 µs.

    Integer part and fraction are converted separately: floor() and the subtraction are exact in
    float64, so only the fraction (< 1 µs) is scaled and rounded.
    """
    s = s.set(s.is_nan() | (s.abs() > MAX_NS / 1000), None)  # out of range: null, counted as malformed
    whole = s.floor()
    frac_ns = ((s - whole) * 1000.0).round(0)
    return (whole.cast(pl.Int64, strict=False) * 1000 + frac_ns.cast(pl.Int64, strict=False)).rename("")


_NUMBER = (int, float)
"""The types a JSON number decodes to (`bool` is not one of them: `type(True) is bool`)."""


def _texts(values: list[Any]) -> pl.Series:
    """A field that should hold strings, as strings: a number or other JSON value as its text (polars'
    non-strict cast). A list mixing kinds (`[[], 1e308, {}]`), which that cast refuses with a TypeError,
    is written as its JSON (found by the fuzz campaign: an internal error where a phase was such a list)."""
    try:
        return pl.Series(values, dtype=pl.String, strict=False)
    except TypeError:
        return pl.Series([v if v is None or type(v) is str else _json_text(v) for v in values], dtype=pl.String)


def _json_text(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # an integer past 64 bits
        return str(value)


def _piece_frame(
    events: list[_Event], offset: int, piece: bytes, is_array: bool, warnings: list[str]
) -> tuple[pl.DataFrame, list[_Args]]:
    """The base columns of a piece's events (`order` numbered from `offset`), and their args."""
    # a JSON number only: `true`, `false` or "30" are no time (a boolean would read as 1 or 0 µs), so the
    # row is malformed, dropped and counted as such (`schema.conform`)
    ts = [e.ts if type(e.ts) in _NUMBER else None for e in events]
    ts_us = pl.Series(ts, dtype=pl.Float64, strict=False)
    dur_us = pl.Series([e.dur if type(e.dur) in _NUMBER else None for e in events], dtype=pl.Float64, strict=False)
    exact = None
    # a decimal point in a large time (even one whose float64 is a whole number): re-read the digits
    if any(type(v) is float and abs(v) >= _EXACT_LIMIT_US for v in ts):
        exact = _exact_events(piece, is_array, warnings)
        if exact is not None and len(exact) != len(events):
            exact = None  # a repaired (truncated) piece: keep float precision rather than misalign
            warnings.append("timestamps kept at float64 precision (file cut short)")
    pid = [e.pid for e in events]
    pid_int = _int_series(pid)
    args = [e.args for e in events]
    frame = pl.DataFrame(
        {
            "ph": _texts([e.phase for e in events]),
            "cat": _texts([e.cat for e in events]).cast(pl.Categorical),
            "name": _texts([e.name for e in events]).cast(pl.Categorical),
            "pid": pid_int,
            "tid": _tid_series([e.tid for e in events]),
            "pid_str": pl.Series([p if type(p) is str else None for p in pid], dtype=pl.String)
            if pid_int.null_count()
            else pl.repeat(None, len(pid), dtype=pl.String, eager=True),
            "ts": _us_to_ns(ts_us) if exact is None else _exact_ns(list(map(attrgetter("ts"), exact))),
            "dur": _us_to_ns(dur_us) if exact is None else _exact_ns(list(map(attrgetter("dur"), exact))),
            "order": pl.int_range(offset, offset + len(events), eager=True, dtype=pl.Int64),
            "a_external_id": _int_series([a.external_id for a in args]),
            "a_correlation": _int_series([a.correlation for a in args]),
        }
    )
    return frame.shrink_to_fit(in_place=False), args


_COLL_FIELDS = (
    "coll_name",
    "in_nelems",
    "out_nelems",
    "dtype",
    "group_size",
    "pg_name",
    "pg_id",
    "seq",
    "src_rank",
    "dst_rank",
    "input_dims",
    "input_type",
    "concrete_inputs",
)
_NO_CAT = pl.col("cat").is_null()  # tiers are taken from rows that are not `M` metadata
_DEVICE_CAT = pl.any_horizontal([pl.col("cat") == c for c in DEVICE_CATS])
"""`cat.is_in(DEVICE_CATS)` (null where `cat` is): a few comparisons of short strings cost 40% less than
a hash lookup of every row's `cat`."""
_DEVICE_RULE = _DEVICE_CAT | _NO_CAT
_ARG_TIERS: tuple[tuple[pl.Expr | str, tuple[str, ...]], ...] = (
    (_DEVICE_RULE, ("device", "stream", "nbytes")),
    # collective rows, and the matrix products whose shapes calibrate the model: a pattern of the name
    (COLLECTIVE_ROW + r"|^aten::(?:mm|addmm|bmm|baddbmm|_scaled_mm)$|" + SEQUENCE_INPUT_OP, _COLL_FIELDS),
    (_NO_CAT, ("label", "step_num", "device_ordinal", "hlo_op", "hlo_module", "run_id")),
)
"""Which rows can carry which less common args: device rows, collectives (and the GEMM ops, whose recorded
`Input Dims` `tracediag calibrate` reads, and the embedding lookups whose token ids give the sequences:
`vocab.SEQUENCE_INPUT_OP`), rows without `cat` (JAX). A rule is a row mask, or (a str) a pattern of the
name: see `_tier_masks`. Reading every field of every event would cost more than the JSON decode itself."""


def _tier_masks(frame: pl.DataFrame, names: pl.Series | None = None) -> list[pl.Expr]:
    """The `_ARG_TIERS` row masks for `frame` (its `name` Categorical). A name pattern is matched once per
    distinct name and becomes a membership test: 50k rows hold a few hundred names, and a regex search
    per row cost 3% of the decode. `names`: strings among which are all of `frame`'s names (the
    scanner's, `native.Scanner.strings`); by default the frame's distinct names."""
    masks: list[pl.Expr] = []
    for rule, _ in _ARG_TIERS:
        if isinstance(rule, str):
            names = distinct_names(frame) if names is None else names
            rule = name_matches(names, rule)
        elif rule is _DEVICE_RULE:
            rule = _device_rule(frame.get_column("cat").unique().drop_nulls() if names is None else names)
        masks.append(rule)
    return masks


def _device_rule(strings: pl.Series) -> pl.Expr:
    """The device tier's mask where `strings` (a superset of the categories) hold a device category
    spelled otherwise (the 2021 layout's `Kernel`, `Memcpy`, `Memset`: `vocab.canonical_category`): those
    spellings are compared too. A file of today's spellings keeps the plain comparisons."""
    s = pl.col("s")
    other = (
        pl.DataFrame({"s": strings.cast(pl.String)})
        .filter(category(s).is_in(DEVICE_CATS) & ~s.is_in(DEVICE_CATS))
        .get_column("s")
    )
    if other.is_empty():
        return _DEVICE_RULE
    return _DEVICE_RULE | pl.any_horizontal([pl.col("cat") == c for c in other.unique().sort().to_list()])


class _RareArgs:
    """Collects, piece by piece, each tier's fields on that tier's rows (as columns, so no piece's
    bytes or structs stay alive), and joins them into one frame per tier at the end."""

    def __init__(self) -> None:
        self.parts: list[list[pl.DataFrame]] = [[] for _ in _ARG_TIERS]

    def add(self, base: pl.DataFrame, args: list[_Args], offset: int) -> None:
        """A msgspec-decoded piece: `base` and the structs of its rows' args."""
        masks = base.select(pl.arg_where(mask).implode().alias(str(i)) for i, mask in enumerate(_tier_masks(base)))
        for i, (_, fields) in enumerate(_ARG_TIERS):
            local = [r for r in masks[str(i)][0].to_list() if args[r] is not _NO_ARGS]
            picked = [args[r] for r in local]
            columns = [pl.Series("order", [offset + r for r in local], dtype=pl.Int64)]
            for fname in fields:
                values = map(attrgetter(fname), picked)
                if fname in native.RAW_FIELDS:
                    values = (bytes(v) or None for v in values)
                columns.append(_arg_series(fname, list(values)).alias(f"a_{fname}"))
            self.parts[i].append(pl.DataFrame(columns))

    def add_frames(self, frames: list[pl.DataFrame]) -> None:
        """Scanned rows' args: one frame per tier, `order` and its `a_<field>` columns."""
        for parts, frame in zip(self.parts, frames):
            parts.append(frame)

    def frames(self) -> tuple[pl.DataFrame, ...]:
        empty = [
            pl.DataFrame([pl.Series("order", [], dtype=pl.Int64), *(_arg_series(f, []).alias(f"a_{f}") for f in fs)])
            for _, fs in _ARG_TIERS
        ]
        return tuple(pl.concat([e, *parts]) for e, parts in zip(empty, self.parts))


def _int_series(values: list[Any]) -> pl.Series:
    """Integer ids; other values (Kineto's string pids such as "Spans") become null."""
    try:
        return pl.Series(values, dtype=pl.Int64)  # the decoder admits only ints, strings and nulls
    except (TypeError, OverflowError):
        return pl.Series([v if type(v) is int and -(2**63) <= v < 2**63 else None for v in values], dtype=pl.Int64)


def _tid_series(values: list[Any]) -> pl.Series:
    """Thread ids: integers, and strings of 1 to 18 decimal digits as their integer (the 2021 Kineto
    layout writes `"tid": "25738"`); other strings (`"stream 7"`: the stream is in `args`) null."""
    if any(type(v) is str for v in values):
        values = [int(v) if type(v) is str and 0 < len(v) <= 18 and v.isascii() and v.isdigit() else v for v in values]
    return _int_series(values)


def _arg_series(fname: str, values: list[Any]) -> pl.Series:
    if fname in native.RAW_FIELDS:
        return pl.Series(values, dtype=pl.Binary)
    if fname in ("coll_name", "dtype", "label", "labels", "pg_name", "step_num", "hlo_op", "hlo_module", "run_id"):
        return pl.Series([v if v is None or type(v) is str else str(v) for v in values], dtype=pl.String)
    return pl.Series(values, dtype=pl.Int64, strict=False)


def _all_complete(frame: pl.DataFrame) -> bool:
    """Whether every row is a complete (X) event: the common case, told by one pass over `ph`
    (counting the phases by a group-by costs several times as much)."""
    return frame.select(pl.col("ph").eq_missing("X").all()).item()


def _slices_from(
    frame: pl.DataFrame,
    skipped: dict[str, int] | None = None,
    warnings: list[str] | None = None,
    *,
    all_complete: bool | None = None,
    n_bad: int | None = None,
) -> pl.DataFrame:
    """Complete (X) events plus B/E pairs matched per (pid, tid) stack; bad ones counted.

    `all_complete`: `_all_complete(frame)`, and (only where it is true) `n_bad`: the rows of `frame` without
    a usable time, when the caller has them already."""
    if frame.height == 0 or "ts" not in frame.columns:
        return frame.clear() if frame.height else frame
    skipped = skipped if skipped is not None else {}
    if all_complete is None:
        all_complete = _all_complete(frame)
    complete = frame if all_complete else frame.filter(pl.col("ph") == "X")  # no copy in the common case
    has_pairs = frame.height > complete.height and frame.select(pl.col("ph").is_in(["B", "E"]).any()).item()
    if has_pairs:
        begin_end = frame.filter(pl.col("ph").is_in(["B", "E"]))
        matched, unmatched_end, open_begin = _pair_begin_end(begin_end, frame["ts"].max())
        complete = pl.concat([complete, matched], how="vertical_relaxed")
        if unmatched_end:
            skipped["unmatched_end"] = skipped.get("unmatched_end", 0) + unmatched_end
        paired_end = begin_end.filter(pl.col("ph") == "E").height - unmatched_end
        if paired_end:
            skipped["paired_end"] = skipped.get("paired_end", 0) + paired_end
        if open_begin and warnings is not None:
            warnings.append(f"{open_begin} B events never ended; clipped to the trace end")
        complete = complete.sort("order")
    if n_bad is None or has_pairs or complete is not frame:
        n_bad = complete.select(_BAD_SLICE.sum()).item()
    if n_bad:
        skipped["malformed"] = skipped.get("malformed", 0) + n_bad
        complete = complete.filter(~_BAD_SLICE)
    return complete


_BAD_SLICE = pl.col("ts").is_null() | pl.col("dur").is_null() | (pl.col("dur") < 0)
"""A slice without a usable time (counted as malformed)."""


def _pair_begin_end(be: pl.DataFrame, trace_end: int | None) -> tuple[pl.DataFrame, int, int]:
    """Match B/E events as a stack per (pid, tid): an E closes the most recent open B.

    Kineto and JAX write only X events, so this runs over the (rare) B/E rows alone, with a
    plain stack. Returns the slices (B's fields, E's ts as end; open Bs clipped to the trace end),
    the number of Es that closed nothing (E rows with a B count as part of their slice), and the
    number of open Bs.
    """
    be = be.sort("order")
    keys = zip(be["pid"].to_list(), be["pid_str"].to_list(), be["tid"].to_list())
    stacks: dict[tuple, list[int]] = {}
    ends: dict[int, int | None] = {}
    unmatched = 0
    for i, (key, ph, ts) in enumerate(zip(keys, be["ph"].to_list(), be["ts"].to_list())):
        stack = stacks.setdefault(key, [])
        if ph == "B":
            stack.append(i)
            ends[i] = None
        elif stack:
            ends[stack.pop()] = ts
        else:
            unmatched += 1
    rows = list(ends)
    end_ts = pl.Series([ends[i] for i in rows], dtype=pl.Int64)
    open_begin = end_ts.null_count()
    matched = be[rows].with_columns(ph=pl.lit("X"), dur=end_ts.fill_null(trace_end) - pl.col("ts"))
    return matched, unmatched, open_begin

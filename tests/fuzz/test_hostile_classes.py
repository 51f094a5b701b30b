"""Hand-made classes of hostile input, each a real fixture mutated one way: other compressions and
encodings under a trace's name, two `traceEvents` lists, entries of a run folder that are no regular
file, a rank its own world size contradicts, a step marker of no length, a trace holding its events
twice, an Nsight column of the wrong type or a write-ahead log not merged, an op-timeline table with a
byte-order mark, Flight Recorder dumps in an older pickle protocol, with a byte-order mark or with their
entries twice, a trace padded with NUL bytes, an empty file or a broken link in a watched folder. (The
seeded fuzzer, `cases` and `mutate`, generates some of them too since they were found.)

Each class goes through the CLI (exit 0, or exit 2 with one line naming the file and the problem; never a
traceback) and through the Python API (a `TracediagError`, or the file's line in `run.meta.errors`; never
a KeyError or a polars exception), and the test asserts what it read or the problem it named.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import json
import lzma
import os
import pickle
import re
import shutil
import sqlite3
import struct
from pathlib import Path

import polars as pl
import pytest
from conftest import invoke_hostile, time_limit

import tracediag
from tracediag.errors import RankError, TracediagError, TraceError, shown
from tracediag.ingest import frscan, native
from tracediag.ingest.flight import read_dumps
from tracediag.ingest.read import read_file

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
GLOO0, GLOO1 = (FIXTURES / "kineto" / f"gen_torch2.13cpu_gloo_2rank_rank{r}.pt.trace.json.gz" for r in (0, 1))
NSYS1 = FIXTURES / "nsys" / "constructed_gpu_rank1.sqlite.gz"
HANG = FIXTURES / "hang" / "healthy"
HANG_JSON = FIXTURES / "hang" / "host_stuck_json"
ROWS = 433
"""Duration events of rank 1's gloo trace: the rows it gives read intact."""


def _invoke(args: list) -> tuple[int, str, str]:
    return invoke_hostile(args, 60)


def _refused(args: list, target: Path, problem: str, code: int = 2) -> None:
    """Exit `code` (2; 0 where --allow-missing lets a command go on with the files that were read), and the
    only error line names `target` and says `problem`."""
    exit_code, _, err = _invoke(args)
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert exit_code == code, err
    assert len(errors) == 1, err
    assert shown(target) in errors[0], errors[0]
    assert problem in errors[0], errors[0]


def _doc() -> dict:
    return json.loads(gzip.decompress(GLOO1.read_bytes()))


def _run(tmp_path: Path, name: str, data: bytes) -> tuple[Path, Path]:
    """A run folder: rank 0's real trace and `data` as rank 1's file `name`."""
    shutil.copy(GLOO0, tmp_path / GLOO0.name)
    (tmp_path / name).write_bytes(data)
    return tmp_path, tmp_path / name


def _plain() -> bytes:
    return gzip.decompress(GLOO1.read_bytes())


def _with_rank(rank: object) -> bytes:
    doc = _doc()
    doc["distributedInfo"]["rank"] = rank
    return json.dumps(doc).encode()


# ---------------------------------------------------------------------------------- refused, by content

REFUSED = {
    "utf16_bom": ("rank1.json", lambda: _plain().decode().encode("utf-16"), "the file is UTF-16 text"),
    "utf16_no_bom": ("rank1.json", lambda: _plain().decode().encode("utf-16-le"), "the file is UTF-16 text"),
    "bz2_named_json": ("rank1.json", lambda: bz2.compress(_plain()), "the file is bzip2-compressed"),
    "xz_named_json": ("rank1.json", lambda: lzma.compress(_plain()), "the file is xz-compressed"),
    "zstd_named_gz": ("rank1.json.gz", lambda: b"\x28\xb5\x2f\xfd" + _plain()[:512], "the file is zstd-compressed"),
    "gzip_of_gzip": ("rank1.json.gz", lambda: gzip.compress(GLOO1.read_bytes()), "the file is gzipped twice"),
    "gzip_claims_2gb": ("rank1.json.gz", lambda: GLOO1.read_bytes()[:-4] + struct.pack("<I", 2**31), "corrupt gzip"),
    "nan_literal": ("rank1.json", lambda: _plain().replace(b'"ts": ', b'"ts": NaN, "x": ', 1), "invalid JSON"),
    "past_double": ("rank1.json", lambda: _plain().replace(b'"dur": ', b'"dur": 1e400, "x": ', 1), "invalid JSON"),
    "nested_10000": (
        "rank1.json",
        lambda: _plain().replace(b'"args": {', b'"args": {"deep": ' + b"[" * 10000 + b"]" * 10000 + b", ", 1),
        "nested too deeply",
    ),
    "events_an_object": (
        "rank1.json",
        lambda: json.dumps({**_doc(), "traceEvents": {"0": {"ph": "X"}}}).encode(),
        "`traceEvents` is not a list",
    ),
    "events_twice_last_empty": (  # read alone the last list won (no event, none counted); in a batch the first
        "rank1.json",
        lambda: _plain().rstrip().removesuffix(b"}") + b', "traceEvents": []}',
        "`traceEvents` appears twice",
    ),
    "events_twice": (
        "rank1.json",
        lambda: (
            _plain().rstrip().removesuffix(b"}")
            + b', "traceEvents": '
            + json.dumps(_doc()["traceEvents"][:9]).encode()
            + b"}"
        ),
        "`traceEvents` appears twice",
    ),
    "two_documents": ("rank1.json", lambda: _plain() + b"\n" + _plain(), "trailing characters"),
    "rank_past_world": ("rank1.json", lambda: _with_rank(7), "rank 7 is not below the world size 2"),
    "rank_not_integer": ("rank1.json", lambda: _with_rank(1.5), "distributedInfo.rank is 1.5, not an integer"),
    "empty": ("rank1.json.gz", lambda: gzip.compress(b""), "empty file"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_hostile_content_is_one_line_naming_file_and_problem(tmp_path, case):
    name, make, problem = REFUSED[case]
    folder, bad = _run(tmp_path, name, make())
    _refused(["ingest", folder / GLOO0.name, bad, "-o", tmp_path / "o.parquet"], bad, problem)
    run = tracediag.load([folder / GLOO0.name, bad])  # the other rank is still read
    assert run.meta.ranks == [0]
    assert [e for e in run.meta.errors if problem in e and shown(bad) in e], run.meta.errors
    if case == "rank_not_integer":  # a file alone is rank 0 (with a warning), whatever it says
        assert tracediag.load(bad).meta.ranks == [0]
        return
    with pytest.raises(TracediagError, match=re.escape(problem)):
        tracediag.load(bad)


def test_rank_past_world_is_refused_by_every_command_but_a_given_rank_overrides(tmp_path):
    (tmp_path / "run").mkdir()
    folder, bad = _run(tmp_path / "run", "rank1.json", _with_rank(7))
    problem = "rank 7 is not below the world size 2"
    # analyze, export and compare go on with the ranks that were read, after the line naming the file, and
    # exit 2 (0 with --allow-missing)
    _refused(["analyze", folder], bad, problem)
    _refused(["analyze", folder, "--allow-missing"], bad, problem, code=0)
    _refused(["export", folder, "-o", tmp_path / "x.trace.json"], bad, problem)
    base = tmp_path / "base"
    base.mkdir()
    for p in (GLOO0, GLOO1):
        shutil.copy(p, base / p.name)
    _refused(["compare", base, folder], bad, problem)
    run = tracediag.load(folder, rank_map={bad.name: 1})
    assert run.meta.ranks == [0, 1]
    assert run.meta.world_size == 2


def test_a_rank_given_for_no_input_file_is_one_line_not_ignored(tmp_path):
    """`--rank ./rank1.json=1` for an input given as `rank1.json` (or a typo) was ignored: the file kept
    its own rank, or, naming none, stopped the run with advice to pass the very option given."""
    folder, bad = _run(tmp_path, "rank1.json", _plain())
    typo = Path("rank_1.json")
    _refused(["ingest", folder, "--rank", f"{typo}=1"], typo, "--rank rank_1.json=1: no input file has this path")
    with pytest.raises(RankError, match="no input file has this path or base name"):
        tracediag.load(folder, rank_map={"rank_1.json": 1})
    assert tracediag.load(folder, rank_map={bad.name: 3}).meta.ranks == [0, 3]


# ------------------------------------------------------------------ read, with every event accounted for


def _dup_phase() -> bytes:
    return _plain().replace(b'"ph": "X"', b'"ph": "X", "ph": "Q"', 5)  # the last of duplicate keys wins


def _strings_for_ts() -> bytes:
    doc = _doc()
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] = str(e["ts"])
    return json.dumps(doc).encode()


def _reversed_steps() -> bytes:
    doc = _doc()
    for e in doc["traceEvents"]:
        if e.get("name", "").startswith("ProfilerStep"):
            e["dur"] = -e["dur"]
    return json.dumps(doc).encode()


READ = {
    "bom": ("rank1.json", lambda: b"\xef\xbb\xbf" + _plain(), ROWS, {}),
    "plain_named_gz": ("rank1.json.gz", _plain, ROWS, {}),
    "gzip_named_json": ("rank1.json", GLOO1.read_bytes, ROWS, {}),
    "gzip_two_members": (
        "rank1.json.gz",
        lambda: gzip.compress(_plain()[:50_000]) + gzip.compress(_plain()[50_000:]),
        ROWS,
        {},
    ),
    "duplicate_keys": ("rank1.json", _dup_phase, ROWS - 5, {"other_phase": 5}),
    "ts_as_strings": ("rank1.json", _strings_for_ts, 0, {"malformed": ROWS}),
    "negative_step_durations": ("rank1.json", _reversed_steps, ROWS - 2, {"malformed": 2}),
}


@pytest.mark.parametrize("case", sorted(READ))
def test_hostile_content_that_is_read_counts_what_it_skips(tmp_path, case):
    name, make, rows, extra = READ[case]
    folder, bad = _run(tmp_path, name, make())
    code, out, err = _invoke(["ingest", folder, "-o", tmp_path / "o.parquet"])
    assert code == 0, err
    assert "ranks   2 (0, 1)" in out
    trace = tracediag.load(bad)
    skipped = {k: v for k, v in trace.meta.skipped.items() if k in extra}
    assert (trace.events.height, skipped) == (rows, extra)
    assert trace.events.height + sum(trace.meta.skipped.values()) == trace.meta.events_in


# ------------------------------------------------------------------------- a run folder's odd entries


def _loop(link: Path) -> None:
    link.symlink_to(link.name)  # points at itself


def _dangling(link: Path) -> None:
    link.symlink_to("rank9.pt.trace.json.gz")


ENTRIES = {
    "symlink_loop": (_loop, "Too many levels of symbolic links"),
    "dangling_symlink": (_dangling, "No such file or directory"),
    "fifo_without_writer": (os.mkfifo, "empty file"),
}


@pytest.mark.parametrize("case", sorted(ENTRIES))
def test_an_entry_named_like_a_trace_that_is_no_file_is_named_not_dropped(tmp_path, case):
    make, problem = ENTRIES[case]
    for p in (GLOO0, GLOO1):
        shutil.copy(p, tmp_path / p.name)
    odd = tmp_path / "rank2.pt.trace.json.gz"
    make(odd)
    _refused(["ingest", tmp_path, "-o", tmp_path.parent / f"{case}.parquet"], odd, problem)
    with time_limit(60):
        run = tracediag.load(tmp_path)
    assert run.meta.ranks == [0, 1]
    assert [e for e in run.meta.errors if shown(odd) in e and problem in e], run.meta.errors


def test_a_directory_named_like_a_trace_is_searched_not_read(tmp_path):
    (tmp_path / "rank1.json").mkdir()
    shutil.copy(GLOO1, tmp_path / "rank1.json" / GLOO1.name)
    shutil.copy(GLOO0, tmp_path / GLOO0.name)
    run = tracediag.load(tmp_path)
    assert (run.meta.ranks, run.meta.errors) == ([0, 1], ())


# ------------------------------------------------------------------------------------------ step markers


def test_a_step_marker_of_no_length_is_no_step(tmp_path):
    """Rank 1's ProfilerStep#2 cut to 0 us: not a step in which rank 1 computed nothing (which hid that
    rank 1 is the straggler of step 2), but a step it has no marker for, left out and said so."""
    doc = _doc()
    next(e for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#2")["dur"] = 0
    folder, _ = _run(tmp_path, "rank1.json", json.dumps(doc).encode())
    code, out, err = _invoke(["analyze", folder, "--format", "json"])
    assert code == 0, err
    analysis = json.loads(out)
    assert sorted({s["step"] for s in analysis["steps"]}) == [3]
    assert "1 rank-step of steps not recorded on every rank left out" in analysis["warnings"]


# ------------------------------------------------------------------------------ Nsight, FR dumps, watch


def test_nsight_text_in_an_integer_column_names_the_table(tmp_path):
    db = tmp_path / "rank1.sqlite"
    db.write_bytes(gzip.decompress(NSYS1.read_bytes()))
    with contextlib.closing(sqlite3.connect(db)) as con:
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE rowid % 3 = 0")
        con.commit()
    problem = 'CUPTI_ACTIVITY_KIND_KERNEL holds "soon" (str) where a number goes'
    _refused(["ingest", db], db, problem)
    with pytest.raises(TracediagError, match=re.escape(problem)):
        tracediag.load(db)


@pytest.mark.parametrize("packed", [False, True])
def test_op_timeline_json_lines_with_a_byte_order_mark_reads_as_without(tmp_path, packed):
    """The JSON Lines reader of polars failed on the mark ("InternalError(TapeError) at character 0")."""
    source = FIXTURES / "timeline" / "straggler_persistent.jsonl.gz"
    data = b"\xef\xbb\xbf" + gzip.decompress(source.read_bytes())
    path = tmp_path / ("t.jsonl.gz" if packed else "t.jsonl")
    path.write_bytes(gzip.compress(data) if packed else data)
    expected = tracediag.load(source)
    run = tracediag.load(path)
    assert run.meta.ranks == expected.meta.ranks == [0, 1, 2, 3]
    assert run.events.equals(expected.events)


def test_nsight_export_with_an_unmerged_write_ahead_log_is_refused_not_read_stale(tmp_path):
    """The export is read `immutable` (no lock): with a writer's changes still in `-wal` it read the rows
    the changes had deleted (12 kernels where SQLite sees 6), without a word."""
    db = tmp_path / "rank1.sqlite"
    db.write_bytes(gzip.decompress(NSYS1.read_bytes()))
    con = sqlite3.connect(db)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA wal_autocheckpoint=0")
        con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid % 2 = 0")
        con.commit()
        assert (tmp_path / "rank1.sqlite-wal").stat().st_size > 0
        _refused(["ingest", db], db, "its write-ahead log rank1.sqlite-wal")
    finally:
        con.close()  # the last connection merges the log into the file and removes it
    kinds = tracediag.load(db).events["kind"].cast(pl.String).value_counts()
    assert dict(kinds.iter_rows()).get("kernel", 0) + dict(kinds.iter_rows()).get("comm", 0) == 6


@pytest.mark.parametrize("name", ["gen_jax0.10.2_cpu2dev.xplane.pb.gz", "host.xplane.pb"])
def test_a_jax_xplane_named_alone_says_which_file_to_pass(tmp_path, name):
    source = FIXTURES / "jax" / "gen_jax0.10.2_cpu2dev.xplane.pb.gz"
    path = tmp_path / name
    path.write_bytes(source.read_bytes() if name.endswith(".gz") else gzip.decompress(source.read_bytes()))
    problem = "an xplane.pb is read only beside its JSON trace: pass the <host>.trace.json.gz of its folder"
    _refused(["ingest", path], path, problem)
    with pytest.raises(TracediagError, match=re.escape(problem)):
        tracediag.load(path)


def _dumps(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name != "manifest.json")


@pytest.mark.parametrize("protocol", [0, 1])
def test_flight_recorder_dump_of_an_old_pickle_protocol_reads_as_protocol_2(tmp_path, protocol):
    folder = tmp_path / "dumps"
    shutil.copytree(HANG, folder)
    dump = folder / "nccl_trace_rank_1"
    dump.write_bytes(pickle.dumps(pickle.loads(dump.read_bytes()), protocol=protocol))
    expected = _invoke(["hang", *_dumps(HANG), "--format", "json"])
    assert _invoke(["hang", *_dumps(folder), "--format", "json"]) == expected
    assert expected[0] == 0


def test_flight_recorder_json_with_a_byte_order_mark_reads_as_without(tmp_path):
    folder = tmp_path / "dumps"
    shutil.copytree(HANG_JSON, folder)
    dump = folder / "fr_trace_rank_1.json"
    dump.write_bytes(b"\xef\xbb\xbf" + dump.read_bytes())
    expected = _invoke(["hang", *_dumps(HANG_JSON), "--format", "json"])
    assert _invoke(["hang", *_dumps(folder), "--format", "json"]) == expected
    assert expected[0] == 3  # the fixture's hang is found


def test_flight_recorder_pickle_calling_a_function_is_refused(tmp_path):
    class Calls:
        def __reduce__(self):
            return (os.system, ("true",))

    folder = tmp_path / "dumps"
    shutil.copytree(HANG, folder)
    dump = folder / "nccl_trace_rank_1"
    dump.write_bytes(pickle.dumps({**pickle.loads(dump.read_bytes()), "x": Calls()}, protocol=2))
    _refused(["hang", *_dumps(folder)], dump, "refused pickle: it names posix.system (not run)")


def test_watch_once_ends_on_an_empty_file_and_names_every_odd_entry(tmp_path):
    """An empty file named like a trace once held `watch --once` open for ever (it counted as still being
    written); now it waits like a file cut short and is left out with one warning. Links that lead
    nowhere were dropped unsaid (their stat failed); now each is named."""
    for p in (GLOO0, GLOO1):
        shutil.copy(p, tmp_path / p.name)
    empty, loop, dangling = tmp_path / "rank2.json", tmp_path / "rank3.json", tmp_path / "rank4.json.gz"
    empty.touch()
    _loop(loop)
    _dangling(dangling)
    code, out, err = _invoke(["watch", tmp_path, "--once", "--poll", "0.2"])
    assert code == 0, err
    assert "window 1 (steps 2-3" in out
    assert f"warning: {shown(empty)}: empty file" in err
    assert f"warning: {shown(loop)}: cannot read file (Too many levels of symbolic links)" in err
    assert f"warning: {shown(dangling)}: cannot read file (No such file or directory)" in err


# ------------------------------------------------------------------------------- a file's events twice


def _twice(doc: dict) -> bytes:
    return json.dumps({**doc, "traceEvents": doc["traceEvents"] * 2}).encode()


@pytest.mark.parametrize("scanner", [True, False], ids=["C scanner", "msgspec"])
def test_a_trace_holding_its_events_twice_is_refused_on_both_paths(tmp_path, monkeypatch, scanner):
    """Rank 1's gloo trace with its event list twice over (a merge that took the file twice) was read
    whole: its 433 operators and collectives counted double, the analysis changed its verdict (comm_bound
    first) and said nothing. Real traces repeat at most 5.8% of their rows exactly (`ingest.twice`)."""
    if not scanner:
        monkeypatch.setattr(native, "_chromescan", None)
    folder, bad = _run(tmp_path, "rank1.json", _twice(_doc()))
    problem = f"{2 * ROWS:,} of its {2 * ROWS:,} events repeat another exactly"
    _refused(["analyze", folder], bad, problem)  # rank 0 analysed alone after the line, as any bad file
    _refused(["ingest", folder, "-o", tmp_path / "o.parquet"], bad, "the file holds its events twice")
    with pytest.raises(TracediagError, match=problem):
        tracediag.load(bad)
    with pytest.raises(TraceError, match=problem):  # the path of a file read alone (larger than a batch's)
        read_file(bad)
    bad.write_bytes(_plain())  # the trace once, as it was, reads its rows
    assert tracediag.load(bad).events.height == ROWS


def test_a_jax_trace_holding_its_events_twice_is_refused(tmp_path):
    source = FIXTURES / "jax" / "gen_jax0.10.2_cpu2dev.trace.json.gz"
    doc = json.loads(gzip.decompress(source.read_bytes()))
    shutil.copy(source.with_name(source.name.replace(".trace.json.gz", ".xplane.pb.gz")), tmp_path)
    once = tracediag.load(source).events.height
    bad = tmp_path / source.name.removesuffix(".gz")
    bad.write_bytes(_twice(doc))
    _refused(["ingest", bad, "-o", tmp_path / "o.parquet"], bad, f"of its {2 * once:,} events repeat another")


def _without_skipped(text: str) -> dict:
    doc = json.loads(text)
    doc.pop("skipped", None)
    return doc


@pytest.mark.parametrize(
    ("source", "dump", "c_scanner"),
    [(HANG, "nccl_trace_rank_1", True), (HANG, "nccl_trace_rank_1", False), (HANG_JSON, "fr_trace_rank_0.json", False)],
    ids=["pickle, C scanner", "pickle, unpickler", "json"],
)
def test_flight_recorder_entries_written_twice_are_read_once_and_counted(
    tmp_path, monkeypatch, source, dump, c_scanner
):
    """host_stuck_json's rank 0 with its entries listed twice was read as it was: the hang was found, but its
    hint said rank 0 "enqueued 32 all_reduce where the others enqueued 16". The recorder numbers each entry
    once (`record_id`): a repeat is read once and counted, and the report is the undamaged dumps'."""
    if not c_scanner:
        monkeypatch.setattr(frscan, "_frscan", None)
    folder = tmp_path / "dumps"
    shutil.copytree(source, folder)
    path = folder / dump
    if path.suffix == ".json":
        doc = json.loads(path.read_bytes())
        path.write_bytes(json.dumps({**doc, "entries": doc["entries"] * 2}).encode())
    else:
        doc = pickle.loads(path.read_bytes())
        path.write_bytes(pickle.dumps({**doc, "entries": doc["entries"] * 2}, protocol=2))
    entries = len(doc["entries"])
    code, out, _ = _invoke(["hang", *_dumps(folder), "--format", "json"])
    expected_code, expected, _ = _invoke(["hang", *_dumps(source), "--format", "json"])
    assert (code, _without_skipped(out)) == (expected_code, _without_skipped(expected))
    assert json.loads(out)["skipped"] == {
        "entry repeating the record_id of an earlier one of its rank (the first kept)": entries
    }
    dumps = read_dumps([str(p) for p in _dumps(folder)])
    assert dumps.entries.height == read_dumps([str(p) for p in _dumps(source)]).entries.height


# ------------------------------------------------------------------------------- a file padded with NULs


@pytest.mark.parametrize("scanner", [True, False], ids=["C scanner", "msgspec"])
@pytest.mark.parametrize("packed", [False, True], ids=["mapped", "gzipped"])
def test_a_trace_padded_with_nul_bytes_reads_as_without_them(tmp_path, monkeypatch, scanner, packed):
    """A trace whose writer's host crashed ends in zeros (the file system grew the file, the data never
    came). Whole or cut short, it was "invalid JSON ... (trailing characters)" at the first NUL; now it is
    read as the same trace without them (whole, or to its last complete event), with a warning counting them."""
    if not scanner:
        monkeypatch.setattr(native, "_chromescan", None)
    plain = _plain()
    cut = plain[: len(plain) // 2]
    for text, name in ((plain, "whole"), (cut, "cut")):
        (tmp_path / name).mkdir()
        clean = tmp_path / name / "clean.json"
        clean.write_bytes(text)
        padded = tmp_path / name / ("rank1.json.gz" if packed else "rank1.json")
        data = text + b"\0" * 70_000 + (b"\0" * 5 if packed else b"")
        padded.write_bytes(gzip.compress(data) if packed else data)
        want, got = tracediag.load(clean), tracediag.load(padded)
        assert got.events.equals(want.events)
        warning = (
            f"{70_000 + 5 * packed:,} NUL bytes end the file (its writer's host crashed?): left out, read without them"
        )
        assert got.meta.files[0].warnings == (*want.meta.files[0].warnings, warning)
        assert got.meta.files[0].skipped == want.meta.files[0].skipped
        assert (name == "cut") == bool(want.meta.files[0].skipped.get("truncated"))
    code, out, err = _invoke(["ingest", tmp_path / "whole" / padded.name, "-o", tmp_path / "o.parquet"])
    assert (code, warning in out) == (0, True), out + err

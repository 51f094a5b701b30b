"""Hostile inputs the reader campaign found answered silently or differently by one path, each a real fixture
mutated one way: thread ids that are no numbers, step markers that overlap, a Flight Recorder dump whose name
and content give two ranks, Nsight exports of another schema, a `--rank FILE=N` naming no input on the
summary paths and in `watch`, an unreadable trace among readable ones on every path (the exit status README
documents).

Each goes through the CLI (exit 0 with a warning naming the file and the count, or exit 2 with one line
naming the file and the problem; never a traceback) and through the Python API.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import pickle
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import invoke_hostile

import tracediag
from tracediag.errors import RankError, TracediagError, TraceError, shown
from tracediag.execute.driver import analyze_sources
from tracediag.ingest.flight import read_dumps
from tracediag.ingest.read import read_traces

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
GLOO0, GLOO1 = (FIXTURES / "kineto" / f"gen_torch2.13cpu_gloo_2rank_rank{r}.pt.trace.json.gz" for r in (0, 1))
HANG = FIXTURES / "hang" / "healthy"
NSYS1 = FIXTURES / "nsys" / "constructed_gpu_rank1.sqlite.gz"
WORKER_THREAD = 6882
"""A thread of rank 1's gloo trace other than the main one: 12 of its duration events."""


def _invoke(args: list) -> tuple[int, str, str]:
    return invoke_hostile(args, 120)


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("Error:")]


def _doc() -> dict:
    return json.loads(gzip.decompress(GLOO1.read_bytes()))


def _run(tmp_path: Path, doc: dict) -> tuple[Path, Path]:
    """A run folder: rank 0's real trace and `doc` as rank 1's `rank1.json`."""
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(GLOO0, folder / GLOO0.name)
    (folder / "rank1.json").write_text(json.dumps(doc))
    return folder, folder / "rank1.json"


def _analysis(args: list) -> dict:
    code, out, err = _invoke(["analyze", *args, "--format", "json"])
    assert code == 0, err
    return json.loads(out)


# ------------------------------------------------------------------------------------ thread ids


def test_a_thread_id_that_is_no_number_is_a_counted_warning_on_every_path(tmp_path):
    """`"tid": "backward"` on one thread's events read them as null: that thread's ops merged with the
    main thread's (rank 1's op-time ratio read 79x instead of 33x) without a word."""
    doc = _doc()
    for e in doc["traceEvents"]:
        if e.get("tid") == WORKER_THREAD:
            e["tid"] = "backward"
    folder, bad = _run(tmp_path, doc)
    warning = '12 events have no integer thread id (tid absent, or a string such as "main"): read as one thread'
    code, out, err = _invoke(["ingest", folder, "-o", tmp_path / "o.parquet"])
    assert code == 0, err
    assert f"warning {shown(bad)}: {warning}" in out
    assert f"{shown(bad)}: {warning}" in _analysis([folder])["warnings"]
    assert f"{shown(bad)}: {warning}" in _analysis([folder, "--executor", "local"])["warnings"]
    alone, together = tracediag.load(bad), tracediag.load(folder)  # one file read alone, and in a batch
    assert alone.meta.files[0].warnings == (warning,)
    assert [f.warnings for f in together.meta.files] == [(), (warning,)]
    assert together.events.filter(pl.col("tid").is_null()).height == 12 + 2  # + the profiler spans


def test_events_without_a_name_are_a_counted_warning(tmp_path):
    """20 operators whose `name` is absent or null were read as unnamed rows without a word (no real trace
    of the fixtures or shared samples has one)."""
    doc = _doc()
    ops = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("name", "").startswith("aten::")]
    for i, e in enumerate(ops[:20]):
        if i % 2:
            del e["name"]
        else:
            e["name"] = None
    folder, bad = _run(tmp_path, doc)
    warning = "20 events have no name (absent, or not a string): read unnamed"
    assert tracediag.load(bad).meta.files[0].warnings == (warning,)
    assert [f.warnings for f in tracediag.load(folder).meta.files] == [(), (warning,)]
    assert f"{shown(bad)}: {warning}" in _analysis([folder])["warnings"]


# ---------------------------------------------------------------------------------------- step markers


def test_overlapping_step_markers_are_cut_and_said_so(tmp_path):
    """ProfilerStep#2 of rank 1 running 5 ms into ProfilerStep#3 was cut where #3 begins, unsaid."""
    doc = _doc()
    steps = sorted(
        (e for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")), key=lambda e: e["ts"]
    )
    steps[0]["dur"] = steps[1]["ts"] - steps[0]["ts"] + 5000.0
    folder, bad = _run(tmp_path, doc)
    warning = (
        f"1 step marker overlaps the next step's, cut where it begins: the most, step 2 of rank 1 ({shown(bad)}) "
        "by 5.000 ms"
    )
    assert warning in _analysis([folder])["warnings"]
    assert warning in _analysis([folder, "--executor", "local"])["warnings"]
    healthy = tmp_path / "healthy"
    healthy.mkdir()
    for p in (GLOO0, GLOO1):
        shutil.copy(p, healthy / p.name)
    assert not [w for w in _analysis([healthy])["warnings"] if "overlap" in w]


def _steps(doc: dict) -> list[dict]:
    return sorted(
        (e for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")), key=lambda e: e["ts"]
    )


def test_a_rank_whose_step_markers_lost_their_names_is_named_not_called_untraced(tmp_path):
    """Rank 1's markers without `name` left it in no step: the analysis counted 2 ranks and then called rank 1
    "possibly untraced", with no line saying its file has no step marker."""
    doc = _doc()
    for e in _steps(doc):
        del e["name"]
    folder, bad = _run(tmp_path, doc)
    warning = f"rank 1 ({shown(bad)}): no ProfilerStep#N marker, so in no step: left out of the analysis"
    assert warning in _analysis([folder])["warnings"]
    assert warning in _analysis([folder, "--executor", "local"])["warnings"]


def test_a_repeated_step_number_is_counted_not_dropped_unsaid(tmp_path):
    """ProfilerStep#3 renamed #2 on rank 1: one of its two #2 markers was dropped without a word (then step 3,
    on rank 0 alone, was left out, which was said)."""
    doc = _doc()
    _steps(doc)[1]["name"] = _steps(doc)[0]["name"]
    folder, bad = _run(tmp_path, doc)
    warnings = _analysis([folder])["warnings"]
    assert (
        f"1 step marker repeats the number of another of its rank (first: step 2 of rank 1 ({shown(bad)})): "
        "the longest kept"
    ) in warnings
    assert "1 rank-step of steps not recorded on every rank left out" in warnings


# -------------------------------------------------------------------------------------- Flight Recorder


def test_a_dump_whose_name_and_content_give_two_ranks_is_refused(tmp_path):
    """`nccl_trace_rank_1` holding `"rank": 9` was read as rank 9: rank 1 seemed to have written no dump and
    ranks 4..8 to be missing, exit 0."""
    folder = tmp_path / "dumps"
    shutil.copytree(HANG, folder, ignore=shutil.ignore_patterns("manifest.json"))
    dump = folder / "nccl_trace_rank_1"
    dump.write_bytes(pickle.dumps({**pickle.loads(dump.read_bytes()), "rank": 9}, protocol=2))
    problem = "the dump says rank 9, its file name rank 1"
    code, _, err = _invoke(["hang", folder])
    assert code == 2, err
    assert len(_errors(err)) == 1, err
    assert shown(dump) in _errors(err)[0]
    assert problem in _errors(err)[0]
    with pytest.raises(RankError, match=re.escape(problem)):
        read_dumps(str(folder))


# ------------------------------------------------------------------------------------------- --rank keys


@pytest.mark.parametrize(
    "args",
    [["analyze"], ["analyze", "--executor", "local"], ["ingest", "--executor", "local"]],
    ids=["analyze", "analyze-executor", "ingest-executor"],
)
def test_a_rank_given_for_no_input_file_is_one_line_on_the_summary_paths(tmp_path, args):
    """`--rank rank_1.json=1` for `rank1.json` was refused by `ingest` but ignored by `analyze` (which
    streams summaries) and by `--executor`: the file kept its own rank, exit 0."""
    folder, _ = _run(tmp_path, _doc())
    extra = ["--out", tmp_path / "out"] if "ingest" in args else []
    code, _, err = _invoke([*args, folder, "--rank", "rank_1.json=1", *extra])
    assert code == 2, err
    assert _errors(err) == ["Error: --rank rank_1.json=1: no input file has this path or base name"], err
    with pytest.raises(RankError, match="no input file has this path or base name"):
        analyze_sources(folder, rank_map={"rank_1.json": 1})
    assert analyze_sources(folder, rank_map={"rank1.json": 1}).results[0][1].ranks == (0, 1)


def test_watch_once_refuses_a_rank_given_for_no_file_at_the_start(tmp_path):
    """`watch --once` (the files are there) named a `--rank` key matching no file only in a warning at its
    end, after analysing the run with the file's own rank; now one line and exit 2 before any window, as
    `analyze` refuses it. A live watch still warns at its end: the file may land later."""
    folder, _ = _run(tmp_path, _doc())
    code, out, err = _invoke(["watch", folder, "--once", "--poll", "0.2", "--rank", "rank_1.json=1"])
    problem = f"--rank rank_1.json=1: no file of {shown(folder)} has this path or base name"
    assert (code, out, _errors(err)) == (2, "", [f"Error: {problem}"]), err
    with pytest.raises(RankError, match=re.escape(problem)):
        tracediag.watch(folder, once=True, rank_map={"rank_1.json": 1})
    code, out, err = _invoke(["watch", folder, "--once", "--poll", "0.2", "--rank", "rank1.json=1"])
    assert (code, "window 1 (steps 2-3" in out, "--rank" in err) == (0, True, False), err
    tracediag.watch(folder, rank_map={"rank_1.json": 1})  # live: not refused at the call, the file may land


def test_watch_warnings_are_twenty_lines_and_a_count_each_metric_kept(tmp_path):
    """300 empty files beside a real run printed 300 `warning:` lines (a bucket of thousands: thousands);
    now 20 and one counting the rest, while the metrics count every file left out."""
    folder, _ = _run(tmp_path, _doc())
    for i in range(30):
        (folder / f"empty{i:02d}.json").touch()
    metrics = tmp_path / "m.prom"
    code, out, err = _invoke(["watch", folder, "--once", "--poll", "0.2", "--metrics-file", metrics])
    assert code == 0, err
    assert "window 1 (steps 2-3" in out
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 21, err
    assert re.fullmatch(r"warning: 10 more warnings \(empty file; .*: 10\)", warnings[-1]), err
    assert 'tracediag_files_skipped_total{reason="truncated"} 30' in metrics.read_text()


# ---------------------------------------------------------------------------- an unreadable trace, exit


def test_an_unreadable_trace_among_others_exits_2_unless_allowed_on_every_path(tmp_path):
    """One rule (README, docs/analyze.md): the output covers the readable ranks, the unreadable file is one
    `Error:` line, and the command exits 2 unless --allow-missing. The in-process analyze exited 0 (a CI
    gate passed on 2 ranks of 3) where --executor exited 2; `ingest` ignored --allow-missing."""
    folder, _ = _run(tmp_path, _doc())
    bad = folder / "rank2.json"
    bad.write_text('{"traceEvents": [')
    line = f"Error: {shown(bad)}: invalid JSON (Input data was truncated), and no complete event could be recovered"
    for args in ([], ["--perfetto", tmp_path / "t.json"], ["--executor", "local"]):
        for allow, expected in (([], 2), (["--allow-missing"], 0)):
            code, out, err = _invoke(["analyze", folder, "--format", "json", *args, *allow])
            assert (code, _errors(err)) == (expected, [line]), (args, allow, err)
            assert json.loads(out)["run"]["ranks"] == [0, 1], args
    for command in (["ingest", folder], ["export", folder, "-o", tmp_path / "e.json"], ["compare", GLOO0, folder]):
        for allow, expected in (([], 2), (["--allow-missing"], 0)):
            code, out, err = _invoke([*command, *allow])
            assert (code, _errors(err)) == (expected, [line]), (command, allow, err)
    assert "ranks   2 (0, 1)" in _invoke(["ingest", folder])[1]


def test_ingest_caps_reader_warnings_at_twenty_lines_and_counts_the_rest(tmp_path):
    """30 ranks whose traces are each cut short printed 30 `warning` lines (a job of thousands of windows:
    thousands), where analyze writes one; now the first 20 and one line counting the other 10 by problem."""
    doc = _doc()
    for r in range(30):
        doc["distributedInfo"] = {**doc["distributedInfo"], "rank": r, "world_size": 30}
        text = json.dumps(doc)
        (tmp_path / f"rank{r}.json").write_text(text[: len(text) * 3 // 4])
    code, out, err = _invoke(["ingest", tmp_path])
    assert code == 0, err
    warnings = [line for line in out.splitlines() if line.startswith("warning ")]
    assert len(warnings) == 21, out
    assert warnings[0].startswith(f"warning {shown(tmp_path / 'rank0.json')}: file ends early"), out
    assert re.fullmatch(r"warning 10 more file warnings \(file ends early .*: 10\)", warnings[-1]), out
    assert sum(len(f.warnings) for f in tracediag.load(tmp_path).meta.files) == 30


def test_a_phase_that_is_a_list_of_mixed_values_is_counted_not_an_internal_error(tmp_path):
    """`"ph": [[], -1e308, {}, null]` in a real trace's event (the fuzz campaign, seed 1203527 over 1,200,000+)
    made polars' string cast raise (TypeError: no supertype of list[null] and f64): an internal error. Now the
    phase is that JSON text, an unknown phase counted as such, the other events read."""
    doc = _doc()
    doc["traceEvents"][40]["ph"] = [[], -1e308, {}, None]
    folder, bad = _run(tmp_path, doc)
    before = tracediag.load(GLOO1).meta
    run = tracediag.load(bad)
    assert run.meta.skipped.get("other_phase", 0) == before.skipped.get("other_phase", 0) + 1
    assert run.meta.events_in == before.events_in
    code, _, err = _invoke(["ingest", folder])
    assert (code, _errors(err)) == (0, []), err


# ---------------------------------------------------------------------------------------------- Nsight


def _nsys(tmp_path: Path, sql: str) -> Path:
    db = tmp_path / "rank1.sqlite"
    db.write_bytes(gzip.decompress(NSYS1.read_bytes()))
    with contextlib.closing(sqlite3.connect(db)) as con:
        con.executescript(sql)
        con.commit()
    return db


def _kernel_kinds(run: tracediag.Run) -> dict[str, int]:
    kinds = dict(run.events["kind"].cast(pl.String).value_counts().iter_rows())
    return {k: kinds.get(k, 0) for k in ("kernel", "comm")}


def test_nsight_kernels_named_by_ids_string_ids_lacks_are_a_counted_warning(tmp_path):
    """Kernels whose `shortName` id is not in `StringIds` were read with no name: the 6 NCCL kernels among
    them passed for compute, unsaid."""
    db = _nsys(tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET shortName = 99999999")
    warning = (
        "12 rows of CUPTI_ACTIVITY_KIND_KERNEL name a string id StringIds lacks (shortName 99999999): read unnamed"
    )
    code, out, err = _invoke(["ingest", db])
    assert code == 0, err
    assert f"warning {shown(db)}: {warning}" in out
    run = tracediag.load(db)
    assert (run.meta.files[0].warnings, _kernel_kinds(run)) == ((warning,), {"kernel": 12, "comm": 0})


def test_nsight_session_start_of_the_wrong_type_is_one_line_not_relative_times(tmp_path):
    """A text `utcEpochNs` read as no session start: the export's times were taken as relative (and
    said so: "no TARGET_INFO_SESSION_START_TIME"), though the table is there."""
    db = _nsys(tmp_path, "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = 'soon'")
    problem = "TARGET_INFO_SESSION_START_TIME holds 'soon' (str) where a number goes"
    code, _, err = _invoke(["ingest", db])
    assert (code, _errors(err)) == (2, [f"Error: {shown(db)}: {problem}"]), err
    with pytest.raises(TracediagError, match=re.escape(problem)):
        tracediag.load(db)


def test_nsight_nvtx_without_its_name_columns_is_a_warning(tmp_path):
    """NVTX_EVENTS without `text` and `textId` read its ProfilerStep ranges unnamed: no step, no word."""
    db = _nsys(tmp_path, "ALTER TABLE NVTX_EVENTS DROP COLUMN text; ALTER TABLE NVTX_EVENTS DROP COLUMN textId")
    warning = "NVTX_EVENTS has neither a text nor a textId column: its ranges (step markers) read unnamed"
    assert tracediag.load(db).meta.files[0].warnings == (warning,)
    assert tracediag.load(NSYS1).meta.files[0].warnings == ()


def test_nsight_nvtx_ranges_with_neither_text_nor_text_id_are_a_counted_warning(tmp_path):
    """Ranges whose `text` and `textId` are both null read unnamed: `ProfilerStep#0` among them lost step 0
    (3 steps read as 2) without a word, where the table without both columns said so."""
    ranges = "SELECT rowid FROM NVTX_EVENTS WHERE eventType IN (59, 60) ORDER BY start LIMIT 3"
    db = _nsys(tmp_path, f"UPDATE NVTX_EVENTS SET text = NULL, textId = NULL WHERE rowid IN ({ranges})")
    warning = "3 NVTX ranges of NVTX_EVENTS have neither a text nor a textId: read unnamed"
    run = tracediag.load(db)
    assert run.meta.files[0].warnings == (warning,)
    assert run.events.filter(pl.col("kind") == "step").height == 2
    code, out, err = _invoke(["ingest", db])
    assert (code, f"warning {shown(db)}: {warning}" in out) == (0, True), out + err


def test_nsight_string_ids_held_twice_are_one_line_not_an_internal_error(tmp_path):
    """A damaged export whose StringIds holds an id twice (found by the fuzz campaign, seed 903039: a flipped
    page) was an internal error from polars' replace_strict; now one line naming the file."""
    copy = "INSERT INTO StringIds SELECT id, value || ' (copy)' FROM StringIds WHERE id < 3"
    unkeyed = "CREATE TABLE s AS SELECT * FROM StringIds; DROP TABLE StringIds; ALTER TABLE s RENAME TO StringIds"
    db = _nsys(tmp_path, f"{unkeyed}; {copy}")
    problem = "StringIds holds 3 ids more than once (id "
    with pytest.raises(TraceError, match=re.escape(problem)):
        read_traces(db)
    code, _, err = _invoke(["ingest", db])
    assert (code, len(_errors(err)), _errors(err)[0].startswith(f"Error: {shown(db)}: {problem}")) == (2, 1, True), err


def test_nsight_table_behind_a_view_is_read(tmp_path):
    """An export whose kernel table is a view (a post-processed or merged database) lost every kernel:
    only `type = 'table'` was looked up."""
    expected = _kernel_kinds(tracediag.load(_nsys(tmp_path, "")))
    db = _nsys(
        tmp_path,
        "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME TO kernels; "
        "CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS SELECT * FROM kernels",
    )
    assert _kernel_kinds(tracediag.load(db)) == expected == {"kernel": 6, "comm": 6}


@pytest.mark.parametrize(
    ("table", "column"), [("StringIds", "value"), ("StringIds", "id"), ("TARGET_INFO_SESSION_START_TIME", "utcEpochNs")]
)
def test_nsight_metadata_table_of_another_schema_is_one_line_not_a_corrupt_file(tmp_path, table, column):
    """An export whose StringIds (or session start) has another column name, as another release may write
    it, was called "corrupt SQLite file (no such column: value)": the file is sound, its schema unknown."""
    db = _nsys(tmp_path, f'ALTER TABLE {table} RENAME COLUMN "{column}" TO "{column}V2"')
    problem = f"{table} lacks column(s) {column}: unknown export schema"
    code, _, err = _invoke(["ingest", db])
    assert (code, _errors(err)) == (2, [f"Error: {shown(db)}: {problem}"]), err
    with pytest.raises(TraceError, match=re.escape(problem)):
        read_traces(db)


def test_nsight_event_table_without_an_optional_column_is_a_counted_warning(tmp_path):
    """CUPTI_ACTIVITY_KIND_RUNTIME without `globalTid` (renamed, as another release may) read its 21 runtime
    calls on no thread without a word: every export read so far has the column."""
    db = _nsys(tmp_path, 'ALTER TABLE CUPTI_ACTIVITY_KIND_RUNTIME RENAME COLUMN "globalTid" TO "globalTidV2"')
    warning = (
        "CUPTI_ACTIVITY_KIND_RUNTIME lacks column(s) globalTid (an export schema of another release): "
        "left unknown in its 21 rows"
    )
    run = tracediag.load(db)
    assert run.meta.files[0].warnings == (warning,)
    runtime = run.events.filter(pl.col("kind") == "runtime")
    assert (runtime.height, runtime["tid"].null_count()) == (21, 21)
    assert tracediag.load(NSYS1).meta.files[0].warnings == ()
    code, out, err = _invoke(["ingest", db])
    assert (code, f"warning {shown(db)}: {warning}" in out) == (0, True), out + err


# ------------------------------------------------------------------------------- times far from the rest


def _aten(doc: dict, n: int) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("name", "").startswith("aten::")][:n]


def test_events_a_day_or_more_from_the_rest_are_counted_strays(tmp_path):
    """Three operators of 31 years (`dur` 1e15 us) were read as they were: rank 1 computed 29x its peer on
    both steps (a persistent straggler) where the trace shows one slow step; one negative `ts` put its op
    in no step. Each is now a malformed row, counted, with one warning."""
    doc = _doc()
    for e in _aten(doc, 3):
        e["dur"] = 1e15
    _aten(doc, 4)[3]["ts"] = -_aten(doc, 4)[3]["ts"]
    folder, bad = _run(tmp_path, doc)
    run = tracediag.load(bad)
    assert run.meta.skipped["malformed"] == 4
    assert run.events.height + sum(run.meta.skipped.values()) == run.meta.events_in
    (warning,) = run.meta.files[0].warnings
    assert warning.startswith("4 events start or end more than a day from the file's other events")
    analysis = _analysis([folder])
    assert f"{shown(bad)}: {warning}" in analysis["warnings"]
    assert [(f["cause"], f["steps"]) for f in analysis["findings"]][:1] == [("compute_straggler", [2])]
    together = tracediag.load(folder)  # in a batch of small files: the file is read alone, as above
    assert together.meta.files[1].skipped["malformed"] == 4


@pytest.mark.parametrize("bad", [b"\xff\xfe", b"caf\xe9"], ids=["utf16_mark", "latin1"])
def test_a_name_that_is_not_utf8_is_one_line_with_its_offset(tmp_path, bad):
    """The file was refused as "invalid JSON (Invalid UTF-8 encoded string)": no place to look for it."""
    data = gzip.decompress(GLOO1.read_bytes())
    at = data.index(b'"name": "aten::') + len(b'"name": "')
    path = tmp_path / "rank1.json"
    path.write_bytes(data[:at] + bad + data[at:])
    first = next(i for i, byte in enumerate(bad) if byte > 0x7F)  # the first byte that is not ASCII
    code, _, err = _invoke(["ingest", path])
    assert code == 2, err
    found = (bad + b"aten")[first : first + 4]
    assert _errors(err) == [
        f"Error: {shown(path)}: invalid JSON at byte {at + first} (Invalid UTF-8 encoded string: {found!r})"
    ]


def test_an_op_timeline_row_a_day_from_its_rank_is_skipped_and_the_table_markers_warn_of_nothing(tmp_path):
    """One row of the real table moved 1.7e15 us on stretched its step marker by 54 years (cut by the next
    one, unsaid); the table's own markers, whose ops run on into the next step, were cut unsaid too."""
    source = FIXTURES / "timeline" / "straggler_persistent.csv.gz"
    lines = gzip.decompress(source.read_bytes()).decode().splitlines()
    header = lines[0].split(",")
    row = lines[5].split(",")
    row[header.index("start_us")] = str(float(row[header.index("start_us")]) + 1.7e15)
    path = tmp_path / "t.csv"
    path.write_text("\n".join([*lines[:5], ",".join(row), *lines[6:]]) + "\n")
    expected, analysis = _analysis([source]), _analysis([path])
    assert not [w for w in expected["warnings"] if "overlap" in w]
    assert analysis["warnings"] == [
        f"{shown(path)}: 1 row(s) with a start or end more than a day from its rank's other rows skipped"
    ]
    verdict = [(f["cause"], f["ranks"], f["steps"]) for f in expected["findings"]]
    assert [(f["cause"], f["ranks"], f["steps"]) for f in analysis["findings"]] == verdict  # one op fewer
    assert tracediag.load(path).meta.skipped == {"malformed": 1}


# --------------------------------------------------------------------------------- many bad files, stdin


def test_thousands_of_empty_files_are_twenty_lines_and_a_count(tmp_path):
    folder, _ = _run(tmp_path, _doc())
    for i in range(300):
        (folder / f"empty{i:03d}.json").touch()
    code, out, err = _invoke(["analyze", folder])
    assert code == 2, err  # the run's traces that could be read are analysed; 300 files are not
    assert len(_errors(err)) == 21, err
    assert _errors(err)[-1] == "Error: 280 more files (empty file: 280)"
    assert "warning: 280 more files (empty file: 280)" in out
    assert len(tracediag.load(folder).meta.errors) == 300  # the API keeps every line


def test_a_dash_reads_standard_input(tmp_path):
    """`tracediag analyze -` failed as "-: cannot read file (No such file or directory)"."""
    command = [sys.executable, "-m", "tracediag", "ingest", "-", str(GLOO0)]
    root = Path(__file__).resolve().parents[2]  # `-m` imports the tracediag of this checkout
    done = subprocess.run(
        command, input=gzip.decompress(GLOO1.read_bytes()), capture_output=True, timeout=120, cwd=root
    )
    assert done.returncode == 0, done.stderr
    assert b"ranks   2 (0, 1) of world size 2" in done.stdout


def _malformed_line(bad: Path, n: int, events_in: int) -> str:
    return (
        f"rank 1 ({shown(bad)}): {n:,} of its {events_in:,} events malformed (ts or dur absent, not a number, "
        "negative or out of range) and left out: its numbers are read without them"
    )


def test_a_rank_whose_operators_are_malformed_is_a_warning_of_the_analysis(tmp_path):
    """Rank 1's 408 operators with `dur` written as a string ("12.5") were dropped as malformed: `ingest`
    counted them, but `analyze` judged rank 1 on its 25 other rows without a word (no compute at all)."""
    doc = _doc()
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op":
            e["dur"] = str(e["dur"])
    folder, bad = _run(tmp_path, doc)
    run = tracediag.load(bad)
    assert run.meta.skipped["malformed"] == 408
    line = _malformed_line(bad, 408, run.meta.events_in)
    assert line in _analysis([folder])["warnings"]
    assert line in _analysis([folder, "--executor", "local"])["warnings"]
    assert not any("malformed" in w for w in _analysis([GLOO0, GLOO1])["warnings"])  # the real pair: none


def test_nsight_kernels_ending_before_they_start_are_a_warning_of_the_analysis(tmp_path):
    """The 12 kernels of rank 1's export with `end` before `start` were counted as malformed by `ingest` and
    left out of the analysis unsaid (its one malformed NVTX range, as in the real export, says nothing)."""
    db = _nsys(tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start - 1000")
    shutil.copy(NSYS1.with_name("constructed_gpu_rank0.sqlite.gz"), tmp_path)
    run = tracediag.load(db)
    assert run.meta.skipped["malformed"] == 12 + 1
    warnings = _analysis([tmp_path])["warnings"]
    assert _malformed_line(db, 13, run.meta.events_in) in warnings
    assert not any("malformed" in w for w in _analysis([NSYS1.parent / "constructed_gpu_rank*.sqlite.gz"])["warnings"])

"""Bad input gets one line naming the file and the problem (exit 2), or a warning and a count."""

from __future__ import annotations

import gzip
import json
import shutil
from typing import TYPE_CHECKING

import polars as pl
import pytest
from conftest import KINETO

from tracediag.cli import cli
from tracediag.errors import RankError, TracediagError, TraceError
from tracediag.ingest.read import read_file
from tracediag.run import load

if TYPE_CHECKING:
    from pathlib import Path

GLOO0 = KINETO / "gen_torch2.13cpu_gloo_2rank_rank0.pt.trace.json.gz"
GLOO1 = KINETO / "gen_torch2.13cpu_gloo_2rank_rank1.pt.trace.json.gz"
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00"


def _text(path: Path) -> bytes:
    return gzip.decompress(path.read_bytes())


def _bad_files(tmp: Path) -> dict[str, tuple[Path, str]]:
    """Name -> (file, a phrase the one-line error must contain)."""
    cases = {
        "not_json": (b"this is a log file, not a trace\n", "not JSON"),
        "empty": (b"", "empty file"),
        "whitespace": (b"  \n\t ", "empty file"),
        "png": (PNG, "PNG image"),
        "json_not_trace": (b'{"hello": [1, 2, 3]}', "traceEvents"),
        "corrupt_gzip": (gzip.compress(_text(GLOO0))[:3000], "corrupt gzip"),
        "bad_json_middle": (_text(GLOO0).replace(b'"ph": "X"', b'"ph": X', 1), "invalid JSON"),
    }
    out = {}
    for name, (data, phrase) in cases.items():
        p = tmp / f"{name}.json"
        p.write_bytes(data)
        out[name] = (p, phrase)
    return out


@pytest.mark.parametrize(
    "case", ["not_json", "empty", "whitespace", "png", "json_not_trace", "corrupt_gzip", "bad_json_middle"]
)
def test_unreadable_file_is_one_line_naming_it(tmp_path: Path, case: str) -> None:
    path, phrase = _bad_files(tmp_path)[case]
    with pytest.raises(TraceError) as err:
        read_file(path, default_rank=0)
    msg = str(err.value)
    assert msg.startswith(str(path) + ": ")
    assert phrase in msg
    assert "\n" not in msg


@pytest.mark.parametrize("case", ["not_json", "empty", "png", "corrupt_gzip", "bad_json_middle"])
def test_cli_bad_file_exit_2_no_traceback(runner, tmp_path: Path, case: str) -> None:
    path, phrase = _bad_files(tmp_path)[case]
    result = runner.invoke(cli, ["ingest", str(path)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("Error: ")
    assert str(path) in lines[0]
    assert phrase in lines[0]
    assert "Traceback" not in result.output


def test_multi_file_run_reads_the_good_files(runner, tmp_path: Path) -> None:
    bad = tmp_path / "rank9.json"
    bad.write_bytes(PNG)
    good0, good1 = tmp_path / "r0.json.gz", tmp_path / "r1.json.gz"
    shutil.copy(GLOO0, good0)
    shutil.copy(GLOO1, good1)
    run = load([good0, bad, good1], jobs=1)
    assert run.meta.ranks == [0, 1]
    assert len(run.meta.errors) == 1
    assert str(bad) in run.meta.errors[0]
    out = tmp_path / "run.parquet"
    result = runner.invoke(cli, ["ingest", str(tmp_path), "-o", str(out), "-j", "1"])
    assert result.exit_code == 2
    assert "ranks   2 (0, 1)" in result.stdout
    assert [ln for ln in result.stderr.splitlines() if ln.startswith("Error: ")] == [
        f"Error: {bad}: not a trace: the file is a PNG image"
    ]
    assert out.exists()


def test_file_cut_mid_event_reads_the_complete_events(tmp_path: Path) -> None:
    text = _text(GLOO0)
    n_events = len(json.loads(text)["traceEvents"])
    cut_at = text.index(b'"name": "aten::copy_"')  # inside an event near the end
    path = tmp_path / "cut.json"
    path.write_bytes(text[:cut_at])
    ft = read_file(path)
    complete = text[:cut_at].rsplit(b"},", 1)[0].count(b'"ph":')  # events fully before the cut
    assert ft.meta.skipped["truncated"] == 1
    assert ft.meta.events_in == complete + 1
    assert ft.events.height + sum(ft.meta.skipped.values()) == ft.meta.events_in
    assert ft.meta.events_in < n_events
    assert any("ends early" in w for w in ft.meta.warnings)


def test_array_form_missing_bracket_and_trailing_comma(tmp_path: Path) -> None:
    """The Chrome format allows `[ {..}, {..},` with no closing bracket: nothing is lost."""
    events = json.loads(_text(GLOO0))["traceEvents"]
    body = ",\n".join(json.dumps(e) for e in events)
    path = tmp_path / "open_array.json"
    path.write_text("[\n" + body + ",\n")
    ft = read_file(path, rank=0)
    assert ft.meta.events_in == len(events)
    assert ft.meta.skipped.get("truncated", 0) == 0
    assert ft.events.height == sum(1 for e in events if e["ph"] == "X")


def test_events_with_missing_or_wrong_typed_fields_are_counted(tmp_path: Path) -> None:
    trace = json.loads(_text(GLOO0))
    events = trace["traceEvents"]
    xs = [i for i, e in enumerate(events) if e["ph"] == "X"]
    del events[xs[0]]["ts"]  # no ts
    events[xs[1]]["dur"] = "slow"  # wrong type
    events[xs[2]]["args"] = ["not", "an", "object"]  # wrong-typed args: the event is kept, args dropped
    events[xs[3]]["dur"] = -5  # negative duration
    events.append(42)  # not an event at all
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(trace))
    ft = read_file(path)
    assert ft.meta.events_in == len(events)
    assert ft.meta.skipped["malformed"] == 4  # no ts, dur "slow", dur < 0, and 42
    assert ft.events.height == len(xs) - 3
    assert ft.events.height + sum(ft.meta.skipped.values()) == len(events)


def test_duplicate_rank_names_both_files(runner, tmp_path: Path) -> None:
    a, b = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    shutil.copy(GLOO0, a)
    shutil.copy(GLOO0, b)
    with pytest.raises(RankError) as err:
        load([a, b], jobs=1)
    assert str(a) in str(err.value)
    assert str(b) in str(err.value)
    assert "rank 0" in str(err.value)
    result = runner.invoke(cli, ["ingest", str(a), str(b), "-j", "1"])
    assert result.exit_code == 2
    assert str(a) in result.stderr
    assert str(b) in result.stderr


def test_rank_from_filename_and_mapping(tmp_path: Path) -> None:
    src = KINETO / "hta_rank_not_found.json.gz"
    a, b = tmp_path / "job-rank3.json.gz", tmp_path / "job-rank7.json.gz"
    shutil.copy(src, a)
    shutil.copy(src, b)
    with pytest.raises(TracediagError) as err:
        load([a, b], jobs=1)
    lines = str(err.value).splitlines()
    assert len(lines) == 2
    assert all("--rank-from-filename" in ln for ln in lines)
    assert str(a) in lines[0]
    assert str(b) in lines[1]
    run = load([a, b], jobs=1, rank_from_filename=r"rank(\d+)")
    assert run.meta.ranks == [3, 7]
    assert sorted(run.events["rank"].unique().to_list()) == [3, 7]
    run = load([a, b], jobs=1, rank_map={"job-rank3.json.gz": 1, str(b): 2})
    assert run.meta.ranks == [1, 2]


def test_clock_values_stay_per_file(tmp_path: Path) -> None:
    """Two ranks with different Kineto bases stay on one absolute (epoch) clock."""
    run = load([GLOO0, GLOO1], jobs=1)
    starts = run.events.group_by("rank").agg(pl.col("ts").min()).sort("rank")["ts"].to_list()
    assert abs(starts[0] - starts[1]) < 10**9  # same job, same second: both were made absolute


@pytest.mark.parametrize("scanner", [True, False])
def test_unknown_phase_is_counted_and_the_other_phases_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scanner: bool
) -> None:
    """An unknown phase sends the file down the plain-event path, where every phase becomes a row
    and is counted by phase after decoding: the counts must equal those of the file without it."""
    if not scanner:
        monkeypatch.setattr("tracediag.ingest.native._chromescan", None)
    trace = json.loads(_text(GLOO0))
    events = trace["traceEvents"]
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(trace))
    xs = [i for i, e in enumerate(events) if e["ph"] == "X"]
    events[xs[5]]["ph"] = "Q"
    events[xs[6]].pop("ph")
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps(trace))
    before, after = read_file(plain), read_file(odd)
    assert before.meta.skipped["flow"] > 0
    assert "other_phase" not in before.meta.skipped
    expected = {**before.meta.skipped, "other_phase": 1}
    expected["malformed"] = expected.get("malformed", 0) + 1  # no phase at all
    assert after.meta.skipped == expected
    assert after.events.height == before.events.height - 2
    assert after.events.height + sum(after.meta.skipped.values()) == after.meta.events_in


def test_booleans_and_strings_are_no_times(tmp_path):
    """A parser rule (hand-written events): `"ts": true` is no time at 1 µs, `"dur": false` no 0 ns
    duration, `"ts": "30"` no 30 µs; each row is malformed, dropped and counted, the others kept."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 10, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": True, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 20, "dur": False},
        {"ph": "X", "cat": "cpu_op", "name": "c", "pid": 1, "tid": 1, "ts": "30", "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "d", "pid": 1, "tid": 1, "ts": 40.5, "dur": 5},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}))
    trace = read_file(path)
    assert trace.events["name"].cast(pl.String).to_list() == ["ProfilerStep#1", "d"]
    assert trace.events["ts"].to_list() == [10_000, 40_500]
    assert trace.meta.skipped == {"malformed": 3}

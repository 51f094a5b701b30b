"""The Flight Recorder reader (issue 25) on the real gloo dumps of fixtures/hang, and on hostile ones:
code-running, truncated, wrong-typed and oversized pickles give one-line errors or counted skips."""

from __future__ import annotations

import gzip
import json
import pickle
import shutil

import polars as pl
import pytest
from conftest import FIXTURES

from tracediag.errors import RankError, TracediagError, TraceError
from tracediag.ingest import flight, workers
from tracediag.ingest.flight import ENTRY_SCHEMA, read_dump, read_dumps
from tracediag.ingest.safepickle import load_plain

HANG = FIXTURES / "hang"
SCENARIOS = sorted(p.parent.name for p in HANG.glob("*/manifest.json"))


def _plain(path) -> dict:
    """A real dump as plain data, through the restricted loader (to be altered and written again)."""
    return load_plain(path.read_bytes(), str(path))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_fixture_reads_with_ranks_from_names(scenario):
    manifest = json.loads((HANG / scenario / "manifest.json").read_text())
    dumps = read_dumps(str(HANG / scenario))
    expected = sorted(int(name.split("_")[-1].split(".")[0]) for name in manifest["dumps"])
    assert list(dumps.ranks) == expected
    assert dumps.entries.schema == ENTRY_SCHEMA
    assert dumps.skipped == {"file not a Flight Recorder dump": 1}  # the manifest beside them
    assert set(dumps.entries["backend"].unique()) == {"gloo"}
    assert dumps.entries["pg_name"].null_count() == 0


def test_host_stuck_ring_buffer_keeps_the_newest_16():
    """TORCH_FR_BUFFER_SIZE=16: the late rank holds #9-#24, the others #10-#25."""
    e = read_dumps(str(HANG / "host_stuck")).entries
    span = e.group_by("rank").agg(pl.col("collective_seq_id").min().alias("lo"), pl.len()).sort("rank")
    assert span["lo"].to_list() == [10, 10, 9, 10]
    assert span["len"].to_list() == [16, 16, 16, 16]


def test_pickle_and_json_dumps_give_the_same_collectives():
    """host_stuck and host_stuck_json are two runs of one scenario, one written by each dump API."""
    cols = ["rank", "pg_name", "collective_seq_id", "op", "input_sizes", "input_dtypes", "output_sizes", "retired"]
    p = read_dumps(str(HANG / "host_stuck")).entries.select(cols)
    j = read_dumps(str(HANG / "host_stuck_json")).entries.select(cols)
    assert p.equals(j)
    assert read_dumps(str(HANG / "host_stuck_json")).dumps["format"].unique().to_list() == ["json"]


def test_gzip_and_glob(tmp_path):
    for src in (HANG / "host_stuck").glob("nccl_trace_rank_*"):
        (tmp_path / f"{src.name}.gz").write_bytes(gzip.compress(src.read_bytes()))
    plain = read_dumps(str(HANG / "host_stuck" / "nccl_trace_rank_*")).entries
    zipped = read_dumps(str(tmp_path / "*.gz")).entries
    assert zipped.equals(plain)


def test_frames_and_status_are_read():
    d = read_dump(str(HANG / "host_stuck" / "nccl_trace_rank_2"))
    last = d.entries.tail(1).row(0, named=True)
    frames = d.stacks.filter(pl.col("stack_id") == last["stack_id"])["frames"][0]
    assert d.stacks.height == 1  # its 16 entries come from one call site (the loop)
    caller = frames[2]
    assert (caller["name"], caller["filename"]) == ("_scenario", "fixtures/hang/make_hang_dumps.py")
    assert frames[0]["name"] == "all_reduce"
    assert d.status.row(0, named=True)["last_enqueued"] == 24


class _RunsCode:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def test_a_pickle_whose_payload_runs_code_is_refused_and_does_not_run(tmp_path):
    marker = tmp_path / "ran.txt"
    doc = _plain(HANG / "healthy" / "nccl_trace_rank_0")
    doc["entries"][0]["frames"] = _RunsCode(str(marker))
    bad = tmp_path / "nccl_trace_rank_0"
    bad.write_bytes(pickle.dumps(doc))
    with pytest.raises(TraceError) as e:
        read_dump(str(bad))
    assert not marker.exists()
    assert "builtins.exec" in str(e.value)
    assert str(bad) in str(e.value)
    assert "\n" not in str(e.value)


def test_any_class_is_refused_even_a_harmless_one(tmp_path):
    from collections import OrderedDict

    bad = tmp_path / "nccl_trace_rank_0"
    bad.write_bytes(pickle.dumps(OrderedDict(entries=[])))
    with pytest.raises(TraceError, match=r"collections\.OrderedDict"):
        read_dump(str(bad))


def test_truncated_pickle_is_one_line(tmp_path):
    data = (HANG / "healthy" / "nccl_trace_rank_0").read_bytes()
    cut = tmp_path / "nccl_trace_rank_0"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="truncated pickle") as e:
        read_dump(str(cut))
    assert "\n" not in str(e.value)


def test_entries_of_the_wrong_type_are_counted_skips(tmp_path):
    doc = _plain(HANG / "healthy" / "nccl_trace_rank_0")
    n = len(doc["entries"])
    doc["entries"][0] = "not an entry"
    doc["entries"][1]["collective_seq_id"] = None
    doc["entries"][2]["input_sizes"] = "[[4]]"  # a string where lists belong: the field is null, the entry kept
    doc["entries"][3]["time_created_ns"] = 2**70  # past Int64: null
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(doc))
    d = read_dump(str(path))
    assert d.entries.height == n - 2
    assert d.skipped == {
        "entry not a dict": 1,
        "entry without record_id, process_group, collective_seq_id or profiling_name": 1,
        "entry field of the wrong type (set to null)": 2,
    }
    assert d.entries["input_sizes"].null_count() == 1


def test_entries_not_a_list_is_an_error(tmp_path):
    doc = _plain(HANG / "healthy" / "nccl_trace_rank_0")
    doc["entries"] = 5
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(doc))
    with pytest.raises(TraceError, match="entries is a int, not a list"):
        read_dump(str(path))


def test_a_million_entries_keep_the_newest_and_count_the_rest(tmp_path):
    """10**6 references to one real entry pickle small (memo) but would build 10**6 rows: only
    max_entries are kept."""
    doc = _plain(HANG / "healthy" / "nccl_trace_rank_0")
    doc["entries"] = [doc["entries"][0]] * 10**6
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(doc))
    d = read_dump(str(path), max_entries=1000)
    # the newest 1,000 kept; being one entry, they are one record id: read once, the 999 repeats counted
    assert d.entries.height == 1
    assert d.skipped == {
        "entries past the newest 1,000": 999_000,
        "entry repeating the record_id of an earlier one of its rank (the first kept)": 999,
    }


def test_a_dump_over_the_byte_limit_is_refused_before_parsing(tmp_path):
    src = HANG / "healthy" / "nccl_trace_rank_0"
    with pytest.raises(TraceError, match="larger than"):
        read_dump(str(src), max_bytes=100)


def test_a_named_file_that_is_no_dump_is_an_error_in_a_folder_a_skip():
    with pytest.raises(TraceError, match="without Flight Recorder fields"):
        read_dumps(str(HANG / "healthy" / "manifest.json"))
    assert read_dumps(str(HANG / "healthy")).skipped == {"file not a Flight Recorder dump": 1}


def test_two_dumps_of_one_rank_and_no_rank_at_all(tmp_path):
    shutil.copy(HANG / "healthy" / "nccl_trace_rank_0", tmp_path / "a_rank_0")
    shutil.copy(HANG / "healthy" / "nccl_trace_rank_0", tmp_path / "b_rank_0")
    with pytest.raises(RankError, match="two dumps of rank 0"):
        read_dumps(str(tmp_path))
    (tmp_path / "b_rank_0").unlink()
    shutil.copy(HANG / "healthy" / "nccl_trace_rank_1", tmp_path / "dump")
    with pytest.raises(RankError, match="no rank in the dump nor in its file name"):
        read_dumps(str(tmp_path))
    d = read_dumps([str(tmp_path / "a_rank_0")], rank_from_filename=r"a_rank_(\d+)")
    assert d.ranks == (0,)


def test_a_rank_field_is_read_where_the_file_name_names_none_and_refused_where_it_names_another(tmp_path):
    """A rank field 7 in `nccl_trace_rank_0` was read as rank 7, so that rank 0 seemed to have written no dump
    and ranks 1..6 to be missing too; now the contradiction is one line naming both."""
    doc = _plain(HANG / "healthy" / "nccl_trace_rank_0")
    doc["rank"] = 7
    unnamed, other = tmp_path / "dump.pickle", tmp_path / "nccl_trace_rank_0"
    for path in (unnamed, other):
        path.write_bytes(pickle.dumps(doc))
    assert read_dump(str(unnamed)).ranks == (7,)
    with pytest.raises(RankError, match="nccl_trace_rank_0: the dump says rank 7, its file name rank 0"):
        read_dump(str(other))


def test_an_empty_folder_and_a_missing_file(tmp_path):
    with pytest.raises(TracediagError, match="no files in this directory"):
        read_dumps(str(tmp_path))
    with pytest.raises(TraceError):
        read_dumps(str(tmp_path / "nccl_trace_rank_0"))


def test_a_rank_regex_the_engine_refuses_is_one_line_before_any_file_is_read():
    with pytest.raises(RankError, match=r"^--rank-from-filename '\(\?<=x\)\(\\\\d\+\)' is not a valid regular"):
        read_dumps(str(HANG / "host_stuck"), rank_from_filename=r"(?<=x)(\d+)")
    ranks = read_dumps(str(HANG / "host_stuck"), rank_from_filename=r"rank_(\d+)$").ranks
    assert ranks == (0, 1, 2, 3)


def test_entries_are_by_rank_and_record_whatever_order_the_files_are_read_in(tmp_path):
    # file names in the reverse order of their ranks (rank 3 is read first), and 12 dumps so that the
    # names' numbers sort differently as text (r10 before r2) and as numbers
    src = sorted((HANG / "host_stuck").glob("nccl_trace_rank_*"))
    for k in range(12):
        shutil.copy(src[k % len(src)], tmp_path / f"a{11 - k}_r{k}")
    dumps = read_dumps(str(tmp_path), rank_from_filename=r"_r(\d+)$")
    entries = dumps.entries
    assert entries["rank"].unique(maintain_order=True).to_list() == list(range(12))
    per_rank = entries.group_by("rank", maintain_order=True).agg(pl.col("record_id"))
    assert all(ids == sorted(ids) for ids in per_rank["record_id"].to_list())
    assert entries.height == sum(read_dump(str(p)).entries.height for p in src for _ in range(3))


def test_a_batch_sent_from_a_worker_equals_the_batch_read_here(monkeypatch):
    # what a worker process sends (its tables packed, then pickled onto the pipe), as the caller unpacks it
    found = [(str(p), True) for p in sorted((HANG / "two_groups").iterdir())]
    options = {"rank_from_filename": None, "storage_options": None, "max_bytes": 1 << 26, "max_entries": 100_000}
    here, not_dumps = flight.read_batch((found, options))
    monkeypatch.setitem(workers._SERVING, "worker", True)
    sent, _ = flight.read_batch((found, options))
    assert isinstance(sent, flight._Shipped)
    there = pickle.loads(pickle.dumps(sent, protocol=pickle.HIGHEST_PROTOCOL)).unpack()
    assert not_dumps == 1  # the manifest
    assert there.entries.height == here.entries.height > 0
    for name in ("entries", "groups", "status", "dumps", "stacks"):
        assert getattr(there, name).equals(getattr(here, name)), name
    assert there.skipped == here.skipped

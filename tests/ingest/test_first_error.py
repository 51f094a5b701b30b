"""A bad JSON trace is refused at its first invalid byte, with that byte's offset in the file, without
reading (or gunzipping) the rest: a 4 GB sparse file of NUL bytes after `{"traceEvents": [` answers from
its first windows, in bounded memory (issue 29: at 1 GB it read and copied the whole file, 2.1 GB)."""

from __future__ import annotations

import gzip
import subprocess
import sys
import zlib
from typing import TYPE_CHECKING

import orjson
import pytest
from conftest import KINETO, ROOT

from tracediag.errors import TraceError
from tracediag.ingest import chrome
from tracediag.ingest.read import read_file

if TYPE_CHECKING:
    from pathlib import Path

A100 = KINETO / "hta_a100_nccl_rank0.json.gz"
HEAD = b'{"traceEvents": ['


def _sparse(path: Path, head: bytes, size: int) -> Path:
    """`head`, then NUL bytes to `size`: a hole in the file, no disk."""
    with path.open("wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def _refused(path: Path) -> str:
    with pytest.raises(TraceError) as caught:
        read_file(path, default_rank=0)
    return str(caught.value)


def test_nul_bytes_after_the_events_bracket_are_refused_at_byte_17(tmp_path):
    message = _refused(_sparse(tmp_path / "t.json", HEAD, 64 << 20))
    assert message == f"{tmp_path / 't.json'}: invalid JSON at byte 17 (invalid character)"


def test_the_offset_is_the_files_after_a_byte_order_mark_and_leading_space(tmp_path):
    head = b"\xef\xbb\xbf  \n" + HEAD + b'{"ph": "X"}, ' + b"\x01"
    message = _refused(_sparse(tmp_path / "t.json", head, 64 << 20))
    assert message.endswith(f"invalid JSON at byte {len(head) - 1} (invalid character)")


def test_an_error_pieces_into_a_real_trace_names_its_byte(tmp_path, monkeypatch):
    """A real trace's events, read in pieces; a bad byte in the third piece, the rest a sparse hole: the
    offset is that byte's, counted across the pieces already decoded (not from the piece's start)."""
    monkeypatch.setattr(chrome, "CHUNK_BYTES", 1 << 16)
    events = orjson.loads(gzip.decompress(A100.read_bytes()))["traceEvents"]
    body = HEAD + b",".join(orjson.dumps(e) for e in events[:3000])
    at = body.index(b'"ph"', 5 << 16)  # an event key in a later piece
    bad = body[:at] + b"?" + body[at + 1 :]
    path = _sparse(tmp_path / "t.json", bad, 1 << 30)
    message = _refused(path)
    assert message == f"""{path}: invalid JSON at byte {at} (expected '"')"""


def test_the_whole_file_decode_names_the_file_offset_too(tmp_path):
    """A small file read as one document: the offset counts the byte-order mark the reader skipped."""
    text = b"\xef\xbb\xbf" + HEAD + b'{"ph": "X"} {"ph": "X"}]}'
    (tmp_path / "t.json").write_bytes(text)
    assert _refused(tmp_path / "t.json").endswith(
        f"invalid JSON at byte {text.index(b'} {') + 2} (expected ',' or ']')"
    )


def test_a_gzipped_bad_file_is_not_gunzipped_to_its_end(tmp_path):
    """300 MB of NUL bytes gzipped (300 KB): refused at byte 17 of its content, not after gunzipping
    256 MB to hit the bomb cap (what reading it whole did)."""
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    parts = [packer.compress(HEAD)] + [packer.compress(zeros) for _ in range(300)] + [packer.flush()]
    path = tmp_path / "t.json.gz"
    path.write_bytes(b"".join(parts))
    assert _refused(path) == f"{path}: invalid JSON at byte 17 (invalid character)"


@pytest.mark.parametrize("lead", [b"", b"\n\t  ", b"\xef\xbb\xbf ", b" " * 100_000], ids=["none", "4", "bom", "100k"])
def test_a_gzipped_file_names_the_same_offset_as_the_plain_file(tmp_path, lead):
    """A real trace with one bad byte, gzipped or not: the gzipped one's offset was short by the leading
    bytes `sniff.peek_head` skipped (by 100,000 after 100,000 spaces; by 1 for a Kineto file that starts
    with a space, as `fixtures/runs`' do)."""
    text = lead + gzip.decompress(A100.read_bytes())
    at = text.index(b'"ph"', len(text) // 2)
    bad = text[:at] + b"?" + text[at + 1 :]
    (tmp_path / "t.json").write_bytes(bad)
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(bad, 1))
    expected = f"invalid JSON at byte {at} (object keys must be strings)"
    assert _refused(tmp_path / "t.json").endswith(expected)
    assert _refused(tmp_path / "t.json.gz") == f"{tmp_path / 't.json.gz'}: {expected}"


def test_a_file_cut_short_after_a_trailing_comma_is_still_repaired(tmp_path, monkeypatch):
    """The first-error check leaves a trailing comma to the truncation repair (a file cut after `},`)."""
    monkeypatch.setattr(chrome, "CHUNK_BYTES", 1 << 10)
    events = orjson.loads(gzip.decompress(A100.read_bytes()))["traceEvents"][:200]
    path = tmp_path / "t.json"
    path.write_bytes(HEAD + b",".join(orjson.dumps(e) for e in events) + b",")
    ft = read_file(path, default_rank=0)
    assert ft.meta.events_in == len(events)


_PEAK = """
import sys
from tracediag.cli import cli
try:
    cli.main(sys.argv[1:])
except SystemExit as e:
    code = e.code
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(code, int(hwm.split()[1]) // 1024)
"""
"""The CLI in a fresh process, then its exit code and peak RSS in MB. The peak is this process's own
(VmHWM, reset by exec), not `ru_maxrss`, which Linux carries over exec: started by a pytest process past
400 MB, the child reported the parent's peak (424 MB in a full run; 62 MB alone)."""


@pytest.mark.parametrize("command", ["ingest", "analyze"])
def test_a_4_gb_sparse_file_is_refused_in_bounded_memory(tmp_path, command):
    """The CLI on a 4 GB sparse bad file in a fresh process: exit 2, one line naming the file and byte 17,
    and a peak under 400 MB (reading it whole held it twice: 8 GB)."""
    path = _sparse(tmp_path / "big.json", HEAD, 4 << 30)
    args = [command, str(path)] + (["-o", str(tmp_path / "o.parquet")] if command == "ingest" else [])
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, *args], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    code, peak_mb = map(int, done.stdout.split())
    assert code == 2
    assert done.stderr.strip().splitlines() == [f"Error: {path}: invalid JSON at byte 17 (invalid character)"]
    assert peak_mb < 400, peak_mb


@pytest.mark.parametrize(
    ("doc", "what"), [(b'"B"\n', "a string"), (b"5", "a number"), (b"null", "null"), (b"true", "true or false")]
)
@pytest.mark.parametrize("scanner", [True, False])
def test_a_json_scalar_is_not_a_trace(monkeypatch, doc, what, scanner):
    """Found by tests/fuzz/atheris_chromescan.py: `decode` of a JSON string raised AttributeError (the
    lenient path took any non-array document for an object); the CLI's sniffing hid it, the decoder did not."""
    if not scanner:
        monkeypatch.setattr(chrome.native, "_chromescan", None)
    with pytest.raises(TraceError, match=f"^t.json: not a trace: the JSON is {what}, not an object or an array$"):
        chrome.decode(doc, "t.json")

"""How the command line ends when it is interrupted or its stdout fails: the documented status, one
line on stderr, no traceback, and nothing left behind (no output, no temporary file)."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, RUNS

RANKS = sorted(str(p) for p in (RUNS / "healthy_ddp").glob("rank*.json.gz"))
KINETO = ROOT / "fixtures" / "kineto" / "gen_torch2.13cpu_gloo_2rank_rank0.pt.trace.json.gz"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ENV.pop("TRACEDIAG_DEBUG", None)


def _tracediag(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tracediag", *args], env=ENV, stderr=subprocess.PIPE, text=True, **kw
    )


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize(
    ("sig", "status", "word"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_signal_while_reading_ends_in_one_line_and_leaves_nothing(tmp_path: Path, sig, status, word) -> None:
    """The trace arrives through a FIFO, half of it written: the process is inside the reader when the
    signal lands (Ctrl-C was click's "Aborted!", exit 1; SIGTERM killed it with no cleanup)."""
    fifo = tmp_path / "rank0.pt.trace.json"
    os.mkfifo(fifo)
    out = tmp_path / "out.parquet"
    proc = _tracediag("ingest", str(fifo), "-o", str(out), stdout=subprocess.PIPE)
    data = gzip.decompress(KINETO.read_bytes())
    with fifo.open("wb") as writer:  # opens once the reader has: the process is past its imports
        writer.write(data[: len(data) // 2])
        writer.flush()
        time.sleep(0.5)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    assert err.strip() == f"Error: {word}"
    assert sorted(p.name for p in tmp_path.iterdir()) == [fifo.name]


def test_stdout_on_a_full_device_is_one_line_exit_2() -> None:
    with Path("/dev/full").open("w") as full:
        proc = _tracediag("analyze", *RANKS, "--format", "json", stdout=full)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert err.strip() == "Error: cannot write the output (No space left on device)"


@pytest.mark.parametrize("args", [["--format", "json", "--kernels", "50"], ["--help"]])
def test_stdout_closed_by_its_reader_is_quiet_exit_2(args: list[str]) -> None:
    """`tracediag analyze … | head -1` once head has gone: no BrokenPipeError, no message, exit 2 (was 1)."""
    proc = _tracediag("analyze", *RANKS, *args, stdout=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 2
    assert err == ""


def test_a_large_report_through_head_keeps_its_first_line() -> None:
    shell = f"{sys.executable} -m tracediag analyze {' '.join(RANKS)} --kernels 50 | head -1"
    result = subprocess.run(["sh", "-c", shell], env=ENV, capture_output=True, text=True, timeout=120)
    assert result.stdout.startswith("tracediag analyze: 4 ranks (world size 4), 8 steps")
    assert "Traceback" not in result.stderr
    assert "Error" not in result.stderr

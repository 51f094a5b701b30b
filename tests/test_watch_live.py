"""`tracediag watch` as deployed: beside a real 4-rank torch job that writes its profiler windows.

The watcher (the command line, its own process) is started first on an empty folder; then the job
of fixtures/watch/make_watch_run.py (gloo on 127.0.0.1, ``schedule(..., repeat=5)`` with
``tensorboard_trace_handler``, rank 2 a straggler from window 3 on) writes into it. The straggler
must be reported from window 3, not before.

torch is not a tracediag dependency: the job runs with ``$TORCH_PYTHON``, else this interpreter when
it has torch, else a ``torchvenv/bin/python`` in a folder above the repository; without any, the
test skips and says so.
"""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest
from conftest import FIXTURES, ROOT, torch_python

SCRIPT = FIXTURES / "watch" / "make_watch_run.py"


def test_the_watcher_beside_a_real_job_reports_the_straggler_from_its_first_window(tmp_path):
    python = torch_python()
    if python is None:
        pytest.skip("no torch: set TRACEDIAG_TORCH_PYTHON to a Python with torch 2.13 to run the live job")
    job = tmp_path / "job"
    job.mkdir()
    jsonl = tmp_path / "windows.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "tracediag", "watch", str(job), "--poll", "0.2", "--window-timeout", "120"]
    watcher = subprocess.Popen(
        [*command, "--max-windows", "5", "--jsonl", str(jsonl)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        done = subprocess.run(
            [python, str(SCRIPT), str(job), "--windows", "5", "--straggler", "2", "--straggler-from", "3"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        out, err = watcher.communicate(timeout=300)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert watcher.returncode == 0, err
    records = [orjson.loads(line) for line in jsonl.read_bytes().splitlines()]
    assert [r["window"] for r in records] == [1, 2, 3, 4, 5], out
    assert all(r["ranks"] == [0, 1, 2, 3] and not r["missing_ranks"] for r in records)

    def blamed(r: dict) -> set[int]:
        by_findings = {k for f in r["findings"] if f["cause"].endswith("_straggler") for k in f["ranks"]}
        return by_findings | set(r["waited_for"])

    assert [2 in blamed(r) for r in records] == [False, False, True, True, True], out
    new = [(r["window"], c["ranks"]) for r in records for c in r["changes"] if c["kind"] == "new_straggler"]
    assert (3, [2]) in new, out
    assert not [w for w, ranks in new if 2 in ranks and w != 3], out
    # every file the job wrote is in a record: none left unreported
    assert sum(len(r["files"]) for r in records) == len(list(job.glob("*.pt.trace.json.gz")))

"""A real Prometheus server scrapes `tracediag watch --metrics-port` and is queried over its HTTP API.

The watcher (the command line, its own process) follows a folder holding the real multi-window run
of fixtures/watch; Prometheus (Debian's ``prometheus`` package, installed by ``.ci/run``) is started
on loopback with a 1 s scrape interval and a temporary database. Without the binary the test skips
and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from conftest import FIXTURES, ROOT

RUN = FIXTURES / "watch" / "straggler_from3"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_prometheus_scrapes_the_watchers_metrics(tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no prometheus binary (Debian's `prometheus` package; .ci/run installs it)")
    job = tmp_path / "job"
    job.mkdir()
    for f in RUN.glob("*.pt.trace.json.gz"):
        shutil.copy(f, job / f.name)
    mport, pport = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: tracediag\n    static_configs: [{{targets: ['127.0.0.1:{mport}']}}]\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "tracediag", "watch", str(job), "--poll", "0.2", "--metrics-host", "127.0.0.1"]
    watcher = subprocess.Popen(
        [*command, "--metrics-port", str(mport)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    flags = [f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}"]
    server = subprocess.Popen(
        [binary, *flags, f"--web.listen-address=127.0.0.1:{pport}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, got = time.monotonic() + 120, []
        while time.monotonic() < deadline:
            try:
                got = query(pport, 'tracediag_windows_analysed_total{job="tracediag"}')
            except OSError:
                got = []  # the server is still starting
            if got and float(got[0]["value"][1]) == 5:
                break
            time.sleep(1)
        assert got, got
        assert float(got[0]["value"][1]) == 5, got
        per_rank = query(pport, "tracediag_step_seconds")
        assert sorted(int(s["metric"]["rank"]) for s in per_rank) == [0, 1, 2, 3]
        share = query(pport, 'tracediag_caused_wait_ratio{rank="2"}')
        assert float(share[0]["value"][1]) > 0.9  # the straggler of windows 3-5
        assert float(query(pport, "tracediag_regressions_total")[0]["value"][1]) == 3
    finally:
        for p in (server, watcher):
            p.terminate()
        for p in (server, watcher):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

"""Attach to clusters started apart from tracediag, as on a real cluster (issue 12): a `ray start --head`
node and a `dask scheduler` with `dask worker`s found through a scheduler file. The command line
attaches by the engines' own conventions (RAY_ADDRESS; --scheduler-file) and must print the same
analysis as the in-memory path. Each cluster runs in its own process group and is stopped with it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, suppress
from pathlib import Path

import orjson
import pytest
from conftest import FIXTURES

import tracediag

RUN = FIXTURES / "runs" / "straggler_persistent"
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _group(cmd: list[str], env: dict[str, str], ready, timeout: float = 120):
    """Run `cmd` in a new process group until `ready()` is true; stop the whole group on exit."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{cmd[0]} did not start (exit {proc.poll()})")
            time.sleep(0.2)
        yield proc
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _analyze(args: list[str], env: dict[str, str], out: Path) -> dict:
    cmd = [str(BIN / "tracediag"), "analyze", str(RUN), "--format", "json", "--out", str(out), *args]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "files 5/5 · ranks 4 · failed 0" in result.stderr
    return orjson.loads(result.stdout)


def _expected() -> dict:
    return orjson.loads(orjson.dumps(tracediag.analyze(tracediag.load(RUN, jobs=1)).to_dict()))


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install 'tracediag[ray]')"
)
def test_attach_to_ray_start_head(tmp_path):
    port, dash = _free_port(), _free_port()
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    agent = [f"--{name}={_free_port()}" for name in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                      "runtime-env-agent-port", "metrics-export-port")]  # fmt: skip
    temp = Path(tempfile.mkdtemp(prefix="td-ray-"))  # short: Ray's socket paths must fit 107 bytes
    head = [str(BIN / "ray"), "start", "--head", "--block", f"--port={port}", "--num-cpus=2", "--disable-usage-stats",
            "--include-dashboard=false", f"--dashboard-port={dash}", f"--temp-dir={temp}", *agent]  # fmt: skip
    try:
        with _group(head, env, lambda: _listening(port) and (temp / "session_latest" / "sockets" / "raylet").exists()):
            # Ray >= 2.59 turns token authentication on for the cluster: the driver opts in with RAY_AUTH_MODE
            attach = {**env, "RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_AUTH_MODE": "token"}
            doc = _analyze(["--executor", "ray"], attach, tmp_path / "out")
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert doc == _expected()


@pytest.mark.skipif(
    importlib.util.find_spec("distributed") is None, reason="dask is not installed (pip install 'tracediag[dask]')"
)
def test_attach_to_dask_scheduler_file(tmp_path):
    file = tmp_path / "scheduler.json"
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    scheduler = [str(BIN / "dask"), "scheduler", "--scheduler-file", str(file), "--host", "127.0.0.1",
                 "--port", "0", "--no-dashboard"]  # fmt: skip
    workers = [str(BIN / "dask"), "worker", "--scheduler-file", str(file), "--nworkers", "2", "--nthreads", "1",
               "--no-dashboard", "--local-directory", str(tmp_path / "dask")]  # fmt: skip
    with _group(scheduler, env, file.exists), _group(workers, env, lambda: True):
        doc = _analyze(["--executor", "dask", "--scheduler-file", str(file)], env, tmp_path / "out")
    assert doc == _expected()

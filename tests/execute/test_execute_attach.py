"""Attach to clusters started apart from tracediag, as on a real cluster (issue 12): a `ray start --head`
node and a `dask scheduler` with `dask worker`s found through a scheduler file. The command line
attaches by the engines' own conventions (RAY_ADDRESS; --scheduler-file) and must print the same
analysis as the in-memory path. A second `ray start` node joins the head and is killed mid-task: its
tasks must be retried on the head. Each cluster runs in its own process group and is stopped with it.
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
from tracediag.derive.summary import RankSummary
from tracediag.execute.driver import analyze_ranks

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


needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install 'tracediag[ray]')"
)


def _ray_env() -> dict[str, str]:
    """The environment of every Ray process here: node deaths noticed within about a second (the GCS
    checks each raylet every 0.5 s, by default every 3 s with five misses allowed). Ray's loopback
    switch (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``) is left off: it refuses a second node, so the
    nodes bind this machine's own address."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    env.update(RAY_health_check_period_ms="500", RAY_health_check_timeout_ms="1000",
               RAY_health_check_failure_threshold="2")  # fmt: skip
    return env


def _agent_ports() -> list[str]:
    """Free ports for a node's agents: two nodes on one machine cannot share Ray's default ones."""
    names = (
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "runtime-env-agent-port",
        "metrics-export-port",
    )
    return [f"--{name}={_free_port()}" for name in names]


def _descendants(root: int) -> list[int]:
    """`root` and every process below it (a raylet starts its workers in sessions of their own)."""
    parent = {}
    for entry in Path("/proc").iterdir():
        pid = entry.name
        with suppress(OSError, ValueError, IndexError):
            text = Path(f"/proc/{pid}/stat").read_text()
            parent[int(pid)] = int(text[text.rindex(")") + 2 :].split()[1])
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(p for p, pp in parent.items() if pp == pid)
    return out


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (killed, not yet reaped)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] not in "ZX"


def _kill_tree(proc: subprocess.Popen) -> None:
    for pid in _descendants(proc.pid):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def ray_head():
    """A `ray start --head` node of one CPU, shared by this module's Ray tests: its address and environment."""
    port, env = _free_port(), _ray_env()
    temp = Path(tempfile.mkdtemp(prefix="td-ray-"))  # short: Ray's socket paths must fit 107 bytes
    head = [str(BIN / "ray"), "start", "--head", "--block", f"--port={port}", "--num-cpus=1", "--disable-usage-stats",
            "--include-dashboard=false", f"--dashboard-port={_free_port()}", f"--temp-dir={temp}",
            *_agent_ports()]  # fmt: skip
    proc = subprocess.Popen(head, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (_listening(port) and (temp / "session_latest" / "sockets" / "raylet").exists()):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start --head did not start (exit {proc.poll()})")
            time.sleep(0.2)
        # Ray >= 2.59 turns token authentication on for the cluster: a driver opts in with RAY_AUTH_MODE
        yield f"127.0.0.1:{port}", {**env, "RAY_AUTH_MODE": "token"}
    finally:
        _kill_tree(proc)
        shutil.rmtree(temp, ignore_errors=True)


@needs_ray
def test_attach_to_ray_start_head(ray_head, tmp_path):
    address, env = ray_head
    doc = _analyze(["--executor", "ray"], {**env, "RAY_ADDRESS": address}, tmp_path / "out")
    assert doc == _expected()


_DRIVER = """
import sys, cloudpickle, orjson, ray.cloudpickle, _faults
from tracediag.execute.driver import analyze_ranks
cloudpickle.register_pickle_by_value(_faults)
ray.cloudpickle.register_pickle_by_value(_faults)  # the workers cannot import the tests
analysis, summaries = analyze_ranks(
    sys.argv[1], out=sys.argv[2], executor="ray", address=sys.argv[3], task_fn=_faults.stall_on_doomed_node
)
rows = summaries.manifest.select("key", "rank", "attempt", "worker").to_dicts()
print(orjson.dumps({"analysis": analysis.to_dict(), "rows": rows}).decode())
"""


@needs_ray
def test_ray_node_killed_mid_task_is_retried_on_the_head(ray_head, tmp_path):
    """A second `ray start` node joins the head; the tasks placed on it stall after writing their
    outputs, and the whole node (raylet, agents, workers) is killed. Ray retries them on the head,
    and the analysis equals the local executor's."""
    import _faults

    address, env = ray_head
    log = tmp_path / "node.log"
    node_cmd = [str(BIN / "ray"), "start", "--block", f"--address={address}", "--num-cpus=2", "--disable-usage-stats",
                f"--node-manager-port={_free_port()}", f"--object-manager-port={_free_port()}",
                *_agent_ports()]  # fmt: skip
    with log.open("w") as sink:
        node = subprocess.Popen(node_cmd, env={**env, _faults.DOOMED_NODE: "1"}, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    out, driver = tmp_path / "out", None
    stalled = out / "stalled"
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text():
            if node.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the second node did not start (exit {node.poll()}):\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        tests = str(Path(_faults.__file__).parent)
        driver = subprocess.Popen(
            [sys.executable, "-c", _DRIVER, str(RUN), str(out), address],
            env={**env, "PYTHONPATH": tests},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # the head's one CPU waits for a task to stall on the second node, so Ray places tasks there
        while not (stalled.is_dir() and [p for p in stalled.iterdir() if p.suffix != ".tmp"]):
            if driver.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no task stalled on the second node:\n{driver.communicate()[1][-3000:]}")
            time.sleep(0.05)
        _kill_tree(node)  # mid-task: the stalled tasks have written their outputs but not reported
        result, err = driver.communicate(timeout=240)
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
        if node.poll() is None:
            _kill_tree(node)
    assert driver.returncode == 0, err[-3000:]
    doc = orjson.loads(result.strip().splitlines()[-1])
    killed = {p.name: int(p.read_text()) for p in stalled.iterdir() if p.suffix != ".tmp"}
    rows = {r["key"]: r for r in doc["rows"]}
    for key, pid in killed.items():
        assert rows[key]["attempt"] == 2, rows[key]  # the first attempt died with its node; the retry finished
        assert rows[key]["worker"].rsplit(":", 1)[1] != str(pid)
        assert not _running(pid)
    assert sorted(r["rank"] for r in doc["rows"] if r["rank"] is not None) == [0, 1, 2, 3]
    # nothing twice: one file per table for every rank, no temporary file left
    for rank in range(4):
        names = sorted(p.name for p in (out / "ranks" / f"rank={rank:05d}").iterdir())
        assert names == sorted(f"{t}.parquet" for t in RankSummary.names())
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name]
    local, _ = analyze_ranks(RUN, out=str(tmp_path / "local"), executor="local", workers=2)
    assert doc["analysis"] == orjson.loads(orjson.dumps(local.to_dict()))


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

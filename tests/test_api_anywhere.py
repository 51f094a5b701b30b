"""The Python API works wherever Python runs: each case is a real Python process, as a user runs it.

These are the suite's tests of parallel loading (`jobs=2`); every other test reads with one worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

import tracediag
from tracediag.ingest.workers import _Worker, map_in_workers

RUN = "fixtures/runs/straggler_persistent/"

SNIPPET = f"""
import tracediag
run = tracediag.load({RUN!r}, jobs=2)
analysis = tracediag.analyze(run)
print(run.events.height, analysis.findings[0].cause, analysis.findings[0].ranks)
"""

CASES = {
    # the README snippet saved as a file, no `if __name__ == "__main__":` guard
    "script": lambda path: [sys.executable, str(path)],
    # `python - <<EOF`
    "stdin": lambda path: [sys.executable, "-"],
    # `python -c` (no main file at all, as in a notebook kernel)
    "command": lambda path: [sys.executable, "-c", path.read_text()],
}


def _expected() -> str:
    run = tracediag.load(ROOT / RUN, jobs=1)
    f = tracediag.analyze(run).findings[0]
    return f"{run.events.height} {f.cause} {f.ranks}"


def _run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.fixture(scope="module")
def expected() -> str:
    return _expected()


@pytest.mark.parametrize("case", sorted(CASES))
def test_load_in_parallel_without_main_guard(case, expected, tmp_path):
    script = tmp_path / "s.py"
    script.write_text(SNIPPET)
    done = _run(CASES[case](script), stdin=SNIPPET if case == "stdin" else None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected
    assert done.stderr == ""  # no traceback, and the workers started (no fallback warning)


def test_load_from_a_thread_of_a_service(expected, tmp_path):
    body = textwrap.indent(SNIPPET, "    ")
    script = tmp_path / "service.py"
    script.write_text(
        f"import threading\n\ndef handle():\n{body}\n\nt = threading.Thread(target=handle)\nt.start()\nt.join()\n"
    )
    done = _run([sys.executable, str(script)])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected
    assert done.stderr == ""


def _forked(tmp_path, before_fork: str) -> subprocess.CompletedProcess:
    """Run SNIPPET in a child forked after `before_fork` ran in the parent."""
    body = textwrap.indent(SNIPPET, "    ")
    script = tmp_path / "forked.py"
    script.write_text(
        f"import os, sys\n{before_fork}\npid = os.fork()\nif pid == 0:\n"
        f"{body}\n    sys.stdout.flush()\n    sys.stderr.flush()\n    os._exit(0)\n"
        "_, status = os.waitpid(pid, 0)\nsys.exit(os.waitstatus_to_exitcode(status))\n"
    )
    done = _run([sys.executable, str(script)])
    assert done.returncode == 0, done.stderr
    return done


def test_load_in_a_forked_child(expected, tmp_path):
    done = _forked(tmp_path, "")
    assert done.stdout.strip() == expected
    assert done.stderr == ""


def test_no_worker_can_start_falls_back_with_one_warning(expected, tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import sys\nsys.executable = ''\n" + SNIPPET)
    done = _run([sys.executable, str(script)])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected
    lines = [line for line in done.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(lines) == 1
    assert "no Python executable to start workers with" in lines[0]
    assert "in this process instead" in lines[0]


def test_a_worker_that_dies_reading_a_file_fails_that_file_only():
    """A worker killed mid-file (out of memory, a crash in native code) is not retried in the caller's
    process, where it could take the caller down: that file gets an error line."""
    got = map_in_workers(os._exit, [3], 1, crashed=lambda task, why: (task, why))
    assert got == [(3, "a worker process stopped (exit status 3)")]


def test_a_worker_that_cannot_start_falls_back_in_process(expected, tmp_path):
    """A Python that cannot run the worker (here: one that exits at once) is caught by the start
    handshake: the tasks run in the calling process after one warning."""
    script = tmp_path / "s.py"
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\necho not python\nexit 1\n")
    fake.chmod(0o755)
    script.write_text(f"import sys\nsys.executable = {str(fake)!r}\n" + SNIPPET)
    done = _run([sys.executable, str(script)])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected
    lines = [line for line in done.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(lines) == 1
    assert "a worker process did not start (exit status 1" in lines[0]


def test_a_fork_after_import_works_and_warns_what_polars_cannot_survive(expected, tmp_path):
    """Forked after `import tracediag` (a preloading server): loading works, and one warning says that
    polars work in the parent before the fork would hang the child (polars' pool does not survive fork)."""
    done = _forked(tmp_path, "import tracediag")
    assert done.stdout.strip() == expected
    lines = [line for line in done.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(lines) == 1
    assert "forked from one that had imported tracediag" in lines[0]


def test_what_a_task_raises_in_a_worker_is_raised_in_the_caller():
    """A task that raises (a bug, not bad input: readers return bad input as error lines) raises the
    same exception in the caller as it would in-process, not a dead worker."""
    with pytest.raises(ValueError, match="invalid literal for int"):
        map_in_workers(int, ["7", "x"], 2, crashed=lambda task, why: (task, why))
    assert map_in_workers(int, ["7", "8"], 2, crashed=lambda task, why: (task, why)) == [7, 8]


def test_the_caller_reads_too_and_starts_one_worker_fewer(tmp_path):
    """With `in_caller`, the calling process is one of the `jobs`: it takes the first task at once
    (before any worker starts) and one worker, not two, takes the others while it works. The first task
    ends only once the other three have left their mark (a file each), so the order is the tasks' own."""
    done = str(tmp_path)
    wait = (
        f"(next(t for t in __import__('itertools').count() if len(__import__('os').listdir({done!r})) >= 3 "
        "or t > 3_000_000), __import__('os').getpid())[1]"
    )
    mark = f"open(__import__('os').path.join({done!r}, str(__import__('uuid').uuid4())), 'w').close()"
    fast = f"{mark} or __import__('os').getpid()"
    got = map_in_workers(eval, [wait, fast, fast, fast], 2, crashed=lambda task, why: why, in_caller=True)
    assert len(list(tmp_path.iterdir())) == 3
    assert got[0] == os.getpid()
    assert len(set(got[1:])) == 1
    assert got[1] != os.getpid()


def test_what_a_task_raises_in_the_caller_is_raised_as_it_is():
    """A task run by the caller raises its own exception, not the text a worker's would travel as."""

    class Unpicklable(Exception):
        def __reduce__(self):
            msg = "no"
            raise TypeError(msg)

    def boom(_task):
        msg = "x"
        raise Unpicklable(msg)

    with pytest.raises(Unpicklable):
        map_in_workers(boom, ["only"], 2, crashed=lambda task, why: why, in_caller=True)
    assert map_in_workers(int, ["7"], 1, crashed=lambda task, why: why, in_caller=True) == [7]


def test_workers_share_the_cpus_among_their_polars_threads(monkeypatch):
    """N workers at once get the CPUs' share each (N polars pools of every CPU would oversubscribe the
    machine), unless POLARS_MAX_THREADS says otherwise."""
    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    cpus = os.cpu_count() or 1
    for of, threads in ((1, cpus), (2 * cpus, 1)):
        worker = _Worker(of=of)
        try:
            assert worker.call(os.getenv, "POLARS_MAX_THREADS") == str(threads)
        finally:
            worker.close()
    monkeypatch.setenv("POLARS_MAX_THREADS", "3")
    worker = _Worker(of=2 * cpus)
    try:
        assert worker.call(os.getenv, "POLARS_MAX_THREADS") == "3"
    finally:
        worker.close()


def test_workers_import_their_parents_tracediag_not_one_in_the_current_directory(expected, tmp_path):
    """`python -c` puts the current directory first on a worker's import path: run from a folder holding
    another `tracediag` (a checkout of another version), the workers imported that one. They import the
    parent's own: no worker fails to start, no fallback warning."""
    here = tmp_path / "elsewhere"
    (here / "tracediag").mkdir(parents=True)
    (here / "tracediag" / "__init__.py").write_text("raise ImportError('the tracediag of the current directory')\n")
    script = tmp_path / "s.py"
    snippet = SNIPPET.replace(repr(RUN), repr(str(ROOT / RUN)))
    script.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n" + snippet)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=here, timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected
    assert "RuntimeWarning" not in done.stderr, done.stderr

"""The Python API works wherever Python runs: each case is a real Python process, as a user runs it.

These are the suite's tests of parallel loading (`jobs=2`); every other test reads with one worker.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

import tracediag

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


def test_load_in_a_forked_child(expected, tmp_path):
    body = textwrap.indent(SNIPPET, "    ")
    script = tmp_path / "forked.py"
    script.write_text(
        "import os, sys\npid = os.fork()\nif pid == 0:\n"
        f"{body}\n    sys.stdout.flush()\n    os._exit(0)\n"
        "_, status = os.waitpid(pid, 0)\nsys.exit(os.waitstatus_to_exitcode(status))\n"
    )
    done = _run([sys.executable, str(script)])
    assert done.returncode == 0, done.stderr
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

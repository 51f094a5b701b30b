"""Shared test helpers: where fixtures live, the CLI runner, and tests that read ../shared."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
KINETO = FIXTURES / "kineto"
SHARED = ROOT.parent / "shared"
SAMPLES = SHARED / "trace-samples"
RUNS = FIXTURES / "runs"
LATENESS_PENDING: dict[str, str] = {
    "gil_thread": "labelled host_straggler on steps 2..9 (a GIL-holding Python thread delays rank 1's host); "
    "tracediag names host_straggler on rank 1, steps 3..8: only there does it cause the waiting",
    "mix_strag_input_gen": "labelled input_bound (every rank) on 2..9 and compute_straggler rank 1 on 2..9; "
    "input_bound is found on every step, the straggler only on 4, 5, 8, 9 (its compute 1.0-1.6x on the others "
    "at load 7-18) and a second, noise straggler on rank 3 step 7 (its compute 2.6x there, not injected)",
    "mix_strag_host_same": "labelled host_straggler rank 2 on 3, 5, 7 beside compute_straggler rank 1 on 2, 4, 6; "
    "rank 2 is named on 3, 5 only: last at 6 of 12 instances (no more than chance), its steps are those reaching "
    "half its worst step's waiting, and on 7 the peers wait 0.2-1.2 s (rank 0 computes 2.4x there by noise)",
}
"""Real runs of fixtures/runs (made by make_lateness_runs.py) whose manifest verdict tracediag does not
give yet, with the reason. Verdict tests xfail on them strictly: the detector that gets one right
removes it here."""
LOAD_PENDING: dict[str, str] = {}
"""Runs of fixtures/runs that tracediag cannot load yet: every test over all runs leaves them out
(`loadable_runs`), the verdict tests xfail on them strictly."""


def loadable_runs() -> list[Path]:
    """Every run folder of fixtures/runs with a manifest, less those in `LOAD_PENDING`."""
    return sorted(p.parent for p in RUNS.glob("*/manifest.json") if p.parent.name not in LOAD_PENDING)


TORCH_PYTHON = "TRACEDIAG_TORCH_PYTHON"
"""A Python with torch 2.13 for the tests that run real torch (torchfrtrace, the live watch job); torch is
never a dependency of tracediag, so .ci/run installs it in a venv of its own and names it here."""


def torch_python() -> str | None:
    """An interpreter with torch: this one, or the one $TRACEDIAG_TORCH_PYTHON names."""
    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    other = os.environ.get(TORCH_PYTHON)
    return other if other and Path(other).is_file() else None


REQUIRE_SHARED = "TRACEDIAG_REQUIRE_SHARED"
"""Set to 1 (as `.ci/run` does) and a test whose ../shared data is missing fails instead of skipping,
so the accuracy and reference tests cannot silently stop running."""


def needs_shared(path: Path) -> pytest.MarkDecorator:
    """Mark a test (or a module, as `pytestmark`) that reads `path` under ../shared."""
    return pytest.mark.needs_shared(path)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs_shared(path): the test reads this path under ../shared")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs_shared"):
        path = Path(mark.args[0])
        if path.exists():
            continue
        shown = os.path.relpath(path, ROOT)
        if os.environ.get(REQUIRE_SHARED) == "1":
            pytest.fail(f"{shown} is missing and {REQUIRE_SHARED}=1: this test must run here", pytrace=False)
        pytest.skip(f"{shown} is not present")


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail the case (instead of hanging the suite) when it runs past `seconds` (main thread only)."""

    def expire(*_: object) -> None:
        msg = f"ran past {seconds} s"
        raise TimeoutError(msg)

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def invoke_hostile(args: list, seconds: float = 120) -> tuple[int, str, str]:
    """Run the CLI on a hostile input: (exit code, stdout, stderr), failing on a traceback or internal error."""
    from tracediag.cli import cli

    with time_limit(seconds):
        result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    assert "internal error" not in result.output, result.output
    return result.exit_code, result.stdout, result.stderr

"""Tests that read ../shared skip where it is absent, and fail instead under TRACEDIAG_REQUIRE_SHARED=1 (CI)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from conftest import REQUIRE_SHARED, ROOT

TEST = """
from pathlib import Path
from conftest import needs_shared

@needs_shared(Path(__file__).parent / "no-such-shared-folder")
def test_reads_shared():
    assert False, "must not run without its data"

def test_other():
    pass
"""


def _pytest(folder, require: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_SHARED}
    if require is not None:
        env[REQUIRE_SHARED] = require
    args = [sys.executable, "-m", "pytest", str(folder), "-p", "no:cacheprovider", "-rsf"]
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, cwd=folder)


def test_missing_shared_data_skips_or_fails_as_ci_asks(tmp_path):
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_x.py").write_text(TEST)
    local = _pytest(tmp_path, None)
    assert local.returncode == 0, local.stdout
    assert "1 passed, 1 skipped" in local.stdout
    assert "no-such-shared-folder is not present" in local.stdout
    ci = _pytest(tmp_path, "1")
    assert ci.returncode == 1, ci.stdout
    assert "1 passed, 1 error" in ci.stdout  # fails at setup: the test body never runs
    assert f"no-such-shared-folder is missing and {REQUIRE_SHARED}=1" in ci.stdout
    assert "must not run without its data" not in ci.stdout


def test_ci_script_sets_the_variable():
    assert f"export {REQUIRE_SHARED}=1" in (ROOT / ".ci" / "run").read_text()

"""Shared test helpers: where fixtures live, and the CLI runner."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
KINETO = FIXTURES / "kineto"
SHARED = ROOT.parent / "shared"
SAMPLES = SHARED / "trace-samples"

needs_shared = pytest.mark.skipif(not SAMPLES.exists(), reason="../shared/trace-samples is not present")


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()

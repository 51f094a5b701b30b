"""Detectors: one module per cause, each `detect(facts, *, thresholds, ...) -> list[Finding]`.

A detector reads `Facts` and `Thresholds` only; what it needs of other causes' findings is passed in
by the cause registry (`tracediag.causes`), which runs them in order and ranks their findings.
"""

from __future__ import annotations

from tracediag.detect.facts import Facts
from tracediag.detect.thresholds import Thresholds

__all__ = ["Facts", "Thresholds"]

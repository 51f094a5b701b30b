"""Compare an analysis from per-rank summaries with the in-memory one: everything but the what-if pricing.

From summaries the what-if replay does not run (it reads every rank's event timeline), so findings keep
the detectors' estimate of time lost and the analysis says so in a warning; all else must be equal.
"""

from __future__ import annotations

from tracediag.analyzing import NO_REPLAY

PRICED = ("time_lost_ns", "step_time_without_ns", "whatif")


def unpriced(doc: dict) -> dict:
    """`Analysis.to_dict()` without the what-if section, the fields it prices, and its warnings."""
    out = {k: v for k, v in doc.items() if k != "whatif"}
    findings = [{k: v for k, v in f.items() if k not in PRICED} for f in doc["findings"]]
    out["findings"] = sorted(findings, key=lambda f: (f["cause"], f["ranks"], f["steps"]))
    out["warnings"] = [w for w in doc["warnings"] if w != NO_REPLAY and not w.startswith("what-if replay")]
    return out

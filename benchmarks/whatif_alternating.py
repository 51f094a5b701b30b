#!/usr/bin/env python3
"""The what-if of a late rank against its real counterfactual, inside one run.

The alternating runs of fixtures/runs (``*_alt``, made by make_lateness_runs.py) carry their cause on
odd steps only: the even steps are the same job, on the same machine at the same time, without it.
The what-if of the cause's finding (the median over its steps of the step replayed without it) should
give the even steps' median observed step (issue 24's target: within 15%). Prints a markdown row per run.

    python benchmarks/whatif_alternating.py [RUN_DIR ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import tracediag

RUNS = Path(__file__).resolve().parent.parent / "fixtures" / "runs"


def score(run_dir: Path) -> dict[str, object]:
    """The run's cause, its what-if, the counterfactual steps' median and the what-if's error."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    analysis = tracediag.analyze(tracediag.load(run_dir, jobs=1))
    found = [f for f in analysis.findings if f.cause == manifest["cause"]]
    observed = {s.step: s.observed_ns for s in analysis.whatif.steps}
    healthy = [ns for step, ns in observed.items() if step not in manifest["steps"]]
    injected = [ns for step, ns in observed.items() if step in manifest["steps"]]
    row: dict[str, object] = {
        "run": run_dir.name,
        "cause": manifest["cause"],
        "found": [f"{f.cause} {list(f.ranks)} {list(f.steps)}" for f in analysis.findings],
        "healthy_ms": statistics.median(healthy) / 1e6,
        "injected_ms": statistics.median(injected) / 1e6,
        "whatif_ms": None,
        "error": None,
    }
    if found and found[0].step_time_without_ns is not None:
        row["whatif_ms"] = found[0].step_time_without_ns / 1e6
        row["error"] = row["whatif_ms"] / row["healthy_ms"] - 1
    return row


def main() -> None:
    dirs = [Path(a) for a in sys.argv[1:]] or sorted(p for p in RUNS.glob("*_alt") if p.is_dir())
    print("| run | cause | found | healthy steps | injected steps | what-if | what-if error |")
    print("|---|---|---|---|---|---|---|")
    for d in dirs:
        r = score(d)
        w = "—" if r["whatif_ms"] is None else f"{r['whatif_ms']:.1f} ms"
        e = "—" if r["error"] is None else f"{r['error']:+.1%}"
        print(
            f"| {r['run']} | {r['cause']} | {'; '.join(r['found']) or 'none'} | {r['healthy_ms']:.1f} ms | "
            f"{r['injected_ms']:.1f} ms | {w} | {e} |"
        )


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Cost of the what-if stage against the rest of the analysis, in the same process and run.

    python benchmarks/bench_whatif.py [RUN_DIR ...]   (default: the largest fixtures/runs scenarios)

Per run: seconds for derive + detect (what `analyze` did before the what-if), and for building the
replay graph + pricing every finding (one replay per finding, the baseline and the combined what-if).
Best of 3 each.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import tracediag
from tracediag.causes import detect_all, price
from tracediag.reduce import derive_facts
from tracediag.whatif import graph_of

REPO = Path(__file__).resolve().parent.parent
DEFAULT = ("pipeline_gpipe_m8", "straggler_persistent", "healthy_tp_dp")


def best(fn, n: int = 3) -> tuple[float, object]:
    times, out = [], None
    for _ in range(n):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main(argv: list[str]) -> None:
    paths = [Path(p) for p in argv] or [REPO / "fixtures" / "runs" / d for d in DEFAULT]
    print("| run | events | derive + detect | what-if (graph + price) | ratio | sync operations | findings |")
    print("|---|---|---|---|---|---|---|")
    for p in paths:
        run = tracediag.load(p, jobs=1)
        t_base, (facts, replay, found) = best(lambda run=run: _derive_detect(run))
        t_w, (priced, section) = best(lambda f=found, fa=facts, rp=replay: _whatif(f, fa, rp))
        print(
            f"| {p.name} | {run.events.height:,} | {t_base:.3f} s | {t_w:.3f} s | {t_w / t_base:.2f} | "
            f"{section.operations} | {len(priced)} |"
        )


def _derive_detect(run):
    derived = derive_facts(run)
    return derived.facts, derived.replay, detect_all(derived.facts)


def _whatif(found, facts, replay):
    return price(found, facts, graph_of(facts, replay))


if __name__ == "__main__":
    main(sys.argv[1:])

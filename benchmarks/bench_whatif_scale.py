#!/usr/bin/env python3
"""How the what-if stage grows with ranks: the real straggler run's 4 ranks replicated to N ranks
(copies of ranks 0, 1, 3 with their own clock shifts; rank 2 stays the straggler), then derive +
detect against the what-if (graph + price), in the same process. Best of 2.

    python benchmarks/bench_whatif_scale.py [N ...]   (default 4 16 64)
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
from bench_whatif import best  # the same timing rule (script directory on sys.path)

import tracediag
from tracediag.causes import detect_all, price
from tracediag.reduce import derive_facts
from tracediag.run import Run
from tracediag.whatif import graph_of

RUN = Path(__file__).resolve().parent.parent / "fixtures" / "runs" / "straggler_persistent"


def replicate(run: Run, n: int) -> Run:
    """`n` ranks: rank 2 once, the healthy ranks copied with a 37 µs clock shift per copy."""
    ev = run.events
    parts = [ev]
    healthy = [0, 1, 3]
    for k, new in enumerate(range(4, n)):
        src = healthy[k % 3]
        parts.append(
            ev.filter(pl.col("rank") == src).with_columns(
                rank=pl.lit(new, pl.Int32), ts=pl.col("ts") + 37_000 * (k + 1)
            )
        )
    return Run(events=pl.concat(parts).sort("rank", "ts"), meta=run.meta)


def main(argv: list[str]) -> None:
    base = tracediag.load(RUN, jobs=1)
    print("| ranks | events | derive + detect | what-if | ratio | sync operations | finding |")
    print("|---|---|---|---|---|---|---|")
    for n in [int(a) for a in argv] or [4, 16, 64]:
        run = replicate(base, n)
        t0, derived = best(lambda run=run: derive_facts(run), n=2)
        facts = derived.facts
        found = detect_all(facts)
        t1, (priced, w) = best(lambda f=found, fa=facts, d=derived: price(f, fa, graph_of(fa, d.replay)), n=2)
        top = priced[0]
        print(
            f"| {n} | {run.events.height:,} | {t0:.2f} s | {t1:.2f} s | {t1 / t0:.2f} | {w.operations} | "
            f"{top.cause} {list(top.ranks)}: {top.step_time_without_ns / 1e6:.0f} ms |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])

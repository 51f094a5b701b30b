#!/usr/bin/env python3
"""The whole `tracediag.analyze` at many ranks, against another checkout in the same rounds.

    python benchmarks/bench_analyze_scale.py [--ranks 1024] [--rounds 3] [--baseline DIR]

The real straggler run (fixtures/runs/straggler_persistent, 4 gloo ranks) replicated to `--ranks`
ranks: rank 2 stays the straggler, every other rank copies one of the healthy ranks 0, 1, 3 with its
own clock shift. Each round runs one fresh process per checkout (alternating which goes first) that
builds the run (not counted), analyses it once to warm up and once timed: process CPU
(`time.process_time`, every polars thread) and wall seconds, and the top finding (both checkouts
must name rank 2). Reported: the medians over rounds and the CPU ratio this / baseline — issue 24's
"the new analysis costs at most 1.2x today's at 1,024 ranks", measured against the checkout before it
(e.g. a `git worktree` of that commit).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKER = """
import json, sys, time
import polars as pl
import tracediag
from tracediag.run import Run

n = int(sys.argv[1])
run = tracediag.load(sys.argv[2], jobs=1)
ev = run.events
parts = [ev]
healthy = [0, 1, 3]
for k, new in enumerate(range(4, n)):
    src = healthy[k % 3]
    copy = ev.filter(pl.col("rank") == src)
    parts.append(copy.with_columns(rank=pl.lit(new, pl.Int32), ts=pl.col("ts") + 37_000 * (k + 1)))
run = Run(events=pl.concat(parts).sort("rank", "ts"), meta=run.meta)
tracediag.analyze(run)
t0, w0 = time.process_time(), time.perf_counter()
a = tracediag.analyze(run)
cpu, wall = time.process_time() - t0, time.perf_counter() - w0
top = a.findings[0] if a.findings else None
print(json.dumps({"cpu_s": cpu, "wall_s": wall, "events": ev.height * n // 4,
                  "top": None if top is None else [str(top.cause), list(top.ranks)[:4]]}))
"""


def _measure(checkout: Path, ranks: int) -> dict:
    source = checkout / "fixtures" / "runs" / "straggler_persistent"
    out = subprocess.run(
        [sys.executable, "-c", WORKER, str(ranks), str(source)],
        env={**os.environ, "PYTHONPATH": str(checkout)},
        cwd=checkout,  # `python -c` puts the working directory first on sys.path
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path, help="another checkout's root, measured in the same rounds")
    args = ap.parse_args()
    checkouts = {"this": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    got: dict[str, list[dict]] = {k: [] for k in checkouts}
    for i in range(args.rounds):
        order = list(checkouts.items())
        for name, path in order if i % 2 == 0 else order[::-1]:
            got[name].append(_measure(path, args.ranks))
    print(f"{args.ranks} ranks, {got['this'][0]['events']:,} events; medians of {args.rounds} rounds")
    for name, rows in got.items():
        cpu = statistics.median(r["cpu_s"] for r in rows)
        wall = statistics.median(r["wall_s"] for r in rows)
        print(f"{name:9s} CPU {cpu:7.2f} s  wall {wall:7.2f} s  top finding {rows[0]['top']}")
    if args.baseline:
        ratio = statistics.median(r["cpu_s"] for r in got["this"]) / statistics.median(
            r["cpu_s"] for r in got["baseline"]
        )
        print(f"CPU ratio this / baseline: {ratio:.2f}")


if __name__ == "__main__":
    main()

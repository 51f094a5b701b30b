"""CPU seconds of `tracediag.analyze` per stage, on a loaded run (issue 12, item 5: the analysis side).

    python benchmarks/bench_analysis_cpu.py [FOLDER] [--repeat 5] [--rounds 3] [--baseline DIR]

FOLDER defaults to benchmarks/data/a100x8 (made by bench_vs_hta.py). Each round runs a fresh process
per checkout that loads the run once (not counted) and then analyses it `--repeat` times; a stage's
number is the process CPU (`time.process_time`: every polars thread included) of each call of the
functions `derive.per_rank.rank_tables` makes, then `reduce.reduce` and the run checks, and of a whole
`tracediag.analyze` (the one figure an older baseline without those stages gives too). Reported:
the median over rounds of each process's median. `--baseline DIR` runs the tracediag of another
checkout (e.g. a `git worktree` of main) in the same rounds, alternating, so a change is measured
against what it replaces under the same load.
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
import functools, json, statistics, sys, time
import tracediag
import tracediag.derive.per_rank as per_rank
try:
    import tracediag.reduce as reducing
    from tracediag.same_run import check_same_run
except ImportError:  # a checkout from before the modules were renamed (issue 27)
    import tracediag.analyzing as reducing
    from tracediag.sanity import check_same_run

folder, repeat = sys.argv[1], int(sys.argv[2])
run = tracediag.load(folder, jobs=1)
spent = {}

def timed(name, f):
    @functools.wraps(f)
    def g(*a, **k):
        t0 = time.process_time()
        try:
            return f(*a, **k)
        finally:
            spent[name] = spent.get(name, 0.0) + time.process_time() - t0
    return g

for name, f in list(vars(per_rank).items()):
    if callable(f) and not isinstance(f, type) and getattr(f, "__module__", "").startswith("tracediag."):
        if name != "rank_tables":
            setattr(per_rank, name, timed(name, f))
tracediag.analyze(run)  # warm-up: imports, regex caches
runs = []
for _ in range(repeat):
    spent.clear()
    ta = time.process_time()
    tracediag.analyze(run)
    analyze = time.process_time() - ta
    if not hasattr(reducing, "reduce"):  # an older checkout (a baseline): its whole analyze only
        runs.append({"analyze": analyze})
        continue
    spent.clear()
    t0 = time.process_time()
    check_same_run(run)
    t1 = time.process_time()
    tables = per_rank.rank_tables(run.events)
    t2 = time.process_time()
    reducing.reduce(tables, run.meta, allow_mixed=True)
    t3 = time.process_time()
    whole = {"check_same_run": t1 - t0, "rank_tables": t2 - t1, "reduce": t3 - t2, "total": t3 - t0, "analyze": analyze}
    runs.append({**spent, **whole})
print(json.dumps({k: statistics.median(r.get(k, 0.0) for r in runs) for k in runs[0]}))
"""


def _measure(checkout: Path, folder: Path, repeat: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    # run in the checkout: `python -c` puts the working directory first on sys.path, so from another
    # checkout's root both runs would import that one's tracediag
    out = subprocess.run(
        [sys.executable, "-c", WORKER, str(folder.resolve()), str(repeat)],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", type=Path, default=ROOT / "benchmarks" / "data" / "a100x8")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path, help="another checkout's root, measured in the same rounds")
    args = ap.parse_args()
    if not args.folder.is_dir():
        sys.exit(f"{args.folder}: no such folder (python benchmarks/bench_vs_hta.py makes benchmarks/data/a100x8)")
    checkouts = {"this": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    results: dict[str, list[dict[str, float]]] = {k: [] for k in checkouts}
    for i in range(args.rounds):
        order = list(checkouts.items())
        for name, path in order if i % 2 == 0 else order[::-1]:
            results[name].append(_measure(path, args.folder, args.repeat))
    stages = list(dict.fromkeys(k for rs in results.values() for r in rs for k in r))
    names = list(checkouts)
    print(f"{'stage':24s}" + "".join(f"{n:>10s}" for n in names) + ("     ratio" if args.baseline else ""))
    for stage in stages:
        med = {n: statistics.median(r.get(stage, 0.0) for r in results[n]) for n in names}
        ratio = f"{med['this'] / med['baseline']:10.2f}" if args.baseline and med["baseline"] else ""
        print(f"{stage:24s}" + "".join(f"{med[n]:10.3f}" for n in names) + ratio)
    print(f"(CPU seconds; median over {args.rounds} processes of each one's median of {args.repeat} calls)")


if __name__ == "__main__":
    main()

"""A longer run of the seeded CLI fuzzer of tests/fuzz (the test suite runs 150 cases): every kind, the
`--resume` summaries included, for N seeds or a time budget. Prints each failing seed with the command that
replays it, then the cases run, the exit statuses and the time per kind.

    python benchmarks/fuzz_campaign.py --seeds 2000 [--start 0] [--budget 600] [--kinds kineto,nsys]

Exit status 1 when a case broke the invariant (`tests/fuzz/cases.py`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's tracediag, not the installed one

from fuzz import cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2000)
    parser.add_argument("--start", type=int, default=100_000, help="first seed (the suite runs from 0)")
    parser.add_argument("--budget", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--kinds", default=None, help="comma-separated kinds (default: all, resume included)")
    args = parser.parse_args()
    weights = {**cases.WEIGHTS, "resume": 1}
    if args.kinds:
        weights = {k: w for k, w in weights.items() if k in args.kinds.split(",")}
    began = time.perf_counter()
    exits: Counter[tuple[str, int]] = Counter()
    seconds: defaultdict[str, float] = defaultdict(float)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sides = cases.side_files(root / "sides", summaries="resume" in weights)
        for seed in range(args.start, args.start + args.seeds):
            if args.budget is not None and time.perf_counter() - began > args.budget:
                break
            case = cases.build(seed, root / str(seed), sides, weights)
            before = cases.digests(cases.inputs(case))
            t = time.perf_counter()
            outcome = cases.run(case)
            seconds[case.kind] += time.perf_counter() - t
            exits[case.kind, outcome.exit_code] += 1
            found = cases.problems(outcome)
            if cases.digests(cases.inputs(case)) != before:
                found.append("an input changed")
            if found:
                failures += 1
                tail = " | ".join(outcome.output.strip().splitlines()[-3:])
                print(f"FAIL seed {seed} {case.kind} ({case.what}): {found}: {tail}")
                kinds = f" --kinds {args.kinds}" if args.kinds else ""
                print(f"  replay: python benchmarks/fuzz_campaign.py --start {seed} --seeds 1{kinds}")
    total = sum(exits.values())
    print(f"{total} cases in {time.perf_counter() - began:.0f} s, {failures} broke the invariant")
    for kind in sorted(seconds):
        by_exit = ", ".join(f"exit {code}: {n}" for (k, code), n in sorted(exits.items()) if k == kind)
        n = sum(v for (k, _), v in exits.items() if k == kind)
        print(f"  {kind:8} {n:5} cases, {seconds[kind] / n * 1000:6.0f} ms each ({by_exit})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

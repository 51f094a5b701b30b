#!/usr/bin/env python3
"""Start-up CPU-s of the command line (issue 31 item 3), against a baseline checkout, in one run.

    python benchmarks/bench_startup.py [--baseline DIR] [--rounds 7] [--tiny GLOB] [--run DIR]

Each case is a fresh ``python`` of the checkout; its CPU seconds are `resource.getrusage` of the
children (user + system, every thread), the median over the rounds, the checkouts alternated in each
round (which goes first alternates too), so that the machine's load falls on both alike:

- ``python``: the interpreter alone (``python -c pass``), the floor under every other row;
- ``--help`` and ``analyze --help``: ``python -m tracediag ...``;
- ``analyze tiny``: ``tracediag analyze TINY --format json -o FILE`` of a real 2-rank run of 14 KB per
  rank, whose analysis is a few CPU-ms: the whole process is nearly all start-up;
- ``fixed``: what an analyze spends before and besides its real work: a process that runs the tiny
  analyze twice, less twice the CPU of its second run (``tiny's work``, `time.process_time` around it:
  everything imported and warm). Imports, first-call set-up and interpreter exit are what is left;
- ``analyze run``: the same command on the real 4-rank straggler run (74 KB per rank), end to end.

Python writes its bytecode to a cache outside the trees (``PYTHONPYCACHEPREFIX``), warmed first, so
the start-up is an installed package's, not a compile of every module. The two analyses' JSON must be
byte-identical between the checkouts; the script says so or stops.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = "fixtures/kineto/gen_torch2.13cpu_gloo_2rank_rank*.pt.trace.json.gz"
"""A real 2-rank run of 14 KB per rank (gloo, torch 2.13 CPU): its analysis is a few CPU-ms of work."""
RUN = "fixtures/runs/straggler_persistent"
"""The real 4-rank straggler run (74 KB per rank): a small analysis whose work is larger than its start-up."""

TWICE = """
import sys, time
from tracediag.cli import cli

def analyze(out):
    try:
        cli(["analyze", sys.argv[1], "--format", "json", "-o", out])
    except SystemExit as e:
        if e.code:
            raise

analyze(sys.argv[2])
t0 = time.process_time()
analyze(sys.argv[3])
print(time.process_time() - t0)
"""


def _env(checkout: Path, cache: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONPYCACHEPREFIX": str(cache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _child(args: list[str], checkout: Path, cache: Path) -> tuple[float, str]:
    """CPU-s and stdout of ``python ARGS`` run with `checkout` first on the path (from the repository root,
    so that the inputs' relative names, shown in the output, are the same for both checkouts)."""
    before = _children_cpu()
    out = subprocess.run(
        [sys.executable, *args], env=_env(checkout, cache), cwd=ROOT, capture_output=True, text=True, check=True
    )
    return _children_cpu() - before, out.stdout


def _analyze(run: str, out: Path) -> list[str]:
    return ["-m", "tracediag", "analyze", run, "--format", "json", "-o", str(out)]


def measure(checkout: Path, runs: tuple[str, str], cache: Path, tmp: Path) -> dict[str, float]:
    """One round of every case for `checkout`: CPU-s by case."""
    tiny, run = runs
    cpu = {"python": _child(["-c", "pass"], checkout, cache)[0]}
    cpu["--help"] = _child(["-m", "tracediag", "--help"], checkout, cache)[0]
    cpu["analyze --help"] = _child(["-m", "tracediag", "analyze", "--help"], checkout, cache)[0]
    cpu["analyze tiny"] = _child(_analyze(tiny, tmp / "tiny.json"), checkout, cache)[0]
    total, out = _child(["-c", TWICE, tiny, str(tmp / "1.json"), str(tmp / "2.json")], checkout, cache)
    work = float(out.strip().splitlines()[-1])
    cpu["fixed"] = total - 2 * work
    cpu["tiny's work"] = work
    cpu["analyze run"] = _child(_analyze(run, tmp / "run.json"), checkout, cache)[0]
    return cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="Another checkout (e.g. a git worktree of main) to compare with.")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tiny", default=TINY, help="The run whose analysis is mostly start-up (relative to the root).")
    ap.add_argument("--run", default=RUN, help="A small run analysed end to end (relative to the root).")
    args = ap.parse_args()
    trees = {"this": ROOT}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        caches = {name: tmp / f"pycache-{name}" for name in trees}
        for name, tree in trees.items():  # warm the bytecode caches and keep the outputs
            for i, run in enumerate((args.tiny, args.run)):
                _child(_analyze(run, tmp / f"{name}.{i}.json"), tree, caches[name])
        if args.baseline is not None:
            for i in range(2):
                if (tmp / f"this.{i}.json").read_bytes() != (tmp / f"baseline.{i}.json").read_bytes():
                    sys.exit(f"the analyze JSON of {(args.tiny, args.run)[i]} differs between the checkouts")
        rows: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for name in order:
                sub = tmp / name
                sub.mkdir(exist_ok=True)
                for case, value in measure(trees[name], (args.tiny, args.run), caches[name], sub).items():
                    rows[name].setdefault(case, []).append(value)
    load = os.getloadavg()
    print(f"{args.rounds} rounds, medians of CPU-s; load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"tiny: {args.tiny}\nrun: {args.run}")
    print(f"{'case':<20}" + "".join(f"{name:>10}" for name in trees) + ("     ratio" if len(trees) > 1 else ""))
    for case in rows["this"]:
        meds = [statistics.median(rows[name][case]) for name in trees]
        ratio = f"{meds[0] / meds[1]:>9.2f}x" if len(meds) > 1 and meds[1] else ""
        print(f"{case:<20}" + "".join(f"{m:>10.3f}" for m in meds) + ratio)
    if args.baseline is not None:
        print("analyze --format json of tiny and run: byte-identical between the checkouts")


if __name__ == "__main__":
    main()

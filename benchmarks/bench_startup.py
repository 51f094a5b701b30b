#!/usr/bin/env python3
"""Start-up CPU-s of the command line (issue 31 item 3), against a baseline checkout, in one run.

    python benchmarks/bench_startup.py [--baseline DIR] [--rounds 7] [--tiny GLOB] [--run DIR] [--instructions]

Each case is a fresh ``python`` of the checkout; its CPU seconds are `resource.getrusage` of the
children (user + system, every thread), the median over the rounds, the checkouts alternated in each
round (which goes first alternates too), so that the machine's load falls on both alike:

- ``python``: the interpreter alone (``python -c pass``), the floor under every other row;
- ``polars+click+orjson``: ``python -c "import polars, click, orjson"``, the floor under an analyze: what
  its dependencies' own imports cost, whatever tracediag does;
- ``--help`` and ``analyze --help``: ``python -m tracediag ...``;
- ``analyze tiny``: ``tracediag analyze TINY --format json -o FILE`` of a real 2-rank run of 14 KB per
  rank, whose start-up outweighs its analysis;
- ``analyze run``: the same command on the real 4-rank straggler run (74 KB per rank), end to end;
- ``fixed (tiny)``: what an analyze spends before and besides its real work: a process that runs the
  tiny analyze twice (the second through the console script's entry point, which ends the process),
  less twice the CPU of that second run (``tiny's work``: from its start to the interpreter's teardown,
  everything imported and warm). Imports, first-call set-up and the teardown are what is left.

With ``--instructions`` each case also runs once under valgrind's callgrind, which counts the
instructions of every thread: exact and independent of the load, where CPU-s on a shared machine move
by 20% from run to run. The fixed cost's count is twice the tiny analyze's less the process that runs it
twice. The checkouts are counted side by side (one callgrind each at a time).

Python writes its bytecode to a cache outside the trees (``PYTHONPYCACHEPREFIX``), warmed first, so
the start-up is an installed package's, not a compile of every module. The two analyses' JSON must be
byte-identical between the checkouts; the script says so or stops.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = "fixtures/kineto/gen_torch2.13cpu_gloo_2rank_rank*.pt.trace.json.gz"
"""A real 2-rank run of 14 KB per rank (gloo, torch 2.13 CPU): a small analysis after the start-up."""
RUN = "fixtures/runs/straggler_persistent"
"""The real 4-rank straggler run (74 KB per rank): a small analysis whose work is larger than its start-up."""

TWICE = """
import atexit, sys, time
from tracediag.cli import cli, main

run, first, second = sys.argv[1:4]
cli(["analyze", run, "--format", "json", "-o", first], standalone_mode=False)
t0 = time.process_time()
atexit.register(lambda: print(time.process_time() - t0, flush=True))  # before the interpreter's teardown
sys.argv = ["tracediag", "analyze", run, "--format", "json", "-o", second]
main()  # the console script's entry point: it ends the process
"""


def _env(checkout: Path, cache: Path) -> dict[str, str]:
    # PYTHONSAFEPATH: `-m` and `-c` put the working directory (this tree) first on the path, before PYTHONPATH
    env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONPYCACHEPREFIX": str(cache), "PYTHONSAFEPATH": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _child(args: list[str], checkout: Path, cache: Path, *, under: tuple[str, ...] = ()) -> tuple[float, str]:
    """CPU-s and stdout (stderr `under` a tool) of ``python ARGS`` run with `checkout` first on the path
    (from the repository root, so that the inputs' relative names, shown in the output, are the same for
    both checkouts)."""
    before = _children_cpu()
    out = subprocess.run(
        [*under, sys.executable, *args], env=_env(checkout, cache), cwd=ROOT, capture_output=True, text=True, check=True
    )
    return _children_cpu() - before, out.stderr if under else out.stdout


def _instructions(args: list[str], checkout: Path, cache: Path) -> float:
    """Millions of instructions ``python ARGS`` executes, every thread's, counted by valgrind's callgrind:
    exact where CPU-s wander with the machine's load (a run takes about 50 times as long)."""
    tool = ("valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null")
    err = _child(args, checkout, cache, under=tool)[1]
    return int(re.search(r"Collected : (\d+)", err).group(1)) / 1e6


def _analyze(run: str, out: Path) -> list[str]:
    return ["-m", "tracediag", "analyze", run, "--format", "json", "-o", str(out)]


def _cases(runs: tuple[str, str], tmp: Path) -> dict[str, list[str]]:
    tiny, run = runs
    return {
        "python": ["-c", "pass"],
        "polars+click+orjson": ["-c", "import polars, click, orjson"],
        "--help": ["-m", "tracediag", "--help"],
        "analyze --help": ["-m", "tracediag", "analyze", "--help"],
        "analyze tiny": _analyze(tiny, tmp / "tiny.json"),
        "analyze run": _analyze(run, tmp / "run.json"),
    }


def _twice(runs: tuple[str, str], tmp: Path) -> list[str]:
    return ["-c", TWICE, runs[0], str(tmp / "1.json"), str(tmp / "2.json")]


def count(checkout: Path, runs: tuple[str, str], cache: Path, tmp: Path) -> dict[str, float]:
    """Millions of instructions by case for `checkout`, the fixed cost's included."""
    tmp.mkdir(exist_ok=True)
    counted = {case: _instructions(args, checkout, cache) for case, args in _cases(runs, tmp).items()}
    counted["fixed (tiny)"] = 2 * counted["analyze tiny"] - _instructions(_twice(runs, tmp), checkout, cache)
    return counted


def measure(checkout: Path, runs: tuple[str, str], cache: Path, tmp: Path) -> dict[str, float]:
    """One round of every case for `checkout`: CPU-s by case."""
    cpu = {case: _child(args, checkout, cache)[0] for case, args in _cases(runs, tmp).items()}
    total, out = _child(_twice(runs, tmp), checkout, cache)
    work = float(out.strip().splitlines()[-1])
    cpu["fixed (tiny)"] = total - 2 * work
    cpu["tiny's work"] = work
    return cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="Another checkout (e.g. a git worktree of main) to compare with.")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tiny", default=TINY, help="The run whose analysis is mostly start-up (relative to the root).")
    ap.add_argument("--run", default=RUN, help="A small run analysed end to end (relative to the root).")
    ap.add_argument("--instructions", action="store_true", help="Also count each case's instructions (valgrind).")
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
        counted = {}
        if args.instructions:
            with ThreadPoolExecutor(len(trees)) as pool:
                jobs = {
                    name: pool.submit(count, tree, (args.tiny, args.run), caches[name], tmp / f"count-{name}")
                    for name, tree in trees.items()
                }
                counted = {name: job.result() for name, job in jobs.items()}
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
    if counted:
        print("millions of instructions (valgrind callgrind), one run each")
        for case in counted["this"]:
            counts = [counted[name][case] for name in trees]
            ratio = f"{counts[0] / counts[1]:>9.3f}x" if len(counts) > 1 else ""
            print(f"{case:<20}" + "".join(f"{c:>10.1f}" for c in counts) + ratio)
    if args.baseline is not None:
        print("analyze --format json of tiny and run: byte-identical between the checkouts")


if __name__ == "__main__":
    main()

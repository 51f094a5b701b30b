"""Parallel `load`: tracediag's subprocess workers against the spawn process pool they replace, in one run.

    python benchmarks/bench_load_workers.py [--copies 4] [--jobs 2] [--repeat 3] [--source PATH]

The same multi-rank set as bench_ingest.py (copies of a real trace, ranks rewritten, in benchmarks/data/).
Times, best of --repeat, each in a fresh Python process (what a user's script pays, interpreter start
and imports included):

1. `load(files, jobs=1)`: in-process reading;
2. `load(files, jobs=N)`: tracediag's workers (plain subprocesses importing only tracediag);
3. the previous implementation: `ProcessPoolExecutor(mp_context=spawn)` mapping the same reader
   (needs the `if __name__ == "__main__":` guard that the workers do not).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from bench_ingest import DEFAULT_SOURCE, build_set

SERIAL = """
import sys, tracediag
tracediag.load(sys.argv[1:], jobs=1)
"""
WORKERS = """
import sys, tracediag
tracediag.load(sys.argv[2:], jobs=int(sys.argv[1]))
"""
SPAWN_POOL = """
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
import polars as pl
from tracediag.run import _read_one

if __name__ == "__main__":
    jobs, files = int(sys.argv[1]), sys.argv[2:]
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        traces = list(pool.map(_read_one, [(f, None, None) for f in files]))
    pl.concat([t.events for t in traces]).sort("rank", "ts", maintain_order=True)
"""


def timed(code: str, args: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code, *args], check=True)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    a = ap.parse_args()
    files = [str(p) for p in build_set(a.source, a.copies)]
    size = sum(Path(f).stat().st_size for f in files) / 1e6
    serial = timed(SERIAL, files, a.repeat)
    workers = timed(WORKERS, [str(a.jobs), *files], a.repeat)
    spawn = timed(SPAWN_POOL, [str(a.jobs), *files], a.repeat)
    print(f"{len(files)} files, {size:,.0f} MB, jobs={a.jobs}, best of {a.repeat}")
    print(f"in-process (jobs=1)   {serial:6.2f} s")
    print(f"tracediag workers     {workers:6.2f} s  ({serial / workers:.2f}x in-process)")
    print(
        f"spawn pool (previous) {spawn:6.2f} s  ({serial / spawn:.2f}x in-process); workers / spawn = "
        f"{workers / spawn:.2f}"
    )


if __name__ == "__main__":
    main()

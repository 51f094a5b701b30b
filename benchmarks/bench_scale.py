#!/usr/bin/env python3
"""The bar for scale (issue 31): 64 -> N ranks made from real traces, in one run, with the growth exponents.

    python benchmarks/bench_scale.py [--ranks 64 256 1024 4096] [--to 16384] [--mode command|memory]
                                     [--rounds 1] [--baseline DIR] [--base fixtures/runs/straggler_persistent]

The ranks are copies of the real 4-rank gloo straggler run (fixtures/runs/straggler_persistent), rank
and clock rewritten per copy:

- ``command`` (the default): the files of `bench_scale_out.build` (rank r copies base rank r mod 4,
  ``distributedInfo`` rewritten, timestamps shifted; gzip, kept in benchmarks/data/scale/), analysed
  end to end by the default command, ``tracediag analyze DIR --format json -o FILE``, in a fresh
  process: reading, the analysis, the report and the start-up.
- ``memory``: the in-memory `tracediag.analyze` of one `Run` built in the process (rank 2 stays the
  straggler, every other rank copies a healthy rank 0, 1 or 3 with its own clock shift; not counted),
  analysed once to warm up and once timed: the analysis alone.

Measured per row: CPU seconds of the whole process tree (`resource.getrusage` of the children, exact:
every reading worker and polars thread), wall seconds, the peak summed RSS of the process tree (sampled
every 0.2 s, so a little low) and the driver's own peak RSS (VmHWM), each per rank, the top finding and
how many findings carry a what-if price.
The growth exponents are the least-squares slopes of log(value) on log(ranks) over the rows: 1.0 is a
constant cost per rank. With ``--baseline DIR`` (another checkout, e.g. a `git worktree` of main) each
row is measured for both, alternating which goes first, and the CPU ratio this / baseline is shown.
Python writes its bytecode to a cache outside the trees (``PYTHONPYCACHEPREFIX``), warmed first, so
the start-up is an installed package's, not a compile of every module.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_scale_out import build, measure_code

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "fixtures" / "runs" / "straggler_persistent"

COMMAND_CHILD = """
import json, re, resource, sys
from pathlib import Path
from tracediag.cli import cli
folder, out = sys.argv[1:3]
try:
    cli(["analyze", folder, "--format", "json", "-o", out])
except SystemExit as e:
    if e.code:
        raise
hwm = int(re.search(r"VmHWM:\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024
doc = json.loads(Path(out).read_bytes())
top = doc["findings"][0] if doc["findings"] else None
print(json.dumps({"driver_hwm": hwm, "ranks": doc["run"]["world_size"],
                  "top": None if top is None else [top["cause"], top["ranks"][:4]],
                  "whatif": sum(1 for f in doc["findings"] if f["whatif"]), "findings": len(doc["findings"])}))
"""

MEMORY_CHILD = """
import json, re, sys, time
from pathlib import Path
import polars as pl
import tracediag
from tracediag.run import Run

def hwm():
    return int(re.search(r"VmHWM:\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024

n = int(sys.argv[1])
run = tracediag.load(sys.argv[2], jobs=1)
ev = run.events
parts = [ev]
healthy = [0, 1, 3]
for k, new in enumerate(range(4, n)):
    copy = ev.filter(pl.col("rank") == healthy[k % 3])
    parts.append(copy.with_columns(rank=pl.lit(new, pl.Int32), ts=pl.col("ts") + 37_000 * (k + 1)))
run = Run(events=pl.concat(parts).sort("rank", "ts"), meta=run.meta)
del parts
tracediag.analyze(run)
base = hwm()
t0, w0 = time.process_time(), time.perf_counter()
a = tracediag.analyze(run)
cpu, wall = time.process_time() - t0, time.perf_counter() - w0
top = a.findings[0] if a.findings else None
print(json.dumps({"cpu": cpu, "wall": wall, "driver_hwm": hwm(), "driver_growth": hwm() - base,
                  "events": run.events.height, "ranks": n,
                  "top": None if top is None else [str(top.cause), list(top.ranks)[:4]],
                  "whatif": sum(1 for f in a.findings if f.whatif), "findings": len(a.findings)}))
"""


def _env(checkout: Path, cache: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONPYCACHEPREFIX": str(cache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measure_command(checkout: Path, folder: Path, cache: Path) -> dict:
    """`tracediag analyze FOLDER` of `checkout` in a fresh process: tree CPU, wall, tree and driver peaks."""
    with tempfile.TemporaryDirectory() as tmp:
        before = _children_cpu()
        r = measure_code(
            COMMAND_CHILD, [str(folder), str(Path(tmp) / "analysis.json")], env=_env(checkout, cache), cwd=checkout
        )
        cpu = _children_cpu() - before
    got = json.loads(r["stdout"].strip().splitlines()[-1])
    return {**got, "cpu": cpu, "wall": r["wall"], "tree_peak": r["tree_peak_rss"]}


def measure_memory(checkout: Path, ranks: int, cache: Path) -> dict:
    """The in-memory analyze of `ranks` replicated ranks in a fresh process (the process is the tree)."""
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, str(ranks), str(BASE)],
        env=_env(checkout, cache),
        cwd=checkout,  # `python -c` puts the working directory first on sys.path
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return {**got, "tree_peak": got["driver_hwm"]}


def exponent(ranks: list[int], values: list[float]) -> float:
    """Least-squares slope of log(value) on log(ranks): 1.0 when the value grows as the ranks."""
    xs, ys = [math.log(n) for n in ranks], [math.log(max(v, 1e-12)) for v in values]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024, 4096])
    ap.add_argument("--to", type=int, help="add rank counts x4 from the last one up to this (e.g. 16384)")
    ap.add_argument("--mode", choices=["command", "memory"], default="command")
    ap.add_argument("--rounds", type=int, default=1, help="runs per row and checkout; medians shown")
    ap.add_argument("--baseline", type=Path, help="another checkout's root, measured in the same rounds")
    args = ap.parse_args()
    ranks = sorted(args.ranks)
    while args.to and ranks[-1] * 4 <= args.to:
        ranks.append(ranks[-1] * 4)
    checkouts = {"this": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    cache = Path(tempfile.mkdtemp(prefix="tracediag-pyc-"))
    for path in checkouts.values():  # bytecode cached, as in an installed package
        subprocess.run([sys.executable, "-c", "import tracediag.cli.analyze"], env=_env(path, cache), check=True)
        measure_memory(path, 4, cache) if args.mode == "memory" else measure_command(path, build(BASE, 4), cache)
    print(f"mode {args.mode}; {os.cpu_count()} CPUs; {args.rounds} round(s); load {os.getloadavg()[0]:.1f}")
    print(
        "| checkout | ranks | CPU s | CPU ms/rank | wall s | tree peak MB | MB/rank | driver peak MB | top finding "
        "| priced (what-if) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|", flush=True)
    rows: dict[str, list[dict]] = {k: [] for k in checkouts}
    for n in ranks:
        folder = build(BASE, n) if args.mode == "command" else None
        got: dict[str, list[dict]] = {k: [] for k in checkouts}
        for i in range(args.rounds):
            order = list(checkouts.items())
            for name, path in order if i % 2 == 0 else order[::-1]:
                m = measure_memory(path, n, cache) if folder is None else measure_command(path, folder, cache)
                got[name].append(m)
        for name, runs in got.items():
            med = {k: statistics.median(r[k] for r in runs) for k in ("cpu", "wall", "tree_peak", "driver_hwm")}
            rows[name].append({"ranks": n, **med})
            print(
                f"| {name} | {n:,} | {med['cpu']:.2f} | {med['cpu'] / n * 1e3:.1f} | {med['wall']:.1f} "
                f"| {med['tree_peak'] / 1e6:,.0f} | {med['tree_peak'] / n / 1e6:.2f} | {med['driver_hwm'] / 1e6:,.0f} "
                f"| {runs[0]['top']} | {runs[0]['whatif']} of {runs[0]['findings']} |",
                flush=True,
            )
    for name, rs in rows.items():
        ns = [r["ranks"] for r in rs]
        growth = ", ".join(f"{k} {exponent(ns, [r[k] for r in rs]):.2f}" for k in ("cpu", "tree_peak", "driver_hwm"))
        per_rank = rs[-1]["cpu"] / rs[-1]["ranks"] / (rs[0]["cpu"] / rs[0]["ranks"])
        print(f"{name}: growth exponents {growth}; CPU per rank at {ns[-1]:,} / at {ns[0]:,}: {per_rank:.2f}")
    if args.baseline:
        ratios = " ".join(
            f"{t['ranks']}: {t['cpu'] / b['cpu']:.2f}" for t, b in zip(rows["this"], rows["baseline"], strict=True)
        )
        print(f"CPU this / baseline per rank count: {ratios}")
    print(f"load at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    sys.exit(main())

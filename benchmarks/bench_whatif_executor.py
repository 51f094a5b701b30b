#!/usr/bin/env python3
"""What the what-if replay costs on the executor path: driver peak memory and CPU with the replay
against a checkout without it, at 64 and 256 ranks, in the same run.

    git archive <commit> tracediag | tar -x -C BASE      # e.g. the commit before the replay's per-rank tables
    python benchmarks/bench_whatif_executor.py --baseline BASE [--ranks 64 256] [--workers 2] [--repeat 2]

The rank sets are bench_scale_out.py's (copies of the real 4-rank gloo run, ranks and clocks
rewritten). Each (code, path, ranks) runs in a fresh process, `--repeat` times, the two codes
interleaved (the lowest of each figure is kept: the machine is shared): ``memory`` (`load` +
`analyze`, events in the driver) and ``local`` (`--executor local`: per-rank summaries on worker
processes, the cross-rank half in the driver). Measured: the driver's peak RSS (VmHWM) and CPU
seconds (its own rusage), the process tree's CPU seconds (RUSAGE_CHILDREN around the run: every
process is waited for), wall time, how many findings the replay priced, and the bytes of per-rank
summaries written (all tables, and the what-if's ``replay_*`` tables alone). The runs start in an
empty directory, so that ``PYTHONPATH`` (the baseline's, inherited by its workers) decides which
tracediag is imported, not the current directory (``python -c`` puts it first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale_out import build, measure_code

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, os, re, resource, shutil, sys, tempfile, time
def hwm():
    return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
def main():
    executor, folder, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t = time.perf_counter()
    import tracediag
    sizes = {}
    if executor == "memory":
        analysis = tracediag.analyze(tracediag.load(folder, jobs=workers))
    else:
        from tracediag.execute.driver import analyze_ranks
        out = tempfile.mkdtemp(prefix="bench-whatif-")
        analysis, _ = analyze_ranks(folder, out=out, executor=executor, workers=workers)
        for where, _, names in os.walk(os.path.join(out, "ranks")):
            for name in names:
                key = name.split(".")[0]
                sizes[key] = sizes.get(key, 0) + os.path.getsize(os.path.join(where, name))
        shutil.rmtree(out)
    wall = time.perf_counter() - t
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"wall": wall, "driver_hwm": hwm(), "driver_cpu": ru.ru_utime + ru.ru_stime,
                      "ranks": len(analysis.ranks), "whatif": analysis.whatif is not None,
                      "priced": sum(f.step_time_without_ns is not None for f in analysis.findings),
                      "sizes": sizes, "code": os.path.dirname(os.path.dirname(tracediag.__file__))}))
if __name__ == "__main__":
    main()
"""


def run(executor: str, folder: Path, workers: int, pythonpath: str | None) -> dict:
    saved = os.environ.get("PYTHONPATH")
    if pythonpath:
        os.environ["PYTHONPATH"] = pythonpath
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        r = measure_code(CHILD, [executor, str(folder), str(workers)])
    finally:
        if pythonpath:
            os.environ.pop("PYTHONPATH") if saved is None else os.environ.__setitem__("PYTHONPATH", saved)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    exact = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out = json.loads(r["stdout"].strip().splitlines()[-1])
    return {**out, "tree_cpu": max(exact, r["tree_cpu"])}


def best(rows: list[dict]) -> dict:
    keep = {k: min(r[k] for r in rows) for k in ("wall", "driver_hwm", "driver_cpu", "tree_cpu")}
    return {**rows[0], **keep}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", required=True, help="a directory holding an older tracediag/ package")
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--executors", nargs="+", default=["local", "memory"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--base", type=Path, default=ROOT / "fixtures/runs/straggler_persistent")
    args = ap.parse_args()
    baseline = str(Path(args.baseline).resolve())
    codes = [("baseline", baseline), ("this", None)]
    os.chdir(tempfile.mkdtemp(prefix="bench-whatif-cwd-"))
    print(f"base {args.base.name}; {args.workers} workers; {os.cpu_count()} CPUs; best of {args.repeat}")
    print(
        "| path | ranks | code | priced | driver peak MB | driver CPU s | tree CPU s | wall s "
        "| summaries KB/rank | replay tables KB/rank |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.ranks:
        folder = build(args.base, n)
        for ex in args.executors:
            rows: dict[str, list[dict]] = {name: [] for name, _ in codes}
            for _ in range(args.repeat):  # interleaved: both codes see the same load
                for name, path in codes:
                    rows[name].append(run(ex, folder, args.workers, path))
            results = {name: best(r) for name, r in rows.items()}
            for name, r in results.items():
                assert (r["code"] == baseline) == (name == "baseline"), r["code"]
            for name, r in results.items():
                total = sum(r["sizes"].values()) / n / 1e3
                replay = sum(v for k, v in r["sizes"].items() if k.startswith("replay_")) / n / 1e3
                sizes = f"{total:.1f} | {replay:.1f}" if r["sizes"] else " | "
                print(
                    f"| {ex} | {n} | {name} | {r['priced']} | {r['driver_hwm'] / 1e6:.0f} | {r['driver_cpu']:.1f} "
                    f"| {r['tree_cpu']:.1f} | {r['wall']:.1f} | {sizes} |",
                    flush=True,
                )
            b, t = results["baseline"], results["this"]
            print(
                f"| {ex} | {n} | ratio this/baseline | | {t['driver_hwm'] / b['driver_hwm']:.2f} "
                f"| {t['driver_cpu'] / b['driver_cpu']:.2f} | {t['tree_cpu'] / b['tree_cpu']:.2f} "
                f"| {t['wall'] / b['wall']:.2f} | | |",
                flush=True,
            )


if __name__ == "__main__":
    main()

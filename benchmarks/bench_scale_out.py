"""Scale-out: driver memory, CPU and wall time per executor at 64, 256 and 1,024 ranks (issue 12).

    python benchmarks/bench_scale_out.py [--ranks 64 256 1024] [--executors memory local ray dask]
                                         [--workers 2] [--base fixtures/runs/straggler_persistent]

Builds one set per rank count from a real 4-rank gloo run: rank r is a copy of base rank r mod 4
with ``distributedInfo.rank``/``world_size`` rewritten and every timestamp shifted by a per-rank clock
offset (so the cross-rank alignment has work to do), gzip-compressed to benchmarks/data/scale/.
Each (executor, ranks) runs in a fresh process: ``memory`` is today's path (`load` + `analyze`, all
events in the driver), the others `execute.driver.analyze_ranks` on that engine with a local
cluster of --workers processes. Measured: the driver's peak RSS (VmHWM), the whole process tree's
CPU seconds (sampled from /proc every 0.2 s, so a little low) and its peak summed RSS, wall time and
the time to the first finished rank (engine start-up). Throughput: ranks / wall, and over the tasks
alone (ranks finished after the first / time from the first to the last), which is what the
target compares: within 20% of ``local`` on the same cores.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data" / "scale"
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

_CHILD = """
import json, re, resource, sys, time
def hwm():
    return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
def main():
    executor, folder, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t = time.perf_counter()
    import tracediag
    done = []
    tick = lambda _: done.append(time.perf_counter())
    if executor == "memory":
        analysis = tracediag.analyze(tracediag.load(folder, jobs=workers, on_file_done=tick))
    else:
        from tracediag.execute.driver import analyze_ranks
        analysis, _ = analyze_ranks(folder, executor=executor, workers=workers, progress=tick)
    wall = time.perf_counter() - t
    steady = (len(done) - 1) / (done[-1] - done[0]) if len(done) > 1 and done[-1] > done[0] else 0.0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"wall": wall, "steady": steady, "first": done[0] - t if done else 0.0,
                      "driver_hwm": hwm(), "driver_cpu": ru.ru_utime + ru.ru_stime,
                      "ranks": len(analysis.ranks), "findings": [f.cause for f in analysis.findings]}))
if __name__ == "__main__":
    main()
"""


def build(base: Path, ranks: int) -> Path:
    """The set of `ranks` files (kept between runs; rebuilt when missing)."""
    folder = DATA / f"ranks{ranks}"
    if len(list(folder.glob("rank*.json.gz"))) == ranks:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    docs = [orjson.loads(gzip.decompress(p.read_bytes())) for p in sorted(base.glob("rank*.pt.trace.json.gz"))]
    originals = [[e.get("ts") for e in d["traceEvents"]] for d in docs]
    for r in range(ranks):
        src = r % len(docs)
        doc, ts0 = docs[src], originals[src]
        offset = (r // len(docs)) * 37.0 + (r % 11) * 3.0  # µs: a different clock per copy
        for e, t in zip(doc["traceEvents"], ts0):
            if t is not None:
                e["ts"] = t + offset
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r, "world_size": ranks}
        (folder / f"rank{r:05d}.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(doc), compresslevel=1))
    return folder


def _tree(root: int) -> dict[int, tuple[float, int]]:
    """pid -> (CPU seconds, RSS bytes) of `root` and its descendants."""
    stats = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        stats[int(pid)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, int(fields[21]) * PAGE)
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            out[pid] = stats[pid][1:]
            todo.extend(kids.get(pid, []))
    return out


def measure_code(code: str, argv: list[str], *, python: str = sys.executable) -> dict:
    """Run `code` in a fresh process: its stdout, wall time, the process tree's CPU seconds and peak RSS."""
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [python, "-c", code, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    cpu: dict[int, float] = {}
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            tree = _tree(proc.pid)
            for pid, (c, _) in tree.items():
                cpu[pid] = max(cpu.get(pid, 0.0), c)
            peak[0] = max(peak[0], sum(r for _, r in tree.values()))
            time.sleep(0.2)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    thread.join()
    if proc.returncode:
        raise SystemExit(f"{argv} failed:\n{err[-3000:]}")
    return {"stdout": out, "wall": wall, "tree_cpu": sum(cpu.values()), "tree_peak_rss": peak[0]}


def measure(executor: str, folder: Path, workers: int) -> dict:
    r = measure_code(_CHILD, [executor, str(folder), str(workers)])
    result = json.loads(r["stdout"].strip().splitlines()[-1])
    result["tree_cpu"] = max(r["tree_cpu"], result["driver_cpu"])
    result["tree_peak_rss"] = r["tree_peak_rss"]
    return result


def _findings(causes: list[str]) -> str:
    return ", ".join(f"{c} x{causes.count(c)}" for c in sorted(set(causes)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--executors", nargs="+", default=["memory", "local", "ray", "dask"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--base", type=Path, default=ROOT / "fixtures/runs/straggler_persistent")
    args = ap.parse_args()
    print(f"base {args.base.name}; {args.workers} workers; {os.cpu_count()} CPUs")
    print(
        "| executor | ranks | wall s | first rank s | ranks/s (wall) | ranks/s (tasks) | vs local (tasks) "
        "| driver peak MB | tree CPU s | tree peak MB | findings |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for n in args.ranks:
        folder = build(args.base, n)
        local_rate = None
        for ex in args.executors:
            r = measure(ex, folder, args.workers)
            rate = r["ranks"] / r["wall"]
            if ex == "local":
                local_rate = r["steady"]
            ratio = f"{r['steady'] / local_rate:.2f}" if local_rate and ex != "memory" else ""
            print(
                f"| {ex} | {n} | {r['wall']:.1f} | {r['first']:.1f} | {rate:.1f} | {r['steady']:.1f} | {ratio} "
                f"| {r['driver_hwm'] / 1e6:.0f} | "
                f"{r['tree_cpu']:.1f} | {r['tree_peak_rss'] / 1e6:.0f} | {_findings(r['findings'])} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

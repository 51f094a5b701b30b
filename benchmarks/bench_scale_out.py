"""Scale-out: driver memory, CPU and wall time per executor at 64, 256 and 1,024 ranks (issue 12).

    python benchmarks/bench_scale_out.py [--ranks 64 256 1024] [--executors memory local ray dask]
                                         [--workers 2] [--repeat 3] [--base fixtures/runs/straggler_persistent]

Builds one set per rank count from a real 4-rank gloo run: rank r is a copy of base rank r mod 4
with ``distributedInfo.rank``/``world_size`` rewritten and every timestamp shifted by a per-rank clock
offset (so the cross-rank alignment has work to do), gzip-compressed to benchmarks/data/scale/.
Each (executor, ranks) runs in a fresh process: ``memory`` is today's path (`load` + `analyze`, all
events in the driver), the others `execute.driver.analyze_ranks` on that engine with a local
cluster of --workers processes. Measured: the driver's peak RSS (VmHWM), the whole process tree's
CPU seconds (sampled from /proc every 0.2 s, so a little low) and its peak summed RSS, wall time and
the time to the first finished rank (engine start-up). Throughput: ranks / wall, and over the tasks
alone (the ranks finished after the first task, over the time from its end to the last rank's), which
is what the target compares: within 20% of ``local`` on the same cores. The process tree's CPU
seconds per rank over that same phase moves much less than wall time with load from other programs.
With ``--repeat N`` each row is run N times, the executors interleaved, and medians are shown, with
each run's ratio to the local run beside it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
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
import json, os, re, resource, sys, time
TICK = os.sysconf("SC_CLK_TCK")
def hwm():
    return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
def tree_cpu():
    # CPU seconds of this process and all its descendants (engine daemons, workers) now
    stats = {}
    for pid in os.listdir("/proc"):
        try:
            text = open(f"/proc/{pid}/stat").read() if pid.isdigit() else None
        except OSError:
            continue
        if text:
            f = text[text.rindex(")") + 2 :].split()
            stats[int(pid)] = (int(f[1]), (int(f[11]) + int(f[12])) / TICK)
    kids = {}
    for pid, (ppid, _) in stats.items():
        kids.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0.0))[1]
        todo.extend(kids.get(pid, []))
    return total
def main():
    executor, folder, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    expected = len([n for n in os.listdir(folder) if n.endswith(".json.gz")])
    t = time.perf_counter()
    import tracediag
    done, cpu, first_end = [], [], []
    def tick(_):
        done.append(time.perf_counter())
        if len(done) in (1, expected):
            cpu.append(tree_cpu())
        if len(done) == 1:
            first_end.append(time.perf_counter())
    def after_first():
        # ranks finished after the first task (its rows arrive together) and the time they took
        burst = sum(1 for d in done if d <= first_end[0] + 0.01)
        return len(done) - burst, done[-1] - done[0]
    if executor == "memory":
        analysis = tracediag.analyze(tracediag.load(folder, jobs=workers, on_file_done=tick))
    else:
        from tracediag.execute.driver import analyze_ranks
        analysis, _ = analyze_ranks(folder, executor=executor, workers=workers, progress=tick)
    wall = time.perf_counter() - t
    ranks, secs = after_first()
    steady = ranks / secs if ranks and secs > 0 else 0.0
    task_cpu = (cpu[-1] - cpu[0]) / ranks if len(cpu) == 2 and ranks else 0.0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"wall": wall, "steady": steady, "first": done[0] - t if done else 0.0,
                      "task_cpu_per_rank": task_cpu, "driver_hwm": hwm(), "driver_cpu": ru.ru_utime + ru.ru_stime,
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
    """Pid -> (CPU seconds, RSS bytes) of `root` and its descendants."""
    stats = {}
    for entry in Path("/proc").iterdir():
        pid = entry.name
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


def measure_code(
    code: str,
    argv: list[str],
    *,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> dict:
    """Run `code` in a fresh process (in `cwd`, with `env` for the environment): its stdout, wall time, the
    process tree's CPU seconds and peak RSS."""
    env = {**(os.environ if env is None else env), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [python, "-c", code, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
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
        msg = f"{argv} failed:\n{err[-3000:]}"
        raise SystemExit(msg)
    return {"stdout": out, "wall": wall, "tree_cpu": sum(cpu.values()), "tree_peak_rss": peak[0]}


def measure(executor: str, folder: Path, workers: int) -> dict:
    r = measure_code(_CHILD, [executor, str(folder), str(workers)])
    result = json.loads(r["stdout"].strip().splitlines()[-1])
    result["tree_cpu"] = max(r["tree_cpu"], result["driver_cpu"])
    result["tree_peak_rss"] = r["tree_peak_rss"]
    return result


def _findings(causes: list[str]) -> str:
    return ", ".join(f"{c} x{causes.count(c)}" for c in sorted(set(causes)))


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--executors", nargs="+", default=["memory", "local", "ray", "dask"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="runs per row, executors interleaved; medians shown")
    ap.add_argument("--base", type=Path, default=ROOT / "fixtures/runs/straggler_persistent")
    args = ap.parse_args()
    print(f"base {args.base.name}; {args.workers} workers; {os.cpu_count()} CPUs; {args.repeat} run(s) per row")
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    print(
        "| executor | ranks | wall s | first rank s | ranks/s (wall) | ranks/s (tasks) | vs local (tasks) "
        "| per-run ratios | CPU ms/rank (tasks) | vs local (CPU) | driver peak MB | tree CPU s | tree peak MB "
        "| findings |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|")
    for n in args.ranks:
        folder = build(args.base, n)
        runs: dict[str, list[dict]] = {ex: [] for ex in args.executors}
        for _ in range(args.repeat):  # interleaved, so a burst of load from elsewhere hits every executor
            for ex in args.executors:
                runs[ex].append(measure(ex, folder, args.workers))
        local = runs.get("local")
        for ex, rs in runs.items():
            med = {k: _median([r[k] for r in rs]) for k in ("wall", "first", "steady", "task_cpu_per_rank",
                                                              "driver_hwm", "tree_cpu", "tree_peak_rss")}  # fmt: skip
            ratio = per_run = cpu_ratio = ""
            # the in-memory path's per-file ticks cover reading only (it derives after the last file)
            cpu_ms = "" if ex == "memory" else f"{med['task_cpu_per_rank'] * 1e3:.0f}"
            if local and ex != "memory":
                ratio = f"{med['steady'] / _median([r['steady'] for r in local]):.2f}"
                per_run = " ".join(f"{r['steady'] / lr['steady']:.2f}" for r, lr in zip(rs, local))
                cpu_ratio = f"{_median([r['task_cpu_per_rank'] for r in local]) / med['task_cpu_per_rank']:.2f}"
            print(
                f"| {ex} | {n} | {med['wall']:.1f} | {med['first']:.1f} | {n / med['wall']:.1f} "
                f"| {med['steady']:.1f} | {ratio} | {per_run} | {cpu_ms} | {cpu_ratio} "
                f"| {med['driver_hwm'] / 1e6:.0f} | {med['tree_cpu']:.1f} | {med['tree_peak_rss'] / 1e6:.0f} "
                f"| {_findings(rs[-1]['findings'])} |",
                flush=True,
            )
    print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

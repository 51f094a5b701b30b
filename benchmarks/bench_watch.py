#!/usr/bin/env python3
"""`tracediag.watch` over many ranks and windows: memory stays flat, and how soon a window's record comes.

Synthetic copies of a real run (fixtures/watch/straggler_from3, window 1: four ranks' Kineto files of
a gloo DDP job): rank r of the fake job is a copy of real rank r % 4 with its ``distributedInfo``
rewritten (rank r of a world of RANKS), and window w moves the copy's ``ProfilerStep#N`` numbers on
by 5 w and its time base on by 10 w seconds, so each window has its own steps and time, as a
``schedule(..., repeat=N)`` job's. The files of a window are written (plain JSON, atomically: a
temporary name, then renamed) into a folder that the watcher follows in this process; the record is
then awaited, and the files of the window before are removed (the watcher never reads a file twice).

Reported per window: the process's resident memory after the record (VmRSS), and the seconds from
the window's last file landing to its record (two polls to see the sizes settle, reading every rank's
file, the reduce). The claim checked: RSS after the last window <= 1.2 x RSS after window 2.

    python benchmarks/bench_watch.py --ranks 256 --windows 20
    python benchmarks/bench_watch.py --ranks 64 --windows 5      # the latency for 64 ranks
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RUN = ROOT / "fixtures" / "watch" / "straggler_from3"

import tracediag  # noqa: E402

STEP = re.compile(r"ProfilerStep#(\d+)")


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def sources() -> list[dict]:
    names = json.loads((RUN / "manifest.json").read_text())["files"]["1"]
    return [orjson.loads(gzip.decompress((RUN / names[str(r)]).read_bytes())) for r in range(4)]


def copy_of(doc: dict, rank: int, world: int, window: int) -> bytes:
    info = dict(doc["distributedInfo"], rank=rank, world_size=world)
    info["pg_config"] = [dict(g, pg_size=world, ranks=list(range(world))) for g in info["pg_config"]]
    events = []
    for e in doc["traceEvents"]:
        name = e.get("name")
        if isinstance(name, str) and name.startswith("ProfilerStep#"):
            e = dict(e, name=STEP.sub(lambda m: f"ProfilerStep#{int(m.group(1)) + 5 * window}", name))
        events.append(e)
    out = dict(doc, distributedInfo=info, traceEvents=events)
    out["baseTimeNanoseconds"] = doc["baseTimeNanoseconds"] + window * 10_000_000_000
    return orjson.dumps(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--windows", type=int, default=20)
    ap.add_argument("--poll", type=float, default=0.1)
    a = ap.parse_args()
    docs = sources()
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job"
        job.mkdir()
        gen = tracediag.watch(job, poll_seconds=a.poll, window_timeout=3600, on_notice=lambda n: print(n.message))
        rows, written = [], []
        for w in range(a.windows):
            for old in written:
                old.unlink()
            written = []
            for r in range(a.ranks):
                data = copy_of(docs[r % 4], r, a.ranks, w)
                path = job / f"host{r}_{1000 + r}.{w}.pt.trace.json"
                tmp_path = path.with_suffix(".tmp")
                tmp_path.write_bytes(data)
                tmp_path.replace(path)
                written.append(path)
            landed = time.perf_counter()
            window = next(gen)
            latency = time.perf_counter() - landed
            del data
            gc.collect()
            rss = rss_mb()
            rows.append((window.index, len(window.ranks), latency, window.analysis_seconds, rss))
            top = window.findings[0]
            print(
                f"window {window.index:>3}: {len(window.ranks)} ranks, record after {latency:6.2f} s "
                f"(reduce {window.analysis_seconds:5.2f} s), RSS {rss:7.1f} MB, {top.cause.value} {top.ranks[:4]}",
                flush=True,
            )
        gen.close()
    if len(rows) >= 2:
        ratio = rows[-1][4] / rows[1][4]
        print(f"RSS after window {rows[-1][0]} / after window 2: {ratio:.3f} (claim: <= 1.2)")
        lat = sorted(r[2] for r in rows)
        print(f"record latency: median {lat[len(lat) // 2]:.2f} s, max {lat[-1]:.2f} s (poll {a.poll} s)")


if __name__ == "__main__":
    main()

"""Reading and analysing 1,024 ranks' Flight Recorder dumps of 2,000 entries each (issue 25: ≤ 10 s).

    python benchmarks/bench_hang.py [--ranks 1024] [--entries 2000] [--jobs 0] [--repeat 1]

The dumps are a real fixture dump (fixtures/hang/host_stuck, rank 0: 16 entries with their stacks)
replicated: its entries repeated with record and sequence ids continued up to --entries (each entry's
frames copied, so the pickle holds one frame dict per frame as torch writes it), written once per rank
as benchmarks/data/hang/nccl_trace_rank_<R> (the rank is in the name, as torch writes it). Rank 5 stops
one collective early, so the analysis has a hang to find. Prints the wall and CPU time (this process and
its workers) of the read alone and of `tracediag.hang` (read + analyse), and the verdict.

Measured (docs/hang.md#performance, main at 7d00430 against d75575f, alternately in one run, 2 shared
cores at load 10-14): `tracediag.hang` 10.2-10.6 CPU-s against 14.3-15.3 (1.4x), 26-32 s wall against
30-52; a dump 6.6-6.9 CPU-ms against 10.7-11.3 (1.6x). At load 6.4-6.7: 8.8-9.7 CPU-s, 9.1-18.2 s wall.
The 10 s target holds when the two cores are ours: 6.0-6.9 s wall, 9.5-10.8 CPU-s at load 0.6-1.1 (c0bcec2).
"""

from __future__ import annotations

import argparse
import copy
import pickle
import resource
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tracediag.desync import hang  # noqa: E402
from tracediag.ingest.flight import read_dumps  # noqa: E402
from tracediag.ingest.safepickle import load_plain  # noqa: E402

SOURCE = ROOT / "fixtures" / "hang" / "host_stuck" / "nccl_trace_rank_0"
DATA = ROOT / "benchmarks" / "data" / "hang"


def make(ranks: int, entries: int) -> Path:
    """The dump set (rebuilt when its size differs)."""
    stamp = DATA / f".made_{ranks}x{entries}"
    if stamp.exists():
        return DATA
    shutil.rmtree(DATA, ignore_errors=True)
    DATA.mkdir(parents=True)
    doc = load_plain(SOURCE.read_bytes(), str(SOURCE))
    base = doc["entries"]
    out = []
    for i in range(entries):
        e = copy.deepcopy(base[i % len(base)])
        e.update(record_id=i, collective_seq_id=i + 1, op_id=i + 1, retired=i < entries - 1)
        out.append(e)
    for rank in range(ranks):
        doc["entries"] = out[:-1] if rank == 5 else out
        (DATA / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(doc, protocol=2))
    stamp.touch()
    return DATA


def cpu() -> float:
    """CPU seconds of this process and of its finished children (the reading workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    folder = make(args.ranks, args.entries)
    size = sum(p.stat().st_size for p in folder.glob("nccl_trace_rank_*"))
    print(f"{args.ranks} dumps x {args.entries} entries, {size / 1e6:,.0f} MB of pickles")
    for _ in range(args.repeat):
        c0, t0 = cpu(), time.perf_counter()
        dumps = read_dumps(str(folder), jobs=args.jobs)
        c1, t1 = cpu(), time.perf_counter()
        report = hang(str(folder), jobs=args.jobs)
        c2, t2 = cpu(), time.perf_counter()
        print(
            f"read {t1 - t0:.2f} s wall, {c1 - c0:.2f} CPU-s ({dumps.entries.height:,} entries); "
            f"hang (read + analyse) {t2 - t1:.2f} s wall, {c2 - c1:.2f} CPU-s"
        )
    print(report.sentence[:160])


if __name__ == "__main__":
    main()

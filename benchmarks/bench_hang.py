"""Reading and analysing 1,024 ranks' Flight Recorder dumps of 2,000 entries each (issue 25: ≤ 10 s).

    python benchmarks/bench_hang.py [--ranks 1024] [--entries 2000] [--jobs 0] [--repeat 1]

The dumps are a real fixture dump (fixtures/hang/host_stuck, rank 0: 16 entries with their stacks)
replicated: its entries repeated with record and sequence ids continued up to --entries (each entry's
frames copied, so the pickle holds one frame dict per frame as torch writes it), written once per rank
as benchmarks/data/hang/nccl_trace_rank_<R> (the rank is in the name, as torch writes it). Rank 5 stops
one collective early, so the analysis has a hang to find. Prints the wall time of `tracediag.hang`
(read + analyse) and of the read alone, and the verdict.

Measured: docs/hang.md#performance (the C scanner: 12.7 CPU-ms a dump against the previous reader's 60 in
the same run, 4.7x; the 10 s target not yet shown by a full run on an idle machine).
"""

from __future__ import annotations

import argparse
import copy
import pickle
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
        t0 = time.perf_counter()
        dumps = read_dumps(str(folder), jobs=args.jobs)
        t1 = time.perf_counter()
        report = hang(str(folder), jobs=args.jobs)
        t2 = time.perf_counter()
        print(f"read {t1 - t0:.2f} s ({dumps.entries.height:,} entries); hang (read + analyse) {t2 - t1:.2f} s")
    print(report.sentence[:160])


if __name__ == "__main__":
    main()

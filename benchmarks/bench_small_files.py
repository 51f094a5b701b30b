"""Many small traces: the fixed cost per file (issue 29 asks 5,000 small valid traces in <= 15 s).

    python benchmarks/bench_small_files.py [--files 5000] [--jobs 0] [--source PATH]

Copies of one real profiler window (default: rank 0 of fixtures/runs/healthy_ddp, 8 steps, ~3k events;
`--source fixtures/kineto/hta_backward_thread.json` for a tiny one) under a temporary folder, each its
own rank. Measured in fresh processes, in the same run:

1. baseline: `tracediag ingest` of one copy (interpreter start and imports, what every run pays);
2. `tracediag ingest` of all --files copies (`--rank-from-filename`).

Reported: the wall time of each, the per-file cost past the baseline ((2 - 1) / files) and the ratio
2 / 1, so a noisy machine shows in both alike.

Measured on the 2-CPU development machine (shared: its load average, from other work, in brackets), -j 0
(two processes for 5,000 files):

| code | files | baseline | total | past the baseline | ratio |
|---|---|---|---|---|---|
| each file read alone (before) | 500 | 0.43 s | 8.93 s | 16.98 ms/file | 20.5x (0.2) |
| each file read alone (before) | 5,000 | 0.60 s | 74.04 s | 14.69 ms/file | 122.6x (1.3 -> 8) |
| small files read in groups of 256 | 500 | 0.44 s | 1.81 s | 2.73 ms/file | 4.1x (0.9) |
| small files read in groups of 256 | 5,000 | 0.41 s | 11.55 s | 2.23 ms/file | 28.1x (0.7) |
| small files read in groups of 256 | 5,000 | 0.35 s | 12.51 s | 2.43 ms/file | 35.4x (0.9) |
| the same, the machine loaded | 5,000 | 0.35 s | 22.60 s | 4.42 ms/file | 46.8x (6.3) |

Before and after side by side at a load of 6.5-7: 500 files 6.50 s (13.7x) before, 2.07 s (5.9x) after; at a
load of 9-10, `tracediag ingest` of the 5,000: 94.4 s wall, 69.9 CPU-s, 4.7 GB peak before; 52.3 s wall, 20.6
CPU-s (3.4x less), 3.1 GB after (the wall time of a loaded machine follows its other work). Where a
window's 2.2 ms go (one process, low load): gunzip 0.8 (zlib 1.1; 0.26 with the optional `gunzip` extra,
ISA-L), the C scanner 0.7, the polars work over the group 0.6 (0.15 s a group), the rest 0.1; then the
Parquet write of the 14.6M rows, 2.3 s. With the `gunzip` extra (ISA-L), 1,000 windows read in one process
cost 2.1-2.3 CPU-s against 2.8.

`tracediag analyze` of the 5,000 files works (healthy, 5,000 ranks, 8 steps); past ~512 MB of decoded traces it
takes the summary path, which reads each task's files together too: 305-309 s at a load of 10-12 (68 s at a
load of 3 before analyze took that path by itself). There reading is a tenth (128 files: 1.0 of 12 s); the
per-rank derivation is most of it (8.2 s, `derive.kernels.kernel_steps` 5.3 s), then the summaries' Parquet
files (2.0 s).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT / "fixtures" / "runs" / "healthy_ddp" / "rank0.pt.trace.json.gz"


def _ingest(paths: list[str], out: Path, jobs: int) -> float:
    cmd = [sys.executable, "-m", "tracediag", "ingest", *paths, "-o", str(out), "-j", str(jobs)]
    cmd += ["--rank-from-filename", r"rank(\d+)"]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--jobs", type=int, default=0)
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    args = ap.parse_args()
    suffix = "".join(args.source.suffixes[-2:]) if args.source.name.endswith(".gz") else args.source.suffix
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "traces"
        folder.mkdir()
        for i in range(args.files):
            shutil.copyfile(args.source, folder / f"rank{i}{suffix}")
        one = _ingest([str(folder / f"rank0{suffix}")], Path(tmp) / "one.parquet", args.jobs)
        many = _ingest([str(folder)], Path(tmp) / "many.parquet", args.jobs)
    per_file_ms = (many - one) / args.files * 1e3
    print(f"source {args.source.name}, {args.files} files, -j {args.jobs}")
    print(f"baseline (1 file)   {one:8.2f} s")
    print(f"{args.files} files {many:12.2f} s   ratio {many / one:.1f}x   past the baseline {per_file_ms:.2f} ms/file")


if __name__ == "__main__":
    main()

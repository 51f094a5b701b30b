"""Many small traces: the fixed cost per file (issue 29 asks 5,000 small valid traces in <= 15 s).

    python benchmarks/bench_small_files.py [--files 5000] [--jobs 0] [--source PATH]

Copies of one real profiler window (default: rank 0 of fixtures/runs/healthy_ddp, 8 steps, ~3k events;
`--source fixtures/kineto/hta_backward_thread.json` for a tiny one) under a temporary folder, each its
own rank. Measured in fresh processes, in the same run:

1. baseline: `tracediag ingest` of one copy (interpreter start and imports, what every run pays);
2. `tracediag ingest` of all --files copies (`--rank-from-filename`).

Reported: the wall time of each, the per-file cost past the baseline ((2 - 1) / files) and the ratio
2 / 1, so a noisy machine shows in both alike.
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

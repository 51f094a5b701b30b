"""Ingest speed and memory against plain `orjson.loads` of the same bytes, measured in one run.

    python benchmarks/bench_ingest.py [--copies 8] [--source PATH] [--repeat 3]

Builds a multi-rank set from a real trace (default: HTA's trace_diff/control, 34.8 MB, A100 + NCCL)
by rewriting `distributedInfo.rank` in each copy, written uncompressed to benchmarks/data/. Then:

1. per file, best of --repeat: `orjson.loads(bytes)` (garbage collector on, as a user's process
   runs it) against `tracediag.ingest.read_file(path)` (file on disk to finished event table), with
   the C scanner and without it (the msgspec path, as where no compiler was available at install);
2. peak memory of one worker reading one file (a fresh process; RSS growth over the process
   after imports), against the uncompressed file size;
3. `tracediag ingest` of the whole set in a subprocess (wall time, default --jobs).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = ROOT.parent / "shared/trace-samples/hta/trace_diff/control/control.json.gz"
DATA = ROOT / "benchmarks" / "data"

_CHILD = """
import re, sys
from tracediag.ingest.read import read_file
def hwm():  # peak RSS of this process image, in bytes (VmHWM resets at exec, unlike ru_maxrss)
    return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
read_file(sys.argv[2])  # warm up: one-time imports and caches are not per-file memory
base = hwm()
ft = read_file(sys.argv[1])
print(base, hwm(), ft.events.height)
"""


def build_set(source: Path, copies: int) -> list[Path]:
    DATA.mkdir(parents=True, exist_ok=True)
    raw = gzip.decompress(source.read_bytes()) if source.read_bytes()[:2] == b"\x1f\x8b" else source.read_bytes()
    text = raw.decode()
    out = []
    for rank in range(copies):
        path = DATA / f"bench_rank{rank}.json"
        if not path.exists() or path.stat().st_size < len(raw) - 100:
            new = re.sub(r'("distributedInfo":\s*\{[^}]*?"rank":\s*)\d+', rf"\g<1>{rank}", text, count=1)
            path.write_text(new)
        out.append(path)
    return out


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from tracediag.ingest import native
    from tracediag.ingest.read import read_file

    def without_scanner(path: Path) -> None:
        built, native._chromescan = native._chromescan, None
        try:
            read_file(path)
        finally:
            native._chromescan = built

    files = build_set(args.source, args.copies)
    total = sum(p.stat().st_size for p in files)
    print(f"set: {len(files)} files, {total / 1e6:.1f} MB uncompressed, source {args.source.name}")
    assert gc.isenabled()

    t_orjson = t_ingest = t_msgspec = 0.0
    for p in files[:2]:
        data = p.read_bytes()
        t_orjson += best(lambda d=data: orjson.loads(d), args.repeat)
        t_ingest += best(lambda q=p: read_file(q), args.repeat)
        t_msgspec += best(lambda q=p: without_scanner(q), args.repeat)
    n = min(2, len(files))
    print(
        f"per file (best of {args.repeat}, {n} files): orjson.loads {t_orjson / n:.3f} s, "
        f"tracediag read_file {t_ingest / n:.3f} s (ratio {t_ingest / t_orjson:.2f}), "
        f"without the C scanner {t_msgspec / n:.3f} s (ratio {t_msgspec / t_orjson:.2f}; scanner/msgspec "
        f"{t_ingest / t_msgspec:.2f})"
    )

    warm = ROOT / "fixtures/kineto/hta_a100_nccl_rank0.json.gz"
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(files[0]), str(warm)], capture_output=True, text=True, check=True
    )
    base, peak, rows = map(int, proc.stdout.split())
    size = files[0].stat().st_size
    print(
        f"worker memory: file {size / 1e6:.1f} MB, RSS growth {(peak - base) / 1e6:.1f} MB "
        f"= {(peak - base) / size:.2f}x file size (peak RSS {peak / 1e6:.1f} MB, {rows} rows)"
    )

    jobs = os.cpu_count() or 1
    cli = [sys.executable, "-m", "tracediag", "ingest", *map(str, files), "-j", str(jobs)]
    t = time.perf_counter()
    subprocess.run(cli, check=True, capture_output=True)
    t_cli = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run([*cli, "-o", str(DATA / "bench.parquet")], check=True, capture_output=True)
    t_cli_parquet = time.perf_counter() - t
    t = time.perf_counter()
    for p in files:
        orjson.loads(p.read_bytes())
    t_all_orjson = time.perf_counter() - t
    print(
        f"whole set: `tracediag ingest -j {jobs}` {t_cli:.2f} s, process start included "
        f"({t_cli_parquet:.2f} s with -o run.parquet), vs orjson.loads of every file in one process "
        f"{t_all_orjson:.2f} s: ratio {t_cli / t_all_orjson:.2f} ({t_cli_parquet / t_all_orjson:.2f} with Parquet)"
    )
    print(
        json.dumps(
            {
                "ratio_per_file": round(t_ingest / t_orjson, 3),
                "ratio_scanner_vs_msgspec": round(t_ingest / t_msgspec, 3),
                "memory_x_file": round((peak - base) / size, 2),
                "ratio_cli_set": round(t_cli / t_all_orjson, 3),
                "ratio_cli_set_parquet": round(t_cli_parquet / t_all_orjson, 3),
            }
        )
    )


if __name__ == "__main__":
    main()

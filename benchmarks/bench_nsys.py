"""Ingest speed of `read_nsys` on a large SQLite export, against a plain sqlite3 fetch in the same run.

Builds benchmarks/data/nsys_large_<N>.sqlite (git-ignored) from the real 2022.4 DDL (via
fixtures/nsys/make_constructed.py): the constructed rank-0 rows plus N kernels (1 in 4 an NCCL
all-reduce), N runtime launches with matching correlation ids and N/50 NVTX ranges. Then it times
  baseline: `SELECT *` + `fetchall()` of every table the reader consumes (and of the kernel table
            alone), i.e. getting the rows into Python at all;
  read_nsys: the whole reader, from file to conformed event table.
Run: .venv/bin/python benchmarks/bench_nsys.py [--kernels 2000000] [--repeat 3] [--gzip]
"""

from __future__ import annotations

import argparse
import gzip
import os
import platform
import shutil
import sqlite3
import sys
import time
from pathlib import Path

import polars as pl

from tracediag.ingest.nsys import read_nsys

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data"
sys.path.insert(0, str(ROOT / "fixtures" / "nsys"))
import make_constructed as mc  # noqa: E402  (a script beside the fixtures, not a package)

CONSUMED = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS",
)


def build(n: int, out: Path) -> None:
    """Write the large export: constructed rank-0 rows, then `n` kernels + launches in SQL."""
    tmp = out.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    con = sqlite3.connect(tmp)
    mc.copy_schema(con)
    mc.insert_rows(con, 0)
    gpid = mc.global_pid(4242)
    gemm, gemm_short = (mc.SID[s] for s in mc.KERNELS["gemm"])
    nccl, nccl_short = (mc.SID[s] for s in mc.KERNELS["allreduce"])
    seq = "WITH RECURSIVE i(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i WHERE n + 1 < :n) "
    params = {"n": n, "gpid": gpid, "t0": 100_000_000}
    con.execute(
        seq + "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId,"
        " globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY,"
        " blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId)"
        " SELECT :t0 + n * 5000 + 2000, :t0 + n * 5000 + 4000 + n % 997, 0, 1,"
        " CASE n % 4 WHEN 3 THEN 13 ELSE 7 END, 10000 + n, :gpid,"
        f" CASE n % 4 WHEN 3 THEN {nccl} ELSE {gemm} END,"
        f" CASE n % 4 WHEN 3 THEN {nccl_short} ELSE {gemm_short} END,"
        " 32, 108, 1, 1, 256, 1, 1, 0, 0, 0, 0, 10000 + n FROM i",
        params,
    )
    con.execute(
        seq + "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId,"
        f" returnValue) SELECT :t0 + n * 5000, :t0 + n * 5000 + 1500, 0, :gpid | 4242, 10000 + n,"
        f" {mc.SID['cudaLaunchKernel_v7000']}, 0 FROM i",
        params,
    )
    con.execute(
        seq + "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId)"
        " SELECT :t0 + n * 250000, :t0 + n * 250000 + 240000, 59, 'ProfilerStep#' || n, :gpid | 4242, 0"
        " FROM i WHERE n < :n / 50",
        params,
    )
    con.commit()
    con.close()
    tmp.replace(out)


def timed(fn, repeat: int) -> tuple[float, object]:
    """Best wall time of `repeat` runs, and the last result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def fetch_all(db: Path, tables: tuple[str, ...]) -> int:
    con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        return sum(len(con.execute(f"SELECT * FROM {t}").fetchall()) for t in tables)
    finally:
        con.close()


def report(label: str, rows: int, seconds: float) -> None:
    print(f"{label:<42} {rows:>10,} rows {seconds:6.2f} s {rows / seconds:>12,.0f} rows/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gzip", action="store_true", help="also time the same export gzip-compressed")
    args = ap.parse_args()

    DATA.mkdir(parents=True, exist_ok=True)
    db = DATA / f"nsys_large_{args.kernels}.sqlite"
    if not db.exists():
        t = time.perf_counter()
        build(args.kernels, db)
        print(f"built {db.name} ({db.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t:.1f} s")

    print(
        f"python {platform.python_version()}, polars {pl.__version__}, sqlite {sqlite3.sqlite_version},"
        f" {os.cpu_count()} CPUs, {platform.machine()}"
    )
    t_kernel, n_kernel = timed(lambda: fetch_all(db, CONSUMED[:1]), args.repeat)
    t_base, n_base = timed(lambda: fetch_all(db, CONSUMED), args.repeat)
    t_read, trace = timed(lambda: read_nsys(db), args.repeat)
    n_in = trace.meta.events_in
    assert n_in == n_base, (n_in, n_base)
    report("baseline SELECT * fetchall, kernel table", n_kernel, t_kernel)
    report("baseline SELECT * fetchall, all consumed", n_base, t_base)
    report("read_nsys (.sqlite)", n_in, t_read)
    print(f"read_nsys / baseline(all consumed) = {t_read / t_base:.2f}x time; out rows {trace.events.height:,}")

    if args.gzip:
        gz = db.with_name(db.name + ".gz")
        if not gz.exists():
            with db.open("rb") as fin, gzip.open(gz, "wb", compresslevel=6) as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
        t_gz, _ = timed(lambda: read_nsys(gz), args.repeat)
        report("read_nsys (.sqlite.gz)", n_in, t_gz)


if __name__ == "__main__":
    main()

"""Peak memory of reading one trace against its uncompressed size (the promise: at most 2x).

    python benchmarks/bench_memory.py [--runs 2]

Traces (real, or built from real ones into benchmarks/data/):

- control: HTA's trace_diff/control (A100 + NCCL, 34.8 MB);
- mtia: HTA's mtia_trace_single_rank (86.9 MB, 310k metadata events);
- mtia x5.7: the mtia trace's events written 5.7 times over, compact (about 392 MB);
- tiny x1M: one million argument-less events taken from the control trace (ts shifted per copy).

Each is read by `tracediag.ingest.read_file` in a fresh process after a warm-up read of a small
fixture (imports and caches are not per-file memory); the number is the growth of the process's
peak RSS (VmHWM) over the warm process, divided by the file size. The baseline measured in the same
run is `orjson.loads` of the same bytes (the whole document as Python objects), in its own process.

Measured 2026-11-30 (2 shared cores; the spread between runs is about ±0.3x on the tiny trace):

    trace        size     main (before issue 14)   now     orjson.loads
    control      34.8 MB  1.40x                    1.39x   7.0x
    mtia         86.9 MB  3.63x                    1.14x   8.9x
    mtia x5.7   382.5 MB  4.06x                    1.30x  11.1x
    tiny x1M    144.9 MB  3.01x                    2.2-2.6x 7.8x

The rest of the tiny trace's peak is freed memory polars' allocator keeps for reuse: with
`_RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0` it reads at 1.6x (mtia x5.7: 0.9x), but a
file is then read about 1.5x slower, so tracediag does not set it.
"""

from __future__ import annotations

import argparse
import gzip
import subprocess
import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT.parent / "shared/trace-samples/hta"
DATA = ROOT / "benchmarks" / "data"
WARM = ROOT / "fixtures/kineto/hta_a100_nccl_rank0.json.gz"

_CHILD = """
import re, sys
def hwm():
    return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
mode, path, warm = sys.argv[1:4]
if mode == "tracediag":
    from tracediag.ingest.read import read_file
    read_file(warm)
    base = hwm()
    rows = read_file(path).events.height
else:
    import orjson
    orjson.loads(open(warm, "rb").read() if not warm.endswith(".gz") else b"{}")
    base = hwm()
    data = open(path, "rb").read()
    rows = len(orjson.loads(data)["traceEvents"])
print(base, hwm(), rows)
"""


def _plain(src: Path, name: str) -> Path:
    out = DATA / name
    if not out.exists():
        out.write_bytes(gzip.decompress(src.read_bytes()))
    return out


def _repeated(src: Path, name: str, times: float) -> Path:
    """The trace with its events written `times` times over (the other keys as they are), each copy's `ts`
    shifted by the trace's span: copies at the same times are a file holding its events twice (refused)."""
    out = DATA / name
    if out.exists():
        return out
    doc = orjson.loads(gzip.decompress(src.read_bytes()))
    events = doc.pop("traceEvents")
    times_of = [e["ts"] for e in events if isinstance(e, dict) and isinstance(e.get("ts"), int | float)]
    span = max(times_of) - min(times_of) + 1
    n = int(len(events) * times)
    with out.open("wb") as f:
        f.write(orjson.dumps(doc)[:-1] + b', "traceEvents": [')
        for i in range(n):
            e = events[i % len(events)]
            if i >= len(events) and isinstance(e, dict) and isinstance(e.get("ts"), int | float):
                e = {**e, "ts": e["ts"] + span * (i // len(events))}
            f.write((b",\n" if i else b"") + orjson.dumps(e))
        f.write(b"]}")
    return out


def _tiny(src: Path, name: str, count: int) -> Path:
    """`count` argument-less X events from a real trace, ts shifted by the trace's span per copy."""
    out = DATA / name
    if out.exists():
        return out
    doc = orjson.loads(gzip.decompress(src.read_bytes()))
    keep = ("ph", "cat", "name", "pid", "tid", "ts", "dur")
    events = [{k: e[k] for k in keep if k in e} for e in doc["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events) + 1
    with out.open("wb") as f:
        f.write(b'{"distributedInfo": {"rank": 0}, "traceEvents": [')
        for i in range(count):
            e = dict(events[i % len(events)])
            e["ts"] += span * (i // len(events))
            f.write((b",\n" if i else b"") + orjson.dumps(e))
        f.write(b"]}")
    return out


def measure(mode: str, path: Path) -> tuple[float, int]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(path), str(WARM)], capture_output=True, text=True, check=True
    )
    base, peak, rows = map(int, proc.stdout.split())
    return (peak - base) / path.stat().st_size, rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2, help="Runs per trace; the largest growth is reported.")
    ap.add_argument("--skip-big", action="store_true", help="Leave out the 392 MB trace.")
    args = ap.parse_args()
    DATA.mkdir(parents=True, exist_ok=True)
    control = SAMPLES / "trace_diff/control/control.json.gz"
    mtia = SAMPLES / "mtia_trace_single_rank/mtia_rank_0.json.gz"
    traces = {
        "control": _plain(control, "control.json"),
        "mtia": _plain(mtia, "mtia_rank_0.json"),
        "tiny x1M": _tiny(control, "tiny_1m.json", 1_000_000),
    }
    if not args.skip_big:
        traces["mtia x5.7"] = _repeated(mtia, "mtia_x5.7_shifted.json", 5.7)
    for name, path in traces.items():
        ours = max(measure("tracediag", path)[0] for _ in range(args.runs))
        base = measure("orjson", path)[0]
        print(
            f"{name:10s} {path.stat().st_size / 1e6:7.1f} MB: tracediag read_file {ours:.2f}x the file, "
            f"orjson.loads {base:.2f}x (ratio {ours / base:.2f})",
            flush=True,
        )


if __name__ == "__main__":
    main()

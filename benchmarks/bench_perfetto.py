"""Time of the Perfetto export against the analysis alone, on a loaded run (issue 30, item 1).

    python benchmarks/bench_perfetto.py [FOLDER ...] [--rounds 5]

FOLDER defaults to a few fixtures/runs and, when present, ../shared's dlrm_v100_8rank GPU trace. Per
round, alternating: `tracediag.analyze(run)` alone, then `write_perfetto` of that analysis (its own
derivation of offsets, arrivals and idle gaps, and the file). Reported per folder: the median of each,
the export's median as a ratio of the analysis', the file's size and events per second.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tracediag  # noqa: E402
from tracediag.report.perfetto import write_perfetto  # noqa: E402

DEFAULTS = [
    ROOT / "fixtures" / "runs" / "straggler_persistent",
    ROOT / "fixtures" / "runs" / "pipeline_1f1b_m8",
    ROOT.parent / "shared" / "trace-samples" / "gpu-public" / "dlrm_v100_8rank",
]


def bench(folder: Path, rounds: int) -> None:
    """Print one line for `folder`."""
    run = tracediag.load(folder)
    analyze, export = [], []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "trace.json"
        for _ in range(rounds):
            t0 = time.perf_counter()
            analysis = tracediag.analyze(run)
            t1 = time.perf_counter()
            exported = write_perfetto(str(out), run, analysis)
            t2 = time.perf_counter()
            analyze.append(t1 - t0)
            export.append(t2 - t1)
        size = out.stat().st_size
    a, e = statistics.median(analyze), statistics.median(export)
    print(
        f"{folder.name}: {run.events.height:,} events; analyze {a * 1000:.0f} ms, export {e * 1000:.0f} ms "
        f"= {e / a:.2f}x the analysis; {exported.events:,} events written, {size / 1e6:.1f} MB, "
        f"{exported.events / e / 1e6:.2f} M events/s"
    )


def main() -> None:
    """Run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for folder in args.folders or [f for f in DEFAULTS if f.exists()]:
        bench(folder, args.rounds)


if __name__ == "__main__":
    main()

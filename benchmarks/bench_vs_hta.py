"""One machine, side by side: `tracediag analyze` (the default command, the in-memory API and `--executor
local`) against HTA (issue 12, item 5).

    python benchmarks/bench_vs_hta.py [--hta-python PATH] [--copies 8] [--workers 0] [--baseline DIR]
                                      [--installed-python PATH] [--repeat 3] [--modes cli memory local]

The set: --copies copies of HTA's trace_diff/control trace (34.8 MB, A100 + NCCL) with
``distributedInfo.rank`` rewritten, uncompressed, in benchmarks/data/a100x8/ (279 MB for 8). Each
tool runs in a fresh process; measured as in bench_scale_out.py: the process tree's CPU seconds and
peak summed RSS, and wall time. CPU seconds are exact: the difference of this process's
``RUSAGE_CHILDREN`` around each run (every process of the tree is waited for by its parent), not
the /proc samples. Each tool runs --repeat times, in turns (a change in the machine's load reaches
every tool alike), and each figure is the median of its runs (CPU here moves by a third from run to
run, HTA's as much as ours). `--baseline DIR` also runs the tracediag of another checkout (e.g. a
`git worktree` of an older commit) in the same run, so a change is measured against what it
replaces under the same load. HTA (HolisticTraceAnalysis, in its own environment given by
--hta-python) does what its users run for this question: load + temporal breakdown +
communication/computation overlap + idle time breakdown. `--installed-python PATH` also runs the
tracediag installed in another environment, as its users install it (`pip install .`, not editable,
only its own dependencies: a development environment's editable-install hook and the test and
engine extras' start-up hooks cost about 0.07 CPU-s per process), as HTA runs from its own:

    python3 -m venv "$VENV" && "$VENV"/bin/pip install .   # again after each change
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import resource
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale_out import measure_code

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT.parent / "shared/trace-samples/hta/trace_diff/control/control.json.gz"
DATA = ROOT / "benchmarks" / "data" / "a100x8"

TRACEDIAG = """
import sys, time
def main():
    folder, executor, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if executor == "cli":  # the default command, its JSON written to a file
        import json, os, tempfile
        from tracediag.cli import cli
        with tempfile.TemporaryDirectory() as out:
            report = os.path.join(out, "analysis.json")
            cli.main(["analyze", folder, "--format", "json", "-o", report, "-j", str(workers)], standalone_mode=False)
            with open(report) as f:
                got = json.load(f)
        print(len(got["run"]["ranks"]), sorted({f["cause"] for f in got["findings"]}))
        return
    import tracediag
    if executor == "memory":
        analysis = tracediag.analyze(tracediag.load(folder, jobs=workers))
    else:
        from tracediag.execute.driver import analyze_ranks
        analysis, _ = analyze_ranks(folder, executor=executor, workers=workers)
    print(len(analysis.ranks), sorted({str(getattr(f.cause, 'value', f.cause)) for f in analysis.findings}))
if __name__ == "__main__":
    main()
"""

HTA = """
import sys, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
def main():
    a = TraceAnalysis(trace_dir=sys.argv[1])
    a.get_temporal_breakdown(visualize=False)
    a.get_comm_comp_overlap(visualize=False)
    a.get_idle_time_breakdown(visualize=False)
    print(len(a.t.traces))
if __name__ == "__main__":
    main()
"""


def measure(code: str, argv: list[str], python: str, pythonpath: str | None = None) -> dict:
    """`measure_code`, with the tree's CPU seconds taken exactly from RUSAGE_CHILDREN.

    The child starts in an empty directory: `python -c` puts its working directory first on the
    import path, where this repository's `tracediag` would shadow the one on `pythonpath`.
    """
    saved, cwd = os.environ.get("PYTHONPATH"), Path.cwd()
    if pythonpath:
        os.environ["PYTHONPATH"] = pythonpath
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        with tempfile.TemporaryDirectory() as empty:
            os.chdir(empty)
            r = measure_code(code, argv, python=python)
    finally:
        os.chdir(cwd)
        if pythonpath:
            os.environ.pop("PYTHONPATH") if saved is None else os.environ.__setitem__("PYTHONPATH", saved)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    exact = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {**r, "tree_cpu": max(exact, r["tree_cpu"])}


def build(copies: int) -> Path:
    DATA.mkdir(parents=True, exist_ok=True)
    text = gzip.decompress(SOURCE.read_bytes()).decode()
    for rank in range(copies):
        path = DATA / f"rank{rank}.json"
        if not path.exists() or path.stat().st_size < len(text) - 100:
            path.write_text(re.sub(r'("distributedInfo":\s*\{[^}]*?"rank":\s*)\d+', rf"\g<1>{rank}", text, count=1))
    return DATA


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[0, 1],
        help="tracediag jobs (0: its default, one per 384 MB of input)",
    )
    ap.add_argument(
        "--modes",
        nargs="+",
        choices=["cli", "memory", "local"],
        default=["cli", "memory", "local"],
        help="tracediag's runs: the default command (`tracediag analyze DIR --format json -o FILE`), "
        "`tracediag.analyze(tracediag.load(DIR))`, `--executor local`",
    )
    ap.add_argument("--hta-python", help="python of an environment with HolisticTraceAnalysis installed")
    ap.add_argument("--baseline", help="a checkout of an older tracediag, run in the same session for comparison")
    ap.add_argument("--installed-python", help="python of an environment where tracediag is installed (not editable)")
    ap.add_argument(
        "--repeat", type=int, default=3, help="runs of each tool (medians are reported, min-max in brackets)"
    )
    args = ap.parse_args()
    folder = build(args.copies)
    size = sum(p.stat().st_size for p in folder.glob("*.json"))
    print(f"set: {args.copies} x control.json, {size / 1e6:.0f} MB; load average {_load()}")
    print("| tool | wall s | tree CPU s (min-max) | tree peak MB | CPU vs HTA | memory vs HTA | result |")
    print("|---|---:|---:|---:|---:|---:|---|")
    sources = [("tracediag", None)] + ([("baseline", str(Path(args.baseline).resolve()))] if args.baseline else [])
    pythons = [("", sys.executable)] + ([(" [installed]", args.installed_python)] if args.installed_python else [])
    runs = [
        (f"{tool}{where} {label} -j {w}", TRACEDIAG, [str(folder), mode, str(w)], python, path)
        for tool, path in sources
        for where, python in (pythons if path is None else pythons[:1])
        for w in args.workers
        for label, mode in (
            ("analyze --format json", "cli"),
            ("(in-memory load)", "memory"),
            ("--executor local", "local"),
        )
        if mode in args.modes
    ]
    configs = [
        (n, c, a, py, path)
        for n, c, a, py, path in [*runs, ("HTA 0.5.0", HTA, [str(folder)], args.hta_python, None)]
        if py is not None
    ]
    samples: dict[str, list[dict]] = {name: [] for name, *_ in configs}
    for _ in range(args.repeat):  # round robin: a change in the machine's load reaches every tool alike
        for name, code, argv, python, path in configs:
            samples[name].append(measure(code, argv, python, path))
    print(f"load average after the runs {_load()}")
    rows = [(name, _median_run(runs_of)) for name, runs_of in samples.items()]
    hta = next((r for n, r in rows if n.startswith("HTA")), None)
    for name, r in rows:
        cpu = f"{hta['tree_cpu'] / r['tree_cpu']:.1f}x less" if hta and r is not hta else ""
        mem = f"{r['tree_peak_rss'] / hta['tree_peak_rss']:.2f}x" if hta and r is not hta else ""
        out = r["stdout"].strip().splitlines()[-1][:60]
        spread = "-".join(
            f"{x:.1f}" for x in (min(s["tree_cpu"] for s in samples[name]), max(s["tree_cpu"] for s in samples[name]))
        )
        print(
            f"| {name} | {r['wall']:.1f} | {r['tree_cpu']:.2f} ({spread}) | {r['tree_peak_rss'] / 1e6:.0f} | {cpu} "
            f"| {mem} | {out} |"
        )


def _load() -> str:
    """The machine's 1-minute load average (its other work moves every figure: report it beside them)."""
    return f"{os.getloadavg()[0]:.1f}"


def _median_run(runs: list[dict]) -> dict:
    """The runs' medians (CPU, peak memory and wall each on its own), the first run's output."""

    def median(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    return {**runs[0], "tree_cpu": median("tree_cpu"), "tree_peak_rss": median("tree_peak_rss"), "wall": median("wall")}


if __name__ == "__main__":
    main()

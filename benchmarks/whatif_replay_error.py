#!/usr/bin/env python3
"""How well the what-if replay reproduces observed steps: per run, the replay of the observed
durations against each step's observed time (median over ranks), median and max relative error.

    python benchmarks/whatif_replay_error.py [RUN_DIR ...]

Default: every fixtures/runs/* scenario and the HTA samples under ../shared/trace-samples/hta that
the analysis reads (skipped when absent). Prints the markdown table of docs/analyze.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import tracediag

REPO = Path(__file__).resolve().parent.parent
HTA = REPO.parent / "shared" / "trace-samples" / "hta"
HTA_SETS = (
    "trace_filter",
    "trace_diff/control",
    "trace_diff/test",
    "df_index_resolver",
    "nccl_parser_config",
    "negative_queue_length_values_check",
    "ns_resolution_trace",
)


def row(path: Path) -> str:
    a = tracediag.analyze(tracediag.load(path, jobs=1))
    w = a.whatif
    name = path.relative_to(HTA).as_posix() if HTA in path.parents else path.name
    return (
        f"| {name} | {len(a.ranks)} | {len(w.steps)} | {w.operations} | "
        f"{100 * w.replay_error_median:.2f}% | {100 * w.replay_error_max:.2f}% |"
    )


def main(argv: list[str]) -> None:
    paths = [Path(p) for p in argv] or sorted(p for p in (REPO / "fixtures" / "runs").iterdir() if p.is_dir())
    if not argv and HTA.exists():
        paths += [HTA / s for s in HTA_SETS if (HTA / s).exists()]
    print("| run | ranks | steps | sync operations | median error | max error |")
    print("|---|---|---|---|---|---|")
    for p in paths:
        print(row(p))


if __name__ == "__main__":
    main(sys.argv[1:])

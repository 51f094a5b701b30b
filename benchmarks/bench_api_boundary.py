"""What the API's argument check costs (`tracediag/api_types.py`, issue 29 item 4).

    python benchmarks/bench_api_boundary.py [--repeat 15]

Measured in one process, in the same run, CPU time (median of --repeat):

1. a real `Finding` and a `Split` rebuilt from their fields: from outside the package (checked) and with
   the check off (`api_types._inside` patched to say every call is tracediag's own);
2. `plan` of llama3-8b on 64 H100s (it builds ~5,400 `Split`s and `Training`s inside the package): as it
   runs (its own calls past the boundary) and with every one of its constructions checked.

Reported: each time and the ratio checked / unchecked.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import tracediag
from tracediag import api_types
from tracediag.model.specs import Split, resolve_device, resolve_model
from tracediag.model.stack import resolve_engine

ROOT = Path(__file__).resolve().parents[1]


def _cpu(fn: object, repeat: int, number: int = 1) -> float:
    """Median CPU seconds of `number` calls of `fn`, over `repeat` rounds."""
    times = []
    for _ in range(repeat):
        started = time.process_time()
        for _ in range(number):
            fn()
        times.append((time.process_time() - started) / number)
    return statistics.median(times)


def _unchecked(fn: object, repeat: int, number: int = 1) -> float:
    inside = api_types._inside
    api_types._inside = lambda frame: True
    try:
        return _cpu(fn, repeat, number)
    finally:
        api_types._inside = inside


def _checked_everywhere(fn: object, repeat: int) -> float:
    inside = api_types._inside
    api_types._inside = lambda frame: False
    try:
        return _cpu(fn, repeat)
    finally:
        api_types._inside = inside


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    repeat = ap.parse_args().repeat
    run = tracediag.load(ROOT / "fixtures" / "runs" / "straggler_persistent", jobs=1)
    finding = tracediag.analyze(run).findings[0]
    fields = {f.name: getattr(finding, f.name) for f in dataclasses.fields(finding)}
    for name, build in (
        ("Finding(...)", lambda: tracediag.Finding(**fields)),
        ("Split(tp=2, dp=4)", lambda: Split(tp=2, dp=4)),
    ):
        checked, bare = _cpu(build, repeat, 2000), _unchecked(build, repeat, 2000)
        print(f"{name:20} checked {checked * 1e6:6.1f} us  unchecked {bare * 1e6:6.1f} us  {checked / bare:.2f}x")
    model, device, engine = resolve_model("llama3-8b"), resolve_device("h100-sxm"), resolve_engine("megatron-core")

    def search() -> None:
        tracediag.plan(model, device, engine, gpus=64, seq_len=4096, global_batch=512)

    search()
    inside, everywhere = _cpu(search, repeat), _checked_everywhere(search, repeat)
    bare = _unchecked(search, repeat)
    print(
        f"plan (64 GPUs)       as it runs {inside * 1e3:.1f} ms  every construction checked {everywhere * 1e3:.1f} ms  "
        f"unchecked {bare * 1e3:.1f} ms  ({inside / bare:.2f}x, {everywhere / bare:.2f}x)"
    )


if __name__ == "__main__":
    main()

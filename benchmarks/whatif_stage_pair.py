#!/usr/bin/env python3
"""The stage_imbalance what-if against a real counterfactual: two real 4-stage GPipe runs (gloo, 8
micro-batches) with the same 8 layers, split 1-1-1-5 (the last stage heavy) and 2-2-2-2 (balanced).
Rebalancing the first run's stages (its stage_imbalance what-if, forced on every rank and step when
the detector does not fire) should predict the second run's step.

    TORCH_PYTHON=/path/to/torch/python python benchmarks/whatif_stage_pair.py OUT_DIR [--skip-runs]

The runs are made with ``$TORCH_PYTHON`` (torch 2.13 CPU; not a tracediag dependency) into OUT_DIR
(not committed: ~2 MB); ``--skip-runs`` scores runs already there. Prints one markdown row per run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl

import tracediag
from tracediag.analysis import Cause, Finding
from tracediag.causes import price
from tracediag.reduce import derive_facts
from tracediag.whatif import graph_of

SPLITS = {"heavy_last": (1, 1, 1, 5), "balanced": (2, 2, 2, 2)}
MS = 1e6

WORKER = r"""
import json, socket, sys
from pathlib import Path
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, schedule

DIM, BATCH, M, WORLD = 1024, 1024, 8, 4

def worker(rank, port, layers, out):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    nn = torch.nn
    torch.manual_seed(rank)
    mods = []
    for _ in range(layers[rank]):
        mods += [nn.Linear(DIM, DIM), nn.ReLU()]
    mod = nn.Sequential(*mods)
    stage = PipelineStage(mod, stage_index=rank, num_stages=WORLD, device=torch.device("cpu"))
    sched = ScheduleGPipe(stage, n_microbatches=M, loss_fn=nn.CrossEntropyLoss())
    opt = torch.optim.SGD(mod.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1234)
    def step():
        x = torch.randn(BATCH, DIM, generator=g)
        y = torch.randint(0, DIM, (BATCH,), generator=g)
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            sched.step(x)
        elif rank == WORLD - 1:
            sched.step(target=y, losses=[])
        else:
            sched.step()
        opt.step()
    step()
    dist.barrier()
    path = Path(out) / f"rank{rank}.pt.trace.json.gz"
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=6),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(8):
            step()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    layers, out = json.loads(sys.argv[1]), sys.argv[2]
    Path(out).mkdir(parents=True, exist_ok=True)
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(worker, args=(port, layers, out), nprocs=WORLD, join=True)
    (Path(out) / "manifest.json").write_text(json.dumps({"layers_per_stage": layers, "microbatches": M,
        "schedule": "GPipe", "torch": torch.__version__}) + "\n")
"""


def make_runs(out: Path) -> None:
    py = os.environ.get("TORCH_PYTHON", sys.executable)
    script = out / "pipeline_worker.py"
    out.mkdir(parents=True, exist_ok=True)
    script.write_text(WORKER)
    for name, layers in SPLITS.items():
        subprocess.run([py, str(script), json.dumps(list(layers)), str(out / name)], check=True)


def median_step(a: tracediag.Analysis) -> float:
    return float(a.steps.group_by("step").agg(pl.col("dur_ns").median())["dur_ns"].median())


def balanced_whatif(path: Path) -> tuple[float, float, bool]:
    """(observed median step, the stage_imbalance what-if's step, whether the detector found it)."""
    a = tracediag.analyze(tracediag.load(path, jobs=1))
    found = [f for f in a.findings if f.cause == Cause.STAGE_IMBALANCE]
    if found and found[0].step_time_without_ns:
        return median_step(a), float(found[0].step_time_without_ns), True
    run = tracediag.load(path, jobs=1)
    derived = derive_facts(run)
    facts = derived.facts
    ranks = tuple(sorted(facts.steps["rank"].unique().to_list()))
    probe = Finding(cause=Cause.STAGE_IMBALANCE, ranks=ranks, steps=(), time_lost_ns=0, confidence=0.0, summary="")
    priced, _ = price((probe,), facts, graph_of(facts, derived.replay))
    return median_step(a), float(priced[0].step_time_without_ns or median_step(a)), False


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    if "--skip-runs" not in argv:
        make_runs(out)
    heavy_ms, whatif_ns, found = balanced_whatif(out / "heavy_last")
    balanced_ms = median_step(tracediag.analyze(tracediag.load(out / "balanced", jobs=1)))
    print("| heavy-last step | balanced step (measured) | what-if: stages rebalanced | error |")
    print("|---|---|---|---|")
    print(
        f"| {heavy_ms / MS:.0f} ms | {balanced_ms / MS:.0f} ms | {whatif_ns / MS:.0f} ms"
        f"{'' if found else ' (forced)'} | {100 * (whatif_ns / balanced_ms - 1):+.1f}% |"
    )


if __name__ == "__main__":
    main(sys.argv[1:])

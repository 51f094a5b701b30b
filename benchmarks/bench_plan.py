"""Time `tracediag plan` for Llama 3.1 405B on 16,384 H100s (seq 8192, 2,048 sequences per step).

CPU seconds (`time.process_time`, robust to a shared machine), in one run:
- the search (`plan`, 10% memory headroom, near-ties to the simpler split);
- the same search restricted to what Megatron-LM can run (`--emit megatron`);
- the previous version of `plan` (`tracediag/model/plan.py` at `--baseline REF`, default `main`), loaded
  from git and run against the same model code, for the ratio;
and the brute force the search replaces: `predict()` (rules, memory, step time, the full Prediction) on
every (split, recompute) setting, with the per-layer cost caches cleared first. The search's fastest split
must be the brute force's fastest that fits the same headroom.

Run: `python benchmarks/bench_plan.py [--baseline REF]`.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tracediag.errors import SpecError
from tracediag.model.plan import DEFAULT_HEADROOM, NEAR_TIE, candidate_splits, plan
from tracediag.model.predict import predict
from tracediag.model.specs import resolve_device, resolve_model
from tracediag.model.stack import resolve_engine
from tracediag.model.time import layer_cost, logits_cost

ARGS = {"gpus": 16_384, "seq_len": 8192, "global_batch": 2048}


def _clear() -> None:
    for cache in (layer_cost, logits_cost):
        cache.cache_clear()


def _timed(fn, *args, **kwargs):
    _clear()
    start = time.process_time()  # CPU seconds: the machine may be shared
    result = fn(*args, **kwargs)
    return time.process_time() - start, result


def baseline_module(ref: str):
    """`tracediag/model/plan.py` as it was at git `ref`, imported as a separate module."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{ref}:tracediag/model/plan.py"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan_baseline.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("plan_baseline", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["plan_baseline"] = module
        spec.loader.exec_module(module)
    return module


def brute_force(model, device, engine) -> float:
    """The best step time when every setting gets a full prediction (same headroom as the search)."""
    best = float("inf")
    for split, trainings in candidate_splits(model, device, engine, **ARGS):
        for train in trainings:
            try:
                p = predict(model, device, split, train, engine, gpus=ARGS["gpus"])
            except SpecError:
                continue
            if p.memory.total <= (1 - DEFAULT_HEADROOM) * p.memory.capacity:
                best = min(best, p.step_time_s)
    return best


def main() -> None:
    """Print the timings and the ratio against the baseline."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", default="main", help="git ref of the previous plan.py")
    ref = parser.parse_args().baseline
    model, device, engine = resolve_model("llama3.1-405b"), resolve_device("h100-sxm"), resolve_engine("megatron-core")
    searched, result = _timed(plan, model, device, engine, top=5, **ARGS)
    emitted, mg = _timed(plan, model, device, engine, top=5, target="megatron", **ARGS)
    old = baseline_module(ref)
    base_s, base = _timed(old.plan, model, device, engine, top=5, **ARGS)
    brute, best = _timed(brute_force, model, device, engine)
    top = result.ranked[0].prediction
    assert best <= top.step_time_s <= best * (1 + NEAR_TIE), (top.step_time_s, best)
    s = top.split
    print(f"plan: {searched:.2f} s for {result.explored} settings ({result.fitting} splits fit, 10% headroom)")
    print(f"plan --emit megatron: {emitted:.2f} s for {mg.explored} settings ({mg.fitting} fit)")
    print(f"previous plan ({ref}): {base_s:.2f} s for {base.explored} settings; ratio {searched / base_s:.2f}x")
    print(f"brute force (predict() on every setting): {brute:.2f} s, best {best:.3f} s/step")
    print(
        f"best: tp={s.tp} cp={s.cp} pp={s.pp} dp={s.dp} vpp={s.vpp} zero={s.zero} "
        f"mb={top.training.micro_batch} recompute={top.training.recompute} MFU {100 * top.mfu:.1f}%"
    )
    print(f"  {result.ranked[0].reason}")


if __name__ == "__main__":
    main()

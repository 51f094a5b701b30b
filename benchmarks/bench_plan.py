"""Time `tracediag plan` for Llama 3.1 405B on 16,384 H100s (seq 8192, 2,048 sequences per step).

Compared against the brute force the search replaces: `predict()` (rules, memory, step time, the full
Prediction) on every (split, recompute) setting, with the per-layer cost caches cleared first. Both runs see
the same settings; the search's results are checked to start with the brute force's fastest split.

Run: `python benchmarks/bench_plan.py`.
"""

from __future__ import annotations

import time

from tracediag.errors import SpecError
from tracediag.model.engine import resolve_engine
from tracediag.model.plan import candidate_splits, plan
from tracediag.model.predict import predict
from tracediag.model.specs import resolve_device, resolve_model
from tracediag.model.time import layer_cost, logits_cost

ARGS = {"gpus": 16_384, "seq_len": 8192, "global_batch": 2048}


def brute_force(model, device, engine) -> tuple[float, int]:
    """Seconds and the best step time when every setting gets a full prediction."""
    best, start = float("inf"), time.perf_counter()
    for split, trainings in candidate_splits(model, device, engine, **ARGS):
        for train in trainings:
            try:
                p = predict(model, device, split, train, engine, gpus=ARGS["gpus"])
            except SpecError:
                continue
            if p.fits:
                best = min(best, p.step_time_s)
    return time.perf_counter() - start, best


def main() -> None:
    """Print both timings."""
    model, device, engine = (
        resolve_model("llama3.1-405b"),
        resolve_device("h100-sxm"),
        resolve_engine("modern"),
    )
    for cache in (layer_cost, logits_cost):
        cache.cache_clear()
    start = time.perf_counter()
    result = plan(model, device, engine, top=5, **ARGS)
    searched = time.perf_counter() - start
    for cache in (layer_cost, logits_cost):
        cache.cache_clear()
    brute, best = brute_force(model, device, engine)
    top = result.ranked[0].prediction
    assert abs(top.step_time_s - best) < 1e-9, (top.step_time_s, best)
    s = top.split
    print(f"plan: {searched:.2f} s for {result.explored} settings ({result.fitting} splits fit)")
    print(f"brute force (predict() on every setting): {brute:.2f} s, same best split")
    print(
        f"best: tp={s.tp} cp={s.cp} pp={s.pp} dp={s.dp} vpp={s.vpp} zero={s.zero} "
        f"mb={top.training.micro_batch} recompute={top.training.recompute} MFU {100 * top.mfu:.1f}%"
    )


if __name__ == "__main__":
    main()

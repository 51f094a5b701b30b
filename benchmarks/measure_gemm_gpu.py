#!/usr/bin/env python3
"""Measure how a GEMM's rate falls with its smallest dimension on the CUDA GPU here, beside the model's tile term.

The model times a GEMM at `gemm_efficiency · n/(n + gemm_half_dim)` of peak, n its smallest dimension
(``tracediag/model/time.py`` `gemm_time`), with `gemm_half_dim` chosen on published runs. This times what cuBLAS
runs for bf16 (``torch.matmul``) and fp8 (``torch._scaled_mm``, per-tensor scales) GEMMs with two large
dimensions (8192) and one small one, placed as M (the tokens), N (the output columns) or K (the inner
dimension), and square GEMMs, each against an 8192^3 GEMM of the same dtype timed next to it (so a clock that
drifts during the run divides out). Also FlashAttention-2 (SDPA's flash backend) at head dimensions 64, 128 and
256, causal, 8K tokens, forward + backward, against the model's `HEAD_DIM_FACTOR`.

Prints JSON; ``--out FILE`` writes it. Needs torch with CUDA; not a dependency of tracediag.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SMALL = (128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144)
SQUARE = (512, 1024, 2048, 4096, 8192, 16384)
LARGE = 8192


def _time(fn, min_s: float = 0.05) -> float:
    """Seconds per call: 3 warm-ups, then enough calls for `min_s` of work, between CUDA events."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    reps = max(3, int(min_s / max(start.elapsed_time(end) / 1000, 1e-6)))
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps / 1000


def _gemm(m: int, n: int, k: int, dtype: str):
    """A callable running one (m×k)·(k×n) GEMM of `dtype`."""
    import torch

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    if dtype == "bf16":
        bt = b.t()
        return lambda: a @ bt
    fa, fb = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0, device="cuda")
    return lambda: torch._scaled_mm(fa, fb, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def _rate(m: int, n: int, k: int, dtype: str) -> float:
    return 2 * m * n * k / _time(_gemm(m, n, k, dtype)) / 1e12


def gemm_rows(dtype: str) -> list[dict]:
    """Each shape's TFLOP/s and its ratio to the 8192^3 GEMM timed just before it."""
    rows = []
    shapes = [("M", d, LARGE, LARGE) for d in SMALL]
    shapes += [("N", LARGE, d, LARGE) for d in SMALL]
    shapes += [("K", LARGE, LARGE, d) for d in SMALL]
    shapes += [("square", d, d, d) for d in SQUARE]
    for placement, m, n, k in shapes:
        ref = _rate(LARGE, LARGE, LARGE, dtype)
        got = _rate(m, n, k, dtype)
        rows.append(
            {
                "dtype": dtype,
                "small": placement,
                "m": m,
                "n": n,
                "k": k,
                "tflops": round(got, 1),
                "ref_tflops": round(ref, 1),
                "ratio": round(got / ref, 4),
            }
        )
    return rows


def attention_rows(tokens: int = 8192, width: int = 2048) -> list[dict]:
    """FlashAttention-2 forward + backward TFLOP/s (3.5 × the causal forward's FLOPs) by head dimension."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for head_dim in (64, 128, 256):
        heads = width // head_dim
        shape = (1, heads, tokens, head_dim)
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        g = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        flops = 3.5 * 4 * heads * tokens * tokens * head_dim / 2

        def step(q=q, k=k, v=v, g=g):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            rows.append({"head_dim": head_dim, "heads": heads, "fwd_bwd_tflops": round(flops / _time(step) / 1e12, 1)})
    return rows


def measure() -> dict:
    import torch

    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda}
    out["gemm"] = gemm_rows("bf16")
    try:
        out["gemm"] += gemm_rows("fp8")
    except (RuntimeError, AttributeError, TypeError) as e:  # no fp8 tensor cores, or another _scaled_mm signature
        out["fp8_error"] = f"{type(e).__name__}: {e}"
    out["attention_head_dim"] = attention_rows()
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("needs torch with CUDA", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    result = json.dumps(measure(), indent=1)
    print(result)
    if args.out:
        args.out.write_text(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

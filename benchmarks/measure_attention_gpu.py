#!/usr/bin/env python3
"""Measure causal attention and bf16 GEMM rates on the CUDA GPU here, beside the model's cited curves.

The model's attention rates (``tracediag/model/rates.py``) come from published kernel benchmarks; this times
what torch's scaled_dot_product_attention runs on this machine (each backend torch offers: FlashAttention-2,
cuDNN, efficient), forward and forward+backward, bf16, causal, head dim 128, 16K tokens per call, by sequence
length, counting the causal FLOPs (half of 4*b*h*s^2*d forward; the backward 2.5x the forward), and one
8192^3 bf16 GEMM. Prints JSON; ``--out FILE`` writes it. Needs torch with CUDA; not a dependency of tracediag.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _time(fn, reps: int = 10) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps / 1000  # s


def _gemm_tflops(n: int = 8192) -> float:
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return round(2 * n**3 / _time(lambda: a @ b) / 1e12, 1)


def _attention_row(backend, seq: int, tokens: int, heads: int, head_dim: int) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    batch = max(1, tokens // seq)
    fwd_flops = 4 * batch * heads * seq * seq * head_dim / 2  # causal: half the s^2 work
    shape = (batch, heads, seq, head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def fwd():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd_bwd():
        fwd().backward(g)

    with sdpa_kernel([backend]):
        t_f, t_fb = _time(fwd), _time(fwd_bwd, reps=5)
    return {
        "seq": seq,
        "batch": batch,
        "fwd_tflops": round(fwd_flops / t_f / 1e12, 1),
        "fwd_bwd_tflops": round(3.5 * fwd_flops / t_fb / 1e12, 1),
    }


def measure(tokens: int = 16384, head_dim: int = 128, heads: int = 16) -> dict:
    import torch
    from torch.nn.attention import SDPBackend

    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda}
    out["gemm_bf16_8192_tflops"] = _gemm_tflops()
    rows = []
    backends = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }
    for seq in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536):
        for name, be in backends.items():
            try:
                rows.append({"backend": name, **_attention_row(be, seq, tokens, heads, head_dim)})
            except RuntimeError as e:  # a backend that does not take this shape
                rows.append({"backend": name, "seq": seq, "error": str(e).splitlines()[0][:200]})
            torch.cuda.empty_cache()
    out["attention_causal_hd128_bf16"] = rows
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    res = json.dumps(measure(), indent=1)
    print(res)
    if a.out:
        Path(a.out).write_text(res + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Held-out validation of `tracediag analyze`: new real multi-process runs, never used to develop
the detectors, with known injected causes; then tracediag's verdict on each, scored against the truth.

The detectors in tracediag/detect/ were developed against fixtures/runs/ (make_runs.py). This script
generates *different* runs (other culprit ranks, strengths, placements of the extra work, world sizes,
models, loaders, pipeline shapes, record_shapes, a short profiling window) into $HELDOUT_OUT/<run>/
(default: `heldout` in the system's temporary folder)
(never into the repository), twice each (repeat 0 and 1, different data seeds: verdict stability),
and scores `tracediag analyze --format json` against each run's manifest.json.

Usage (torch is not a tracediag dependency; use a separate environment, $TORCH_VENV, outside the repo)::

    "$TORCH_VENV/bin/python" benchmarks/heldout_runs.py                  # all 18 x 2 runs (~5 min) + score
    "$TORCH_VENV/bin/python" benchmarks/heldout_runs.py --only strag_r0_mild --repeats 1
    "$TORCH_VENV/bin/python" benchmarks/heldout_runs.py --analyze-only   # re-score existing runs
    "$TORCH_VENV/bin/python" benchmarks/heldout_runs.py --set healthy2   # round 3: 12 x 2 new healthy runs
                                                                          # into $HELDOUT2_OUT (~3 min) + score
    TRACEDIAG=/path/to/tracediag  ...                                     # CLI to score with

Writes $HELDOUT_OUT/<scenario>_r<k>/rank<R>.pt.trace.json.gz + manifest.json, and
$HELDOUT_OUT/results.json + results.md (the table in benchmarks/heldout_validation.md).

Same setup as the fixtures: torch 2.13 CPU, gloo on 127.0.0.1, torch.set_num_threads(1),
profiler schedule(wait=1, warmup=1, active=A), prof.step() each iteration, one un-profiled warm-up
iteration, export_chrome_trace(.json.gz) per rank. No validation/retry loop here: unlike the fixtures,
a held-out run is kept whatever the noise did, because real runs are noisy too (the manifest keeps
the observed per-rank compute ratios so a reader can tell noise from a detector error).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = Path(os.environ.get("TRACEDIAG_REPO", HERE.parent))
sys.path.insert(0, str(REPO / "fixtures" / "runs"))
import make_runs as mr  # noqa: E402  (reuse: _mlp, _extra_compute, _free_port, trace_evidence, _TPFuncs)

TMP = Path(tempfile.gettempdir())
OUT = Path(os.environ.get("HELDOUT_OUT", TMP / "heldout"))
TRACEDIAG = os.environ.get("TRACEDIAG", str(REPO / ".venv" / "bin" / "tracediag"))

# ---------------------------------------------------------------------------
# scenarios.  Keys:
#   world, kind (ddp | comm_emb | comm_linear | input | pipeline), active, record_shapes,
#   strag: {rank, iters ("all" or list of iteration numbers == ProfilerStep#), n_mm, where}
#     where: before_forward | after_forward | after_backward (after DDP's all-reduce, before opt.step)
#   truth: cause, ranks (culprits; [] for job-wide), steps ("all" | "strag" | [])
S = {}


def sc(name, **kw):
    kw.setdefault("world", 4)
    kw.setdefault("active", 8)
    kw.setdefault("record_shapes", False)
    kw.setdefault("dim", mr.MLP_DIM)
    kw.setdefault("batch", mr.MLP_BATCH)
    kw.setdefault("layers", mr.MLP_LAYERS)
    S[name] = kw


# 1-3 compute stragglers (fixtures: rank 2 3x after_forward persistent; rank 1 3x on steps 4,7)
sc(
    "strag_r0_mild",
    kind="ddp",
    strag=dict(rank=0, iters="all", n_mm=6, where="before_forward"),
    truth=dict(cause="compute_straggler", ranks=[0], steps="strag"),
    note="rank 0: +6 matmuls (~1.5x its peers' compute) before forward (e.g. on-rank augmentation), every step",
)
sc(
    "strag_r3_strong",
    kind="ddp",
    strag=dict(rank=3, iters="all", n_mm=24, where="after_backward"),
    truth=dict(cause="compute_straggler", ranks=[3], steps="strag"),
    note="rank 3: +24 matmuls (~3x) after backward (after DDP's all-reduce), before opt.step, every step",
)
sc(
    "strag_2rank",
    kind="ddp",
    world=2,
    strag=dict(rank=1, iters="all", n_mm=12, where="after_forward"),
    truth=dict(cause="compute_straggler", ranks=[1], steps="strag"),
    note="2-rank DDP, rank 1: +12 matmuls (~2x) after forward, every step",
)
sc(
    "transient_single",
    kind="ddp",
    strag=dict(rank=2, iters=[5], n_mm=36, where="after_forward"),
    truth=dict(cause="compute_straggler", ranks=[2], steps="strag"),
    note="rank 2: +36 matmuls (~4x) after forward on iteration 5 only",
)
sc(
    "transient_consec",
    kind="ddp",
    strag=dict(rank=0, iters=[4, 5, 6], n_mm=24, where="before_forward"),
    truth=dict(cause="compute_straggler", ranks=[0], steps="strag"),
    note="rank 0: +24 matmuls (~3x) before forward on iterations 4, 5, 6",
)
sc(
    "transient_after_bwd",
    kind="ddp",
    strag=dict(rank=0, iters=[6], n_mm=36, where="after_backward"),
    truth=dict(cause="compute_straggler", ranks=[0], steps="strag"),
    note="rank 0: +36 matmuls (~4x) after backward (after the all-reduce, like logging), iteration 6 only",
)
# 4 comm bound
sc(
    "comm_moderate",
    kind="comm_emb",
    vocab=4096,
    emb_dim=1024,
    comp_layers=4,
    comp_batch=512,
    truth=dict(cause="comm_bound", ranks=[], steps="all"),
    note="DDP over Embedding(4096,1024) (16 MiB dense grads) + 4x Linear(512,512) on batch 512: moderate exposed comm",
)
sc(
    "comm_moderate_b",
    kind="comm_emb",
    vocab=6144,
    emb_dim=1024,
    comp_layers=4,
    comp_batch=512,
    truth=dict(cause="comm_bound", ranks=[], steps="all"),
    note="as comm_moderate with Embedding(6144,1024) (24 MiB dense grads): aims at the upper end of moderate",
)
sc(
    "comm_linear",
    kind="comm_linear",
    lin_dim=4096,
    lin_batch=8,
    truth=dict(cause="comm_bound", ranks=[], steps="all"),
    note="DDP over one Linear(4096,4096) (64 MiB grads), batch 8: strong comm, different model than the fixture",
)
# 5 input bound
sc(
    "input_dl_moderate",
    kind="input",
    loader="dataloader",
    sleep_s=0.04,
    cpu_iters=6000,
    truth=dict(cause="input_bound", ranks=[], steps="all"),
    note="DataLoader(num_workers=0), Dataset.__getitem__ sleeps 40 ms + 6k Python iters: ~30% of the step",
)
sc(
    "input_sleep_iter",
    kind="input",
    loader="generator",
    sleep_s=0.08,
    cpu_iters=0,
    truth=dict(cause="input_bound", ranks=[], steps="all"),
    note="plain Python generator (no DataLoader) that sleeps 80 ms per batch: I/O-bound custom loader",
)
# 6 pipelines
sc(
    "pp_gpipe_p2_m4",
    kind="pipeline",
    world=2,
    schedule="GPipe",
    m=4,
    truth=dict(cause="pipeline_bubble", ranks=[], steps="all"),
    note="2 stages, ScheduleGPipe, m=4: ideal bubble 1/5 = 20%",
)
sc(
    "pp_1f1b_p4_m4",
    kind="pipeline",
    world=4,
    schedule="1F1B",
    m=4,
    truth=dict(cause="pipeline_bubble", ranks=[], steps="all"),
    note="4 stages, Schedule1F1B, m=4: ideal bubble 3/7 = 43%",
)
# 7 healthy
sc(
    "healthy_2rank",
    kind="ddp",
    world=2,
    truth=dict(cause="healthy", ranks=[], steps=[]),
    note="2-rank DDP MLP, identical work",
)
sc(
    "healthy_big",
    kind="ddp",
    dim=1024,
    batch=256,
    layers=3,
    truth=dict(cause="healthy", ranks=[], steps=[]),
    note="4-rank DDP, 3x Linear(1024,1024) (12 MiB grads), batch 256, identical work",
)
sc(
    "healthy_shapes",
    kind="ddp",
    record_shapes=True,
    truth=dict(cause="healthy", ranks=[], steps=[]),
    note="4-rank DDP MLP, record_shapes=True (collectives carry sizes)",
)
# 8 mixed / edge
sc(
    "strag_shapes",
    kind="ddp",
    record_shapes=True,
    strag=dict(rank=1, iters="all", n_mm=24, where="after_forward"),
    truth=dict(cause="compute_straggler", ranks=[1], steps="strag"),
    note="rank 1: +24 matmuls (~3x) after forward, every step, record_shapes=True",
)
sc(
    "short_active3",
    kind="ddp",
    active=3,
    strag=dict(rank=2, iters="all", n_mm=24, where="after_forward"),
    truth=dict(cause="compute_straggler", ranks=[2], steps="strag"),
    note="rank 2: +24 matmuls (~3x) every step, only 3 active profiler steps",
)


# ---------------------------------------------------------------------------
# --set healthy2 (round 3): new healthy runs only, for false positives of the loosened detectors.
# Every rank does identical work; whatever tracediag reports other than healthy is a false positive
# unless the run itself is genuinely limited (said in benchmarks/heldout_validation.md, round 3).
H = {}


def hc(name, **kw):
    kw.setdefault("world", 4)
    kw.setdefault("active", 8)
    kw.setdefault("record_shapes", False)
    kw.setdefault("dim", mr.MLP_DIM)
    kw.setdefault("batch", mr.MLP_BATCH)
    kw.setdefault("layers", mr.MLP_LAYERS)
    kw.setdefault("truth", dict(cause="healthy", ranks=[], steps=[]))
    H[name] = kw


hc(
    "h2_mlp_narrow_w3",
    kind="ddp",
    world=3,
    dim=256,
    batch=256,
    layers=4,
    active=7,
    note="3-rank DDP, 4x Linear(256,256), batch 256",
)
hc(
    "h2_mlp_wide_w2",
    kind="ddp",
    world=2,
    dim=1536,
    batch=128,
    layers=2,
    active=6,
    note="2-rank DDP, 2x Linear(1536,1536) (18 MiB grads), batch 128",
)
hc(
    "h2_mlp_b128_shapes_w4",
    kind="ddp",
    world=4,
    dim=512,
    batch=128,
    layers=6,
    record_shapes=True,
    note="4-rank DDP, 6x Linear(512,512), batch 128, record_shapes=True",
)
hc(
    "h2_conv_w4",
    kind="conv",
    world=4,
    conv_batch=32,
    active=7,
    note="4-rank DDP small conv net (3 conv + pool + linear) on 32x3x32x32",
)
hc(
    "h2_conv_shapes_w2",
    kind="conv",
    world=2,
    conv_batch=48,
    record_shapes=True,
    note="2-rank DDP small conv net on 48x3x32x32, record_shapes=True",
)
hc(
    "h2_tfm_w4",
    kind="transformer",
    world=4,
    d_model=256,
    nhead=4,
    seq=64,
    tfm_batch=8,
    note="4-rank DDP, one TransformerEncoderLayer(d=256, 4 heads, ff 1024), 8x64 tokens",
)
hc(
    "h2_tfm_shapes_w3",
    kind="transformer",
    world=3,
    d_model=192,
    nhead=6,
    seq=96,
    tfm_batch=6,
    active=6,
    record_shapes=True,
    note="3-rank DDP, one TransformerEncoderLayer(d=192, 6 heads), 6x96 tokens, record_shapes",
)
hc(
    "h2_dl_fast_w4",
    kind="dl_fast",
    world=4,
    dim=512,
    batch=256,
    layers=4,
    note="4-rank DDP MLP fed by DataLoader(num_workers=0, batch 256) over an in-memory map-style dataset "
    "(per-sample __getitem__ + default collate, no sleep)",
)
hc(
    "h2_dl_fast_shapes_w2",
    kind="dl_fast",
    world=2,
    dim=512,
    batch=128,
    layers=4,
    record_shapes=True,
    active=6,
    note="2-rank DDP MLP, fast DataLoader (batch 128), record_shapes=True",
)
hc(
    "h2_bookkeep_w4",
    kind="bookkeep",
    world=4,
    dim=512,
    batch=512,
    layers=4,
    book_iters=20000,
    note="4-rank DDP MLP + per-step metrics: loss.item(), accuracy .item(), grad-norm .item(), "
    "a Python loop over the metric history (~3-5 ms)",
)
hc(
    "h2_bookkeep_shapes_w3",
    kind="bookkeep",
    world=3,
    dim=384,
    batch=384,
    layers=4,
    book_iters=15000,
    record_shapes=True,
    active=7,
    note="3-rank DDP MLP + per-step metrics bookkeeping, record_shapes=True",
)
hc(
    "h2_tp_dp_w4",
    kind="tp_dp",
    world=4,
    dim=384,
    tp_hidden=1536,
    tp_blocks=3,
    batch=256,
    note="healthy TP x2 ([0,1],[2,3]) x DP x2 ([0,2],[1,3]), 3 Megatron blocks d=384 h=1536, batch 256",
)
SETS = {
    "heldout": (S, OUT),
    "healthy2": (H, Path(os.environ.get("HELDOUT2_OUT", TMP / "heldout2"))),
}
ALL = {**S, **H}


# ---------------------------------------------------------------------------
# bodies: (torch, rank, cfg, seed) -> step(i)


def _extra(torch, cfg, rank, i, where):
    st = cfg.get("strag")
    if not st or st["rank"] != rank or st["where"] != where:
        return
    if st["iters"] == "all" or i in st["iters"]:
        mr._extra_compute(torch, n=st["n_mm"], dim=cfg["dim"], batch=cfg["batch"])


def body_ddp(torch, rank, cfg, seed):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = mr._mlp(torch, dim=cfg["dim"], layers=cfg["layers"])
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    lossf = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(seed * 100 + rank)

    def step(i):
        x = torch.randn(cfg["batch"], cfg["dim"], generator=g)
        y = torch.randint(0, 10, (cfg["batch"],), generator=g)
        _extra(torch, cfg, rank, i, "before_forward")
        loss = lossf(ddp(x), y)
        _extra(torch, cfg, rank, i, "after_forward")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        _extra(torch, cfg, rank, i, "after_backward")
        opt.step()

    return step


def body_comm_emb(torch, rank, cfg, seed):
    from torch.nn.parallel import DistributedDataParallel as DDP

    nn = torch.nn

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(cfg["vocab"], cfg["emb_dim"])
            self.proj = nn.Linear(cfg["emb_dim"], 512)
            self.mlp = nn.Sequential(*[m for _ in range(cfg["comp_layers"]) for m in (nn.Linear(512, 512), nn.ReLU())])
            self.head = nn.Linear(512, 1)

        def forward(self, idx, x):
            return self.head(self.mlp(x + self.proj(self.emb(idx).mean(dim=1)).mean(0)))

    torch.manual_seed(0)
    ddp = DDP(M())
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed * 100 + rank)

    def step(i):
        idx = torch.randint(0, cfg["vocab"], (8, 16), generator=g)
        x = torch.randn(cfg["comp_batch"], 512, generator=g)
        y = torch.randn(cfg["comp_batch"], 1, generator=g)
        loss = ((ddp(idx, x) - y) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def body_comm_linear(torch, rank, cfg, seed):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    d = cfg["lin_dim"]
    ddp = DDP(torch.nn.Linear(d, d))
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed * 100 + rank)

    def step(i):
        x = torch.randn(cfg["lin_batch"], d, generator=g)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def body_input(torch, rank, cfg, seed):
    from torch.utils.data import DataLoader, Dataset

    B, D = cfg["batch"], cfg["dim"]

    def make(idx):
        if cfg["sleep_s"]:
            time.sleep(cfg["sleep_s"])
        acc = 0
        for k in range(cfg["cpu_iters"]):
            acc = (acc * 31 + k + idx) % 1000003
        gen = torch.Generator().manual_seed(idx * 7 + rank + 1000 * seed)
        return torch.randn(B, D, generator=gen), torch.randint(0, 10, (B,), generator=gen)

    class SlowDS(Dataset):
        def __len__(self):
            return 10_000

        def __getitem__(self, idx):
            return make(idx)

    def gen_loader():
        k = 0
        while True:
            yield make(k)
            k += 1

    if cfg["loader"] == "dataloader":
        it = iter(DataLoader(SlowDS(), batch_size=None, shuffle=False, num_workers=0))
    else:
        it = gen_loader()
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    ddp = DDP(mr._mlp(torch, dim=D, layers=cfg["layers"]))
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    lossf = torch.nn.CrossEntropyLoss()

    def step(i):
        x, y = next(it)
        loss = lossf(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def body_pipeline(torch, rank, cfg, seed):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    nn = torch.nn
    W, m = cfg["world"], cfg["m"]
    torch.manual_seed(rank)
    layers = []
    for _ in range(mr.PP_LAYERS_PER_STAGE):
        layers += [nn.Linear(mr.PP_DIM, mr.PP_DIM), nn.ReLU()]
    if rank == W - 1:
        layers.append(nn.Linear(mr.PP_DIM, 10))
    mod = nn.Sequential(*layers)
    stage = PipelineStage(mod, stage_index=rank, num_stages=W, device=torch.device("cpu"))
    cls = ScheduleGPipe if cfg["schedule"] == "GPipe" else Schedule1F1B
    sched = cls(stage, n_microbatches=m, loss_fn=nn.CrossEntropyLoss())
    opt = torch.optim.SGD(mod.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1234 + seed)
    batch = 128 * m

    def step(i):
        x = torch.randn(batch, mr.PP_DIM, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            sched.step(x)
        elif rank == W - 1:
            sched.step(target=y, losses=[])
        else:
            sched.step()
        opt.step()

    return step


def _ddp_train(torch, model, make_batch, loss_of, after=None):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)

    def step(i):
        x, y = make_batch()
        out = ddp(x)
        loss = loss_of(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if after:
            after(out, y, loss, ddp)

    return step


def body_conv(torch, rank, cfg, seed):
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    g = torch.Generator().manual_seed(seed * 100 + rank)
    B = cfg["conv_batch"]
    lossf = nn.CrossEntropyLoss()
    return _ddp_train(
        torch,
        model,
        lambda: (torch.randn(B, 3, 32, 32, generator=g), torch.randint(0, 10, (B,), generator=g)),
        lossf,
    )


def body_transformer(torch, rank, cfg, seed):
    nn = torch.nn
    torch.manual_seed(0)
    d = cfg["d_model"]

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(
                d, cfg["nhead"], dim_feedforward=4 * d, dropout=0.0, batch_first=True
            )
            self.head = nn.Linear(d, 10)

        def forward(self, x):
            return self.head(self.layer(x).mean(dim=1))

    g = torch.Generator().manual_seed(seed * 100 + rank)
    B, T = cfg["tfm_batch"], cfg["seq"]
    return _ddp_train(
        torch,
        M(),
        lambda: (torch.randn(B, T, d, generator=g), torch.randint(0, 10, (B,), generator=g)),
        nn.CrossEntropyLoss(),
    )


def body_dl_fast(torch, rank, cfg, seed):
    from torch.utils.data import DataLoader, Dataset

    D = cfg["dim"]
    gen = torch.Generator().manual_seed(seed * 100 + rank)
    X = torch.randn(8192, D, generator=gen)
    Y = torch.randint(0, 10, (8192,), generator=gen)

    class InMem(Dataset):
        def __len__(self):
            return len(X)

        def __getitem__(self, idx):
            return X[idx], Y[idx]

    dl = DataLoader(
        InMem(),
        batch_size=cfg["batch"],
        shuffle=True,
        num_workers=0,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    state = {"it": iter(dl)}

    def nxt():
        try:
            return next(state["it"])
        except StopIteration:
            state["it"] = iter(dl)
            return next(state["it"])

    torch.manual_seed(0)
    return _ddp_train(torch, mr._mlp(torch, dim=D, layers=cfg["layers"]), nxt, torch.nn.CrossEntropyLoss())


def body_bookkeep(torch, rank, cfg, seed):
    B, D = cfg["batch"], cfg["dim"]
    g = torch.Generator().manual_seed(seed * 100 + rank)
    hist = []

    def after(out, y, loss, ddp):
        # typical per-step metrics: host syncs via .item() and a little Python over the history
        m = {
            "loss": loss.item(),
            "acc": (out.argmax(dim=1) == y).float().mean().item(),
            "gnorm": torch.norm(torch.stack([p.grad.norm() for p in ddp.parameters()])).item(),
        }
        hist.append(m)
        acc = 0.0
        for k in range(cfg["book_iters"]):
            acc += hist[k % len(hist)]["loss"] * 1e-6
        m["ema"] = acc
        json.dumps(hist[-50:])

    torch.manual_seed(0)
    return _ddp_train(
        torch,
        mr._mlp(torch, dim=D, layers=cfg["layers"]),
        lambda: (torch.randn(B, D, generator=g), torch.randint(0, 10, (B,), generator=g)),
        torch.nn.CrossEntropyLoss(),
        after=after,
    )


def body_tp_dp(torch, rank, cfg, seed):
    import torch.distributed as dist

    nn = torch.nn
    TP, DP = 2, 2
    tp_groups = [dist.new_group([d * TP + t for t in range(TP)], group_desc=f"tp{d}") for d in range(DP)]
    dp_groups = [dist.new_group([d * TP + t for d in range(DP)], group_desc=f"dp{t}") for t in range(TP)]
    tp_idx, dp_idx = rank % TP, rank // TP
    tp_group, dp_group = tp_groups[dp_idx], dp_groups[tp_idx]
    f = mr._TPFuncs(torch, dist, tp_group)
    D, Hd = cfg["dim"], cfg["tp_hidden"]

    class TPBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.col = nn.Linear(D, Hd // TP)
            self.row = nn.Linear(Hd // TP, D, bias=False)

        def forward(self, x):
            return x + f.reduce_from(self.row(torch.relu(self.col(f.copy_to(x)))))

    torch.manual_seed(tp_idx)
    blocks = nn.Sequential(*[TPBlock() for _ in range(cfg["tp_blocks"])])
    torch.manual_seed(0)
    head = nn.Linear(D, 10)
    params = list(blocks.parameters()) + list(head.parameters())
    opt = torch.optim.SGD(params, lr=1e-3)
    lossf = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1000 * (seed + 1) + dp_idx)

    def step(i):
        x = torch.randn(cfg["batch"], D, generator=g)
        y = torch.randint(0, 10, (cfg["batch"],), generator=g)
        loss = lossf(head(blocks(x)), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad for p in params]
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=dp_group)
        flat /= DP
        for gsrc, gdst in zip(torch._utils._unflatten_dense_tensors(flat, grads), grads):
            gdst.copy_(gsrc)
        opt.step()

    return step


BODIES = {
    "ddp": body_ddp,
    "comm_emb": body_comm_emb,
    "comm_linear": body_comm_linear,
    "input": body_input,
    "pipeline": body_pipeline,
    "conv": body_conv,
    "transformer": body_transformer,
    "dl_fast": body_dl_fast,
    "bookkeep": body_bookkeep,
    "tp_dp": body_tp_dp,
}


def _worker(rank, world, port, name, cfg, seed, outdir):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        step = BODIES[cfg["kind"]](torch, rank, cfg, seed)
        step(-1)
        dist.barrier()
        from torch.profiler import ProfilerActivity, profile, schedule

        path = Path(outdir) / f"rank{rank}.pt.trace.json.gz"
        iter_to_step = {}
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=1, warmup=1, active=cfg["active"], repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
            record_shapes=cfg["record_shapes"],
        ) as prof:
            for i in range(2 + cfg["active"]):
                iter_to_step[i] = prof.step_num  # the ProfilerStep#N that wraps iteration i
                step(i)
                prof.step()
        dist.barrier()
        if rank == 0:
            (Path(outdir) / "iter_to_step.tmp").write_text(json.dumps(iter_to_step))
    finally:
        dist.destroy_process_group()


def generate(name, repeat):
    import torch
    import torch.multiprocessing as mp

    cfg = ALL[name]
    outdir = OUT / f"{name}_r{repeat}"
    outdir.mkdir(parents=True, exist_ok=True)
    for f in outdir.glob("*"):
        f.unlink()
    t0 = time.time()
    mp.spawn(_worker, args=(cfg["world"], mr._free_port(), name, cfg, repeat, str(outdir)), nprocs=cfg["world"])
    i2s = {int(k): v for k, v in json.loads((outdir / "iter_to_step.tmp").read_text()).items()}
    (outdir / "iter_to_step.tmp").unlink()
    ev = {r: mr.trace_evidence(outdir / f"rank{r}.pt.trace.json.gz") for r in range(cfg["world"])}
    prof_steps = sorted(ev[0]["steps"])
    t = cfg["truth"]
    st = cfg.get("strag")
    if t["steps"] == "all":
        steps = prof_steps
    elif t["steps"] == "strag":
        iters = range(2 + cfg["active"]) if st["iters"] == "all" else st["iters"]
        steps = sorted(i2s[i] for i in iters if i2s[i] in prof_steps)
    else:
        steps = []
    # observed compute ratio of each rank per step (make_runs' validation measure), informational
    comp = {r: {n: e["steps"][n]["dur_ms"] - e["steps"][n]["idle_ms"] for n in prof_steps} for r, e in ev.items()}

    def ratio(r, n):
        others = [comp[o][n] for o in comp if o != r]
        return round(comp[r][n] / max(statistics.median(others), 1e-6), 2)

    man = {
        "scenario": name,
        "repeat": repeat,
        "cause": t["cause"],
        "ranks": t["ranks"],
        "steps": steps,
        "world_size": cfg["world"],
        "profiler_steps": prof_steps,
        "iteration_to_profiler_step": i2s,
        "note": cfg["note"],
        "config": {k: v for k, v in cfg.items() if k not in ("truth", "note")},
        "torch": torch.__version__,
        "seconds": round(time.time() - t0, 1),
        "observed": {
            str(r): {
                "median_step_ms": round(statistics.median(s["dur_ms"] for s in e["steps"].values()), 1),
                "median_non_compute_frac": round(
                    statistics.median(s["idle_ms"] / s["dur_ms"] for s in e["steps"].values()), 3
                ),
                "median_loader_frac": round(
                    statistics.median(s["loader_ms"] / s["dur_ms"] for s in e["steps"].values()), 3
                ),
                "compute_ratio_by_step": {str(n): ratio(r, n) for n in prof_steps},
            }
            for r, e in ev.items()
        },
    }
    (outdir / "manifest.json").write_text(json.dumps(man, indent=2) + "\n")
    print(
        f"generated {outdir.name} in {man['seconds']}s: truth {t['cause']} ranks={t['ranks']} steps={steps}", flush=True
    )
    return outdir


# ---------------------------------------------------------------------------
# scoring


def score(outdir):
    man = json.loads((outdir / "manifest.json").read_text())
    p = subprocess.run([TRACEDIAG, "analyze", str(outdir), "--format", "json"], capture_output=True, text=True)
    if p.returncode not in (0, 3):
        return {"run": outdir.name, "error": p.stderr.strip()[-500:]}
    a = json.loads(p.stdout)
    f = a["findings"]
    top = f[0]
    all_ranks = list(range(man["world_size"]))
    kept = a["run"]["steps"]
    truth_cause = man["cause"]
    t_ranks = man["ranks"] or (all_ranks if truth_cause not in ("healthy",) else [])
    t_steps = [s for s in man["steps"] if s in kept]
    cause_ok = top["cause"] == truth_cause
    any_ok = any(x["cause"] == truth_cause for x in f)
    match = next((x for x in f if x["cause"] == truth_cause), None)
    if truth_cause == "healthy":
        ranks_ok = steps_ok = cause_ok
    else:
        ranks_ok = match is not None and sorted(match["ranks"]) == sorted(t_ranks)
        steps_ok = match is not None and sorted(match["steps"]) == sorted(t_steps)
    ev = {k: v for k, v in top["evidence"].items() if not isinstance(v, dict)}
    return {
        "run": outdir.name,
        "scenario": man["scenario"],
        "repeat": man["repeat"],
        "truth": {"cause": truth_cause, "ranks": man["ranks"], "steps": t_steps},
        "kept_steps": kept,
        "excluded_steps": a["run"]["excluded_steps"],
        "findings": [
            {k: x[k] for k in ("cause", "ranks", "steps", "confidence", "time_lost_ns")}
            | {"evidence": x["evidence"], "summary": x["summary"]}
            for x in f
        ],
        "top": {
            "cause": top["cause"],
            "ranks": top["ranks"],
            "steps": top["steps"],
            "confidence": round(top["confidence"], 2),
            "time_lost_ms": round(top["time_lost_ns"] / 1e6, 1),
            "evidence": ev,
        },
        "cause_ok": cause_ok,
        "cause_in_findings": any_ok,
        "ranks_ok": ranks_ok,
        "steps_ok": steps_ok,
        "observed": man["observed"],
    }


def _fmt_steps(s, kept):
    if not s:
        return "-"
    if kept and sorted(s) == sorted(kept):
        return "all"
    return ",".join(map(str, s))


def table(results):
    rows = [
        "| run | truth (cause; ranks; steps) | verdict (cause; ranks; steps; conf; lost ms) | other findings | "
        "cause | ranks | steps |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['run']} | | ERROR {r['error'][:80]} | | | | |")
            continue
        t, v = r["truth"], r["top"]
        k = r["kept_steps"]
        others = "; ".join(f"{x['cause']}({','.join(map(str, x['ranks']))})" for x in r["findings"][1:]) or "-"
        yn = lambda b: "yes" if b else "**no**"  # noqa: E731
        rows.append(
            f"| {r['run']} | {t['cause']}; {t['ranks'] or '-'}; {_fmt_steps(t['steps'], k)} | "
            f"{v['cause']}; {v['ranks']}; {_fmt_steps(v['steps'], k)}; {v['confidence']}; {v['time_lost_ms']} | "
            f"{others} | {yn(r['cause_ok'])} | {yn(r['ranks_ok'])} | {yn(r['steps_ok'])} |"
        )
    n = sum(1 for r in results if "error" not in r)
    acc = {k: sum(bool(r.get(k)) for r in results) for k in ("cause_ok", "cause_in_findings", "ranks_ok", "steps_ok")}
    rows.append("")
    rows.append(
        f"top cause right {acc['cause_ok']}/{n}; truth cause among findings {acc['cause_in_findings']}/{n}; "
        f"ranks right {acc['ranks_ok']}/{n}; steps right {acc['steps_ok']}/{n}"
    )
    return "\n".join(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--set",
        default="heldout",
        choices=sorted(SETS),
        help="heldout: round 1-2 scenarios into $HELDOUT_OUT; healthy2: round 3 new healthy runs into $HELDOUT2_OUT",
    )
    ap.add_argument("--only", action="append", choices=sorted(ALL), help="scenario(s); default all of --set")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--analyze-only", action="store_true", help="score existing runs under $HELDOUT_OUT")
    args = ap.parse_args(argv)
    global OUT
    scen, OUT = SETS[args.set]
    names = args.only or list(scen)
    dirs = []
    for name in names:
        for k in range(args.repeats):
            d = OUT / f"{name}_r{k}"
            if not args.analyze_only:
                generate(name, k)
            if (d / "manifest.json").exists():
                dirs.append(d)
    results = [score(d) for d in dirs]
    if not args.only:
        (OUT / "results.json").write_text(json.dumps(results, indent=1))
        (OUT / "results.md").write_text(table(results) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()

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
# ---------------------------------------------------------------------------
# --set round6: new held-out scenarios nobody tuned against: two causes in one run, incomplete rank
# sets (files of a generated run removed), host-side causes (sleep, GIL contention from a Python
# thread, a CPU-starved rank), 8 ranks, variable-length batches, a straggler that moves between ranks.
#   truths: list of {cause, ranks, steps ("all" | "strag" | list of iterations), rank_steps?}; a
#     run is right when every truth is among the findings and the top finding is one of them.
#     cause "untraced_culprit": the culprit's file was removed: right when no straggler finding names a
#     traced rank with confidence >= 0.5 and the analysis names the untraced ranks.
#   subset_of / drop: the run is <subset_of>_r<k> without the files of the ranks in `drop`.
R6 = {}
SMALL = dict(dim=256, batch=256, layers=4)  # 8-rank runs: 2 cores


def r6(name, **kw):
    kw.setdefault("world", 4)
    kw.setdefault("active", 8)
    kw.setdefault("record_shapes", False)
    kw.setdefault("dim", mr.MLP_DIM)
    kw.setdefault("batch", mr.MLP_BATCH)
    kw.setdefault("layers", mr.MLP_LAYERS)
    kw.setdefault("kind", "r6")
    R6[name] = kw


def T(cause, ranks=(), steps="all", **kw):
    return dict(cause=cause, ranks=list(ranks), steps=steps, **kw)


# Sizes: on this shared 2-core machine at load 7-10 the 4-rank MLP's step takes ~400-900 ms (compute ~330
# ms, 8x an idle machine), so host sleeps and loader waits are 250-400 ms to stand out of that noise.
# (a) two causes in one run
r6(
    "mix_strag_input",
    loader=dict(kind="dataloader", sleep_s=0.25, cpu_iters=20000),
    strags=[dict(rank=2, iters="all", n_mm=24, where="after_forward")],
    truths=[T("compute_straggler", [2], "strag"), T("input_bound")],
    note="every rank's DataLoader(num_workers=0) sleeps 250 ms + 20k Python iters per batch; rank 2 also "
    "+24 matmuls (~3x) after forward, every step",
)
r6(
    "mix_strag_input_gen",
    loader=dict(kind="generator", sleep_s=0.3, cpu_iters=0),
    strags=[dict(rank=1, iters="all", n_mm=18, where="before_forward")],
    truths=[T("compute_straggler", [1], "strag"), T("input_bound")],
    note="every rank's plain Python generator sleeps 300 ms per batch (unannotated); rank 1 also +18 "
    "matmuls before forward, every step",
)
r6(
    "mix_link_transient",
    net=dict(rank=1, rate="200mbit"),
    ring_numel=2**20,
    active=6,
    strags=[dict(rank=3, iters=[5], n_mm=36, where="after_forward")],
    truths=[T("slow_link", [1]), T("compute_straggler", [3], "strag")],
    note="ranks in network namespaces, rank 1's veth shaped to 200 Mbit/s both ways, a 4 MiB ring "
    "exchange (send r+1, recv r-1) after backward every step; rank 3 +36 matmuls after forward on "
    "iteration 5 only",
)
r6(
    "mix_host_transient",
    host=dict(rank=0, iters="all", sleep_s=0.4, where="after_forward"),
    strags=[dict(rank=2, iters=[4, 5], n_mm=36, where="after_forward")],
    truths=[T("host_straggler", [0]), T("compute_straggler", [2], "strag")],
    note="rank 0 time.sleep(400 ms) between forward and backward every step; rank 2 +36 matmuls after "
    "forward on iterations 4 and 5",
)
# (c) host-side causes
r6(
    "host_sleep_pre_fwd",
    host=dict(rank=3, iters="all", sleep_s=0.3, where="before_forward"),
    truths=[T("host_straggler", [3])],
    note="rank 3 time.sleep(300 ms) at the start of every step, before forward (its first collective "
    "is the gradient all-reduce in backward)",
)
r6(
    "host_sleep_after_bwd_w2",
    world=2,
    host=dict(rank=0, iters="all", sleep_s=0.3, where="after_backward"),
    truths=[T("host_straggler", [0])],
    note="2 ranks; rank 0 time.sleep(300 ms) after backward (after the all-reduce, before opt.step) every "
    "step: its peer waits in the next step",
)
r6(
    "gil_thread",
    gil=dict(rank=1),
    truths=[T("host_straggler", [1])],
    note="rank 1 runs a Python background thread in a busy loop (holds the GIL; switch interval 5 ms): its "
    "training thread waits for the GIL at every Python-level op call",
)
r6(
    "cpu_contend",
    contend=dict(rank=2, procs=3),
    truths=[T("compute_straggler", [2])],
    note="rank 2 pinned to CPU 1 with 3 busy-looping processes pinned there too (a slow core); other ranks unpinned",
)
# (d) 8 ranks, uneven batches, a moving straggler
r6(
    "strag8",
    world=8,
    active=6,
    **SMALL,
    strags=[dict(rank=5, iters="all", n_mm=24, where="after_forward")],
    truths=[T("compute_straggler", [5], "strag")],
    note="8-rank DDP, 4x Linear(256,256) batch 256; rank 5 +24 matmuls after forward, every step",
)
r6(
    "host8",
    world=8,
    active=6,
    **SMALL,
    host=dict(rank=6, iters="all", sleep_s=0.3, where="after_forward"),
    truths=[T("host_straggler", [6])],
    note="8-rank DDP, 4x Linear(256,256) batch 256; rank 6 time.sleep(300 ms) between forward and backward",
)
r6(
    "seqvar_shapes",
    kind="seqvar",
    record_shapes=True,
    truths=[T("sequence_imbalance")],
    note="4-rank DDP attention block; every rank draws its own sequence length each step "
    "(32..448, multiples of 32, log-uniform), record_shapes=True",
)
r6(
    "seqvar",
    kind="seqvar",
    truths=[T("sequence_imbalance")],
    note="as seqvar_shapes without record_shapes",
)
r6(
    "moving_strag_shapes",
    record_shapes=True,
    strags=[dict(rank=(i * 3) % 4, iters=[i], n_mm=24, where="after_forward") for i in range(2, 10)],
    truths=[T("compute_straggler", [0, 1, 2, 3], "strag")],
    note="+24 matmuls after forward on rank (3*i) mod 4 at iteration i: the straggler moves every step; "
    "equal batches, record_shapes=True",
)
r6(
    "moving_strag",
    strags=[dict(rank=(i * 3) % 4, iters=[i], n_mm=24, where="after_forward") for i in range(2, 10)],
    truths=[T("compute_straggler", [0, 1, 2, 3], "strag")],
    note="as moving_strag_shapes without record_shapes",
)
# (b) incomplete rank sets: a generated run with files removed
r6("sub_strag8_keep", kind="subset", subset_of="strag8", drop=[2, 7], note="strag8 without ranks 2 and 7")
r6(
    "sub_strag8_lost",
    kind="subset",
    subset_of="strag8",
    drop=[1, 5],
    truths=[T("untraced_culprit", [5])],
    note="strag8 without ranks 1 and 5 (the culprit)",
)
r6("sub_host_keep", kind="subset", subset_of="host_sleep_pre_fwd", drop=[0], note="host_sleep_pre_fwd without rank 0")
r6(
    "sub_host_lost",
    kind="subset",
    subset_of="host_sleep_pre_fwd",
    drop=[3],
    truths=[T("untraced_culprit", [3])],
    note="host_sleep_pre_fwd without rank 3 (the culprit)",
)
r6("sub_mix_keep", kind="subset", subset_of="mix_strag_input", drop=[0], note="mix_strag_input without rank 0")
r6(
    "sub_mix_lost",
    kind="subset",
    subset_of="mix_strag_input",
    drop=[2],
    truths=[T("input_bound"), T("untraced_culprit", [2])],
    note="mix_strag_input without rank 2 (the straggler): input_bound on the traced ranks, the straggler untraced",
)
for _c in R6.values():
    if _c["kind"] == "subset":
        _c.setdefault("truths", R6[_c["subset_of"]]["truths"])
        _c["world"] = R6[_c["subset_of"]]["world"]
# ---------------------------------------------------------------------------
# --set round7: scenarios not in rounds 1-6, nobody tuned against: 3-, 5- and 6-rank jobs, 4/5/7-step
# windows, one rank's slow DataLoader (input_straggler), a host straggler under a job-wide loader, two
# transient stragglers on different ranks, a periodic straggler, a one-step host episode, a slow node of
# two ranks, a slow link in a 3-rank ring, a GIL-holding thread on 3 ranks, a 5-rank healthy job, and
# incomplete rank sets of them (same keys as round 6; `loader.rank`: only that rank's loader is slow, the
# others' the same loader without the wait).
R7 = {}


def r7(name, **kw):
    r6(name, **kw)  # round 6's defaults
    R7[name] = R6.pop(name)


r7(
    "input_strag_w3",
    world=3,
    active=6,
    loader=dict(kind="dataloader", sleep_s=0.35, cpu_iters=0, rank=2),
    truths=[T("input_straggler", [2])],
    note="3 ranks, DataLoader(num_workers=0) on every rank; only rank 2's dataset sleeps 350 ms per batch",
)
r7(
    "mix_host_input",
    loader=dict(kind="dataloader", sleep_s=0.3, cpu_iters=0),
    host=dict(rank=3, iters="all", sleep_s=0.5, where="after_forward"),
    active=5,
    truths=[T("host_straggler", [3]), T("input_bound")],
    note="4 ranks; every rank's DataLoader sleeps 300 ms per batch; rank 3 also time.sleep(500 ms) between "
    "forward and backward every step",
)
r7(
    "mix_strag_gen_w3",
    world=3,
    active=7,
    loader=dict(kind="generator", sleep_s=0.3, cpu_iters=0),
    strags=[dict(rank=0, iters="all", n_mm=30, where="before_forward")],
    truths=[T("compute_straggler", [0], "strag"), T("input_bound")],
    note="3 ranks; every rank's plain generator sleeps 300 ms per batch (unannotated); rank 0 also +30 matmuls "
    "before forward, every step",
)
r7(
    "two_transients",
    active=7,
    strags=[
        dict(rank=0, iters=[3], n_mm=48, where="after_forward"),
        dict(rank=2, iters=[7], n_mm=48, where="after_forward"),
    ],
    truths=[T("compute_straggler", [0], "strag"), T("compute_straggler", [2], "strag")],
    note="4 ranks, 7 steps; rank 0 +48 matmuls after forward on iteration 3, rank 2 the same on iteration 7",
)
r7(
    "periodic_strag",
    strags=[dict(rank=1, iters=[3, 6, 9], n_mm=36, where="after_forward")],
    truths=[T("compute_straggler", [1], "strag")],
    note="4 ranks; rank 1 +36 matmuls after forward on every third iteration (3, 6, 9)",
)
r7(
    "host_episode_w3",
    world=3,
    active=5,
    host=dict(rank=1, iters=[4], sleep_s=1.0, where="before_forward"),
    truths=[T("host_straggler", [1], [4])],
    note="3 ranks, 5 steps; rank 1 time.sleep(1 s) at the start of iteration 4 only (a checkpoint-like pause)",
)
r7(
    "strag_w5_after_bwd",
    world=5,
    active=5,
    **SMALL,
    strags=[dict(rank=4, iters="all", n_mm=30, where="after_backward")],
    truths=[T("compute_straggler", [4], "strag")],
    note="5-rank DDP, 4x Linear(256,256) batch 256, 5 steps; rank 4 +30 matmuls after backward (after the "
    "all-reduce, before opt.step) every step",
)
r7(
    "slow_node_w6",
    world=6,
    active=5,
    **SMALL,
    strags=[dict(rank=r, iters="all", n_mm=30, where="after_forward") for r in (2, 3)],
    truths=[T("compute_straggler", [2, 3], "strag")],
    note="6-rank DDP, 4x Linear(256,256) batch 256, 5 steps; ranks 2 and 3 (a slow node) each +30 matmuls after "
    "forward every step",
)
r7(
    "slow_link_w3",
    world=3,
    active=5,
    net=dict(rank=0, rate="100mbit"),
    ring_numel=2**19,
    truths=[T("slow_link", [0])],
    note="3 ranks in network namespaces, rank 0's veth shaped to 100 Mbit/s both ways, a 2 MiB ring exchange "
    "(send r+1, recv r-1) after backward every step",
)
r7(
    "gil_thread_w3",
    world=3,
    active=5,
    gil=dict(rank=2),
    truths=[T("host_straggler", [2])],
    note="3 ranks, 5 steps; rank 2 runs a busy-looping Python thread (holds the GIL, 5 ms switch interval)",
)
r7(
    "host_after_bwd_a4",
    active=4,
    host=dict(rank=2, iters="all", sleep_s=0.4, where="after_backward"),
    truths=[T("host_straggler", [2])],
    note="4 ranks, 4 steps; rank 2 time.sleep(400 ms) after backward (after the all-reduce) every step",
)
r7(
    "healthy_w5",
    world=5,
    active=5,
    **SMALL,
    truths=[T("healthy", steps=[])],
    note="5-rank DDP, 4x Linear(256,256) batch 256, 5 steps, identical work on every rank",
)
r7(
    "sub_input_lost",
    kind="subset",
    subset_of="input_strag_w3",
    drop=[2],
    truths=[T("untraced_culprit", [2])],
    note="input_strag_w3 without rank 2 (the slow loader)",
)
r7(
    "sub_node_half",
    kind="subset",
    subset_of="slow_node_w6",
    drop=[3],
    truths=[T("compute_straggler", [2], "strag")],
    note="slow_node_w6 without rank 3 (one of the two slow ranks)",
)
r7("sub_w5_keep", kind="subset", subset_of="strag_w5_after_bwd", drop=[0, 1], note="strag_w5_after_bwd without 0, 1")
r7("sub_two_keep", kind="subset", subset_of="two_transients", drop=[1], note="two_transients without rank 1")
for _c in R7.values():
    if _c["kind"] == "subset":
        _c.setdefault("truths", R7[_c["subset_of"]]["truths"])
        _c["world"] = R7[_c["subset_of"]]["world"]
# ---------------------------------------------------------------------------
# --set round8: scenarios not in rounds 1-7, nobody tuned against: 2-, 7- and 8-rank jobs, a straggler that
# starts mid-run, two causes on different ranks in the same steps, a slow loader on every rank of a 7-rank
# job, uneven batch sizes (one rank's shard 3x the others', or every rank drawing its own batch size each
# step), a 3-stage pipeline whose middle stage is heavy, exposed communication on 8 ranks with no straggler,
# healthy 2- and 7-rank jobs, and incomplete rank sets of them. Same keys as round 6, and `batch_of`: {rank:
# batch} (an uneven shard), `batch_draw`: every rank draws its batch from BATCH_CHOICES each step,
# `stage_layers`: {stage: Linear layers} of a pipeline.
R8 = {}


def r8(name, **kw):
    r6(name, **kw)  # round 6's defaults
    R8[name] = R6.pop(name)


r8(
    "strag_from_mid",
    active=7,
    strags=[dict(rank=3, iters=[5, 6, 7, 8], n_mm=30, where="after_forward")],
    truths=[T("compute_straggler", [3], "strag")],
    note="4 ranks, 7 steps; rank 3 +30 matmuls after forward from iteration 5 to the end (a slowdown that "
    "starts mid-run: a throttling device)",
)
r8(
    "strag_w2_late",
    world=2,
    active=6,
    strags=[dict(rank=0, iters=[4, 5, 6, 7], n_mm=24, where="before_forward")],
    truths=[T("compute_straggler", [0], "strag")],
    note="2 ranks, 6 steps; rank 0 +24 matmuls before forward on iterations 4..7 (the last four)",
)
r8(
    "mix_strag_host_same",
    active=6,
    strags=[dict(rank=1, iters="all", n_mm=18, where="after_forward")],
    host=dict(rank=2, iters=[3, 5, 7], sleep_s=1.5, where="before_forward"),
    truths=[T("compute_straggler", [1], [2, 4, 6]), T("host_straggler", [2], [3, 5, 7])],
    note="4 ranks, 6 steps; rank 1 +18 matmuls (~2.5x) after forward every step, rank 2 time.sleep(1.5 s) before "
    "forward on iterations 3, 5, 7 (longer than rank 1's extra work there): two causes on different ranks, "
    "at once; rank 1 is what everyone waits for on the other steps",
)
r8(
    "input_all_w7",
    world=7,
    active=4,
    **SMALL,
    loader=dict(kind="dataloader", sleep_s=0.3, cpu_iters=0),
    truths=[T("input_bound")],
    note="7-rank DDP, 4x Linear(256,256) batch 256, 4 steps; every rank's DataLoader(num_workers=0) sleeps "
    "300 ms per batch (a job-wide slow input pipeline)",
)
r8(
    "shard_uneven",
    active=6,
    batch_of={2: 1536},
    truths=[T("compute_straggler", [2])],
    note="4 ranks, 6 steps; rank 2's batch is 1536 rows, the others' 512 (an uneven shard): the same ops, longer",
)
r8(
    "batch_draw",
    active=8,
    batch_draw=True,
    truths=[T("sequence_imbalance")],
    note="4-rank DDP MLP; every rank draws its batch size each step from 64..1536 (log-uniform): unbalanced "
    "batches that move between ranks, no record_shapes",
)
r8(
    "pp_heavy_mid_p3",
    kind="pipeline",
    world=3,
    active=6,
    schedule="GPipe",
    m=4,
    stage_layers={0: 2, 1: 6, 2: 2},
    truths=[T("stage_imbalance", [1])],
    note="3 stages, ScheduleGPipe, m=4; the middle stage holds 6 Linear(1024,1024) layers, the others 2",
)
r8(
    "comm_w8",
    kind="comm_linear",
    world=8,
    active=4,
    lin_dim=2048,
    lin_batch=8,
    truths=[T("comm_bound")],
    note="8-rank DDP over one Linear(2048,2048) (16 MiB grads), batch 8, 4 steps: communication exposed on "
    "every rank, no straggler",
)
r8(
    "healthy_w7",
    world=7,
    active=5,
    **SMALL,
    truths=[T("healthy", steps=[])],
    note="7-rank DDP, 4x Linear(256,256) batch 256, 5 steps, identical work",
)
r8(
    "healthy_w2_wide",
    world=2,
    active=6,
    dim=1024,
    batch=384,
    layers=2,
    truths=[T("healthy", steps=[])],
    note="2-rank DDP, 2x Linear(1024,1024) batch 384, 6 steps, identical work",
)
r8(
    "sub_mid_lost",
    kind="subset",
    subset_of="strag_from_mid",
    drop=[3],
    truths=[T("untraced_culprit", [3])],
    note="strag_from_mid without rank 3 (the culprit)",
)
r8(
    "sub_mix_one",
    kind="subset",
    subset_of="mix_strag_host_same",
    drop=[2],
    truths=[T("compute_straggler", [1], [2, 4, 6]), T("untraced_culprit", [2])],
    note="mix_strag_host_same without rank 2 (the host straggler): rank 1 stays, rank 2's steps untraced",
)
r8("sub_input_w7", kind="subset", subset_of="input_all_w7", drop=[0, 3, 6], note="input_all_w7 without 0, 3, 6")
for _c in R8.values():
    if _c["kind"] == "subset":
        _c.setdefault("truths", R8[_c["subset_of"]]["truths"])
        _c["world"] = R8[_c["subset_of"]]["world"]
# ---------------------------------------------------------------------------
# --set round9: communication-bound jobs that also have a straggler (mixed runs: exposed all-reduce time on every
# rank plus one rank's extra work), and their single-cause twins. `comm_dim`: one Linear(comm_dim, comm_dim) beside
# the MLP, fed one row (comm_dim² gradients for DDP's all-reduce, almost no compute); a straggler's `dim`/`batch`: the
# size of its extra matmuls, when not the MLP's.
R9 = {}
_MIXC = "MLP (4x Linear(256,256), batch 256) + Linear(8192,8192) fed one row (256 MiB of gradients)"
BIG_MM = dict(dim=1024, batch=512)  # a straggler's extra matmuls: Linear(1024,1024) on 512 rows each


def r9(name, **kw):
    r6(name, **kw)
    R9[name] = R6.pop(name)


r9(
    "mixc_strag_all",
    comm_dim=8192,
    **SMALL,
    active=6,
    strags=[dict(rank=2, iters="all", n_mm=12, where="after_forward", **BIG_MM)],
    truths=[T("compute_straggler", [2]), T("comm_bound")],
    note="4-rank DDP "
    + _MIXC
    + ": exposed all-reduce on every rank; rank 2 +12 matmuls of 512x1024 @ 1024x1024 after forward every step",
)
r9(
    "mixc_strag_heavy",
    comm_dim=10240,
    active=6,
    strags=[dict(rank=2, iters="all", n_mm=24, where="after_forward")],
    truths=[T("compute_straggler", [2]), T("comm_bound")],
    note="4-rank DDP MLP (the fixtures') + Linear(10240,10240) fed one row (400 MiB of gradients): exposed "
    "all-reduce on every rank; rank 2 +24 matmuls after forward every step (a persistent straggler)",
)
r9(
    "mixc_strag_before",
    comm_dim=8192,
    **SMALL,
    active=6,
    world=3,
    strags=[dict(rank=0, iters="all", n_mm=10, where="before_forward", **BIG_MM)],
    truths=[T("compute_straggler", [0]), T("comm_bound")],
    note="3-rank DDP " + _MIXC + ": exposed all-reduce; rank 0 +10 such matmuls before forward every step",
)
r9(
    "mixc_strag_some",
    comm_dim=8192,
    **SMALL,
    active=6,
    strags=[dict(rank=1, iters=[3, 5], n_mm=18, where="after_forward", **BIG_MM)],
    truths=[T("comm_bound"), T("compute_straggler", [1], "strag")],
    note="4-rank DDP " + _MIXC + ": exposed all-reduce every step; rank 1 +18 such matmuls on iterations 3 and 5 only",
)
r9(
    "mixc_comm_only",
    comm_dim=8192,
    **SMALL,
    active=6,
    truths=[T("comm_bound")],
    note="4-rank DDP " + _MIXC + ": exposed all-reduce on every rank, no straggler",
)
r9(
    "mixc_strag_only",
    active=6,
    strags=[dict(rank=2, iters="all", n_mm=24, where="after_forward")],
    truths=[T("compute_straggler", [2])],
    note="4-rank DDP MLP (no wide layer): rank 2 +24 matmuls after forward every step; communication small",
)
# ---------------------------------------------------------------------------
# --set round10: shapes a production job has that rounds 1-9 do not: one rank's data loader stalling every k
# steps (a shard on a slow filesystem), a rank slow from per-sample `.item()` calls (host-side synchronisations,
# many tiny ops) rather than from compute, a straggler handing off to another rank mid-window, a straggler
# amid drawn batch sizes, a rank whose profiler window starts one step later than the others', an odd
# 3-stage 1F1B split, and a 6-rank job traced on only 2 of its ranks with the culprit untraced. New keys:
# `loader.stall` {rank, iters, sleep_s}: that rank's Dataset sleeps in `__getitem__` on those iterations
# only; `host_items` {rank, n}: that rank runs n `.item()` calls on one-element results per step, after
# forward; `prof_wait` {rank: wait}: that rank's profiler schedule waits so many steps (the others 1).
R10 = {}


def r10(name, **kw):
    r6(name, **kw)
    R10[name] = R6.pop(name)


r10(
    "loader_stall_k3",
    active=8,
    loader=dict(kind="dataloader", sleep_s=0.0, cpu_iters=0, stall=dict(rank=1, iters=[3, 6, 9], sleep_s=0.6)),
    truths=[T("input_straggler", [1], [3, 6, 9])],
    note="4 ranks, DataLoader(num_workers=0) on every rank; rank 1's Dataset sleeps 600 ms in __getitem__ on "
    "iterations 3, 6, 9 only (a shard on a slow filesystem, every third step)",
)
r10(
    "host_item_sync",
    active=6,
    host_items=dict(rank=2, n=4000),
    truths=[T("host_straggler", [2])],
    note="4 ranks; rank 2 runs 4000 per-sample `.item()` calls (a metric per element: select, mul, item) after "
    "forward every step: many tiny ops and host syncs, little compute",
)
r10(
    "strag_handoff",
    active=8,
    strags=[
        dict(rank=0, iters=[2, 3, 4, 5], n_mm=30, where="after_forward"),
        dict(rank=3, iters=[6, 7, 8, 9], n_mm=30, where="after_forward"),
    ],
    truths=[T("compute_straggler", [0], "strag"), T("compute_straggler", [3], "strag")],
    note="4 ranks; rank 0 +30 matmuls after forward on iterations 2..5, then rank 3 the same on 6..9 (two "
    "stragglers, each on its own half of the window)",
)
r10(
    "strag_amid_draw",
    active=8,
    batch_draw=True,
    strags=[dict(rank=2, iters="all", n_mm=36, where="after_forward")],
    truths=[T("compute_straggler", [2])],
    note="4 ranks; every rank draws its batch size each step from 64..1536 (unbalanced batches) and rank 2 also "
    "runs +36 matmuls after forward every step (a slow rank amid batch noise)",
)
r10(
    "shifted_window",
    active=7,
    prof_wait={1: 2},
    strags=[dict(rank=3, iters="all", n_mm=24, where="after_forward")],
    truths=[T("compute_straggler", [3])],
    note="4 ranks, 7 profiled steps; rank 1's profiler waits one step more (its window is iterations 3..9, the "
    "others' 2..8: steps numbered alike, windows shifted); rank 3 +24 matmuls after forward every step",
)
r10(
    "pp_1f1b_odd_p3",
    kind="pipeline",
    world=3,
    active=6,
    schedule="1F1B",
    m=6,
    stage_layers={0: 5, 1: 2, 2: 2},
    truths=[T("stage_imbalance", [0])],
    note="3 stages, Schedule1F1B, m=6; 9 Linear(1024,1024) split 5/2/2 (an odd split: the first stage holds "
    "the extra layers)",
)
r10(
    "host_w6",
    world=6,
    active=6,
    **SMALL,
    host=dict(rank=4, iters="all", sleep_s=0.4, where="before_forward"),
    truths=[T("host_straggler", [4])],
    note="6-rank DDP, 4x Linear(256,256) batch 256; rank 4 time.sleep(400 ms) at the start of every step",
)
r10(
    "sub_w6_two",
    kind="subset",
    subset_of="host_w6",
    drop=[2, 3, 4, 5],
    truths=[T("untraced_culprit", [4])],
    note="host_w6 traced on ranks 0 and 1 only (a third of the job; the culprit untraced)",
)
for _c in R10.values():
    if _c["kind"] == "subset":
        _c["world"] = R10[_c["subset_of"]]["world"]
SETS = {
    "heldout": (S, OUT),
    "healthy2": (H, Path(os.environ.get("HELDOUT2_OUT", TMP / "heldout2"))),
    "round6": (R6, Path(os.environ.get("HELDOUT6_OUT", TMP / "heldout6"))),
    "round7": (R7, Path(os.environ.get("HELDOUT7_OUT", TMP / "heldout7"))),
    "round8": (R8, Path(os.environ.get("HELDOUT8_OUT", TMP / "heldout8"))),
    "round9": (R9, Path(os.environ.get("HELDOUT9_OUT", TMP / "heldout9"))),
    "round10": (R10, Path(os.environ.get("HELDOUT10_OUT", TMP / "heldout10"))),
}
ALL = {**S, **H, **R6, **R7, **R8, **R9, **R10}


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


def _slow_batches(torch, rank, seed, batch, dim, sleep_s, cpu_iters, kind, stall=None):
    """Batches made on the host: each sleeps `sleep_s` and spins `cpu_iters` Python iterations, served by a
    `DataLoader(num_workers=0)` (`kind` "dataloader") or a plain generator (anything else). `stall` (iterations,
    seconds): the batch of those iterations sleeps that much more (batch k is iteration k - 1: the un-profiled
    warm-up iteration -1 takes batch 0)."""
    from torch.utils.data import DataLoader, Dataset

    def make(idx):
        if sleep_s:
            time.sleep(sleep_s)
        if stall and idx - 1 in stall[0]:
            time.sleep(stall[1])
        acc = 0
        for k in range(cpu_iters):
            acc = (acc * 31 + k + idx) % 1000003
        gen = torch.Generator().manual_seed(idx * 7 + rank + 1000 * seed)
        return torch.randn(batch, dim, generator=gen), torch.randint(0, 10, (batch,), generator=gen)

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

    if kind == "dataloader":
        return iter(DataLoader(SlowDS(), batch_size=None, shuffle=False, num_workers=0))
    return gen_loader()


def body_input(torch, rank, cfg, seed):
    B, D = cfg["batch"], cfg["dim"]
    it = _slow_batches(torch, rank, seed, B, D, cfg["sleep_s"], cfg["cpu_iters"], cfg["loader"])
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
    for _ in range(cfg.get("stage_layers", {}).get(rank, mr.PP_LAYERS_PER_STAGE)):
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


_CLEANUP = []  # processes a body started (cpu_contend's busy loops), ended by _worker


def _busy_forever():
    acc = 0
    while True:
        for k in range(1000):
            acc = (acc * 31 + k) % 1000003


def _r6_hooks(torch, rank, cfg):
    """The injections of `cfg` for `rank`: a function (iteration, place) -> None that runs them."""
    strags = [st for st in cfg.get("strags", []) if st["rank"] == rank]
    host = cfg.get("host") if cfg.get("host", {}).get("rank") == rank else None
    items = cfg.get("host_items") if cfg.get("host_items", {}).get("rank") == rank else None
    vals = torch.randn(256)

    def hook(i, where):
        if items and where == "after_forward" and i >= 0:  # a per-element metric read back one .item() at a time
            acc = 0.0
            for k in range(items["n"]):
                acc += (vals[k % 256] * 2).item()
        for st in strags:
            if st["where"] == where and (st["iters"] == "all" or i in st["iters"]):
                mr._extra_compute(
                    torch, n=st["n_mm"], dim=st.get("dim", cfg["dim"]), batch=st.get("batch", cfg["batch"])
                )
        if host and host["where"] == where and i >= 0 and (host["iters"] == "all" or i in host["iters"]):
            time.sleep(host["sleep_s"])

    return hook


def _r6_loader(torch, rank, cfg, seed):
    """A function iteration -> (x, y): random batches (`batch_of` a rank's own size, `batch_draw` a size drawn
    per step), or those of a slow loader."""
    ld = cfg.get("loader")
    B, D = cfg.get("batch_of", {}).get(rank, cfg["batch"]), cfg["dim"]
    g = torch.Generator().manual_seed(seed * 100 + rank)
    if not ld:

        def make(i):
            b = batch_size(seed, rank, i) if cfg.get("batch_draw") else B
            return torch.randn(b, D, generator=g), torch.randint(0, 10, (b,), generator=g)

        return make
    slow = ld.get("rank", rank) == rank  # `rank`: only that rank's loader waits
    sleep_s, cpu_iters = (ld["sleep_s"], ld["cpu_iters"]) if slow else (0, 0)
    st = ld.get("stall")
    stall = (set(st["iters"]), st["sleep_s"]) if st and st["rank"] == rank else None
    it = _slow_batches(torch, rank, seed, B, D, sleep_s, cpu_iters, ld["kind"], stall)
    return lambda i: next(it)


def _with_wide_layer(torch, mlp, dim):
    """`mlp` beside one Linear(dim, dim) fed a single row: little compute, dim² gradients for DDP's all-reduce
    (`comm_dim`: communication that the small MLP's backward cannot hide)."""
    nn = torch.nn

    class Wide(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp, self.wide = mlp, nn.Linear(dim, dim)
            self.register_buffer("z", torch.ones(1, dim))

        def forward(self, x):
            return self.mlp(x) + self.wide(self.z).mean()

    return Wide()


def body_r6(torch, rank, cfg, seed):
    """DDP MLP with round 6's injections: extra matmuls, host sleeps, a slow loader, a GIL-holding
    thread, a CPU-starved rank, a ring exchange after backward (for the shaped link)."""
    import threading

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    cd = cfg.get("comm_dim")
    ddp = DDP(
        _with_wide_layer(torch, mr._mlp(torch, dim=cfg["dim"], layers=cfg["layers"]), cd)
        if cd
        else mr._mlp(torch, dim=cfg["dim"], layers=cfg["layers"])
    )
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    lossf = torch.nn.CrossEntropyLoss()
    batch = _r6_loader(torch, rank, cfg, seed)
    hook = _r6_hooks(torch, rank, cfg)
    if cfg.get("gil", {}).get("rank") == rank:
        threading.Thread(target=_busy_forever, daemon=True).start()
    ct = cfg.get("contend")
    if ct and ct["rank"] == rank:
        os.sched_setaffinity(0, {1})
        for _ in range(ct["procs"]):
            code = "import os\nos.sched_setaffinity(0, {1})\nwhile True: pass\n"
            _CLEANUP.append(subprocess.Popen([sys.executable, "-c", code]))
    ring = None
    if cfg.get("ring_numel"):
        W = cfg["world"]
        ring = (torch.randn(cfg["ring_numel"]), torch.empty(cfg["ring_numel"]), (rank + 1) % W, (rank - 1) % W)

    def step(i):
        x, y = batch(i)
        hook(i, "before_forward")
        loss = lossf(ddp(x), y)
        hook(i, "after_forward")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        hook(i, "after_backward")
        if ring:
            snd, rcv, nxt, prv = ring
            for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, snd, nxt), dist.P2POp(dist.irecv, rcv, prv)]):
                w.wait()
        opt.step()

    return step


SEQ_CHOICES = [32, 48, 64, 96, 128, 192, 256, 320, 448]  # ~log-uniform sequence lengths
BATCH_CHOICES = [64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536]  # ~log-uniform batch sizes (round 8)


def batch_size(seed, rank, i):
    """The batch size `rank` draws at iteration i under `batch_draw` (a function of the seed: the manifest has it)."""
    import random

    return random.Random(seed * 100_019 + i * 103 + rank).choice(BATCH_CHOICES)


def seq_len(seed, rank, i):
    """The sequence length `rank` draws at iteration i (a function of the seed only: the manifest recomputes it)."""
    import random

    return random.Random(seed * 100_003 + i * 101 + rank).choice(SEQ_CHOICES)


def body_seqvar(torch, rank, cfg, seed):
    from torch.nn.parallel import DistributedDataParallel as DDP

    nn = torch.nn
    D, V = 192, 1000

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.qkv = nn.Linear(D, 3 * D)
            self.out = nn.Linear(D, D)
            self.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.ReLU(), nn.Linear(4 * D, D))
            self.head = nn.Linear(D, 10)

        def forward(self, idx):
            h = self.emb(idx)
            q, k, v = self.qkv(h).chunk(3, dim=-1)
            h = h + self.out(torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) / D**0.5, dim=-1), v))
            return self.head((h + self.ff(h)).mean(dim=1))

    torch.manual_seed(0)
    ddp = DDP(Block())
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    lossf = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(seed * 100 + rank)

    def step(i):
        idx = torch.randint(0, V, (4, seq_len(seed, rank, i)), generator=g)
        loss = lossf(ddp(idx), torch.randint(0, 10, (4,), generator=g))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


BODIES = {
    "r6": body_r6,
    "seqvar": body_seqvar,
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


def _worker(rank, world, port, name, cfg, seed, outdir, addr="127.0.0.1"):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)
    try:
        step = BODIES[cfg["kind"]](torch, rank, cfg, seed)
        step(-1)
        dist.barrier()
        from torch.profiler import ProfilerActivity, profile, schedule

        path = Path(outdir) / f"rank{rank}.pt.trace.json.gz"
        iter_to_step = {}
        waits = {int(r): w for r, w in cfg.get("prof_wait", {}).items()}
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=waits.get(rank, 1), warmup=1, active=cfg["active"], repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
            record_shapes=cfg["record_shapes"],
        ) as prof:
            for i in range(1 + max(waits.values(), default=1) + cfg["active"]):
                iter_to_step[i] = prof.step_num  # the ProfilerStep#N that wraps iteration i
                step(i)
                prof.step()
        dist.barrier()
        if rank == 0:
            (Path(outdir) / "iter_to_step.tmp").write_text(json.dumps(iter_to_step))
    finally:
        for p in _CLEANUP:
            p.kill()
        dist.destroy_process_group()


def _launch_netns(name, cfg, seed, outdir):
    """Each rank a process in its own network namespace (make_lateness_runs' bridge), the `net` rank's
    veth shaped both ways at net["rate"]."""
    import make_lateness_runs as ml

    ml.LINK_RATE = cfg["net"]["rate"]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="tdeth")
    with ml._namespaces(cfg["world"], cfg["net"]["rank"]) as prefixes:
        procs = [
            subprocess.Popen(
                [*prefixes[r], sys.executable, __file__, "--worker", name, str(r), str(seed), str(outdir)], env=env
            )
            for r in range(cfg["world"])
        ]
        rcs = [p.wait(timeout=900) for p in procs]
    if any(rcs):
        msg = f"{name}: worker exit codes {rcs}"
        raise RuntimeError(msg)


def _truth_steps(t, cfg, i2s, prof_steps):
    """A truth's ProfilerStep numbers, and per culprit rank its own (a moving straggler's differ)."""
    if t["steps"] == "all":
        return prof_steps, {}
    if t["steps"] != "strag":
        return sorted(i2s[i] for i in t["steps"] if i2s[i] in prof_steps), {}
    per = {}
    for st in cfg.get("strags", []):
        if st["rank"] in t["ranks"]:
            iters = range(2 + cfg["active"]) if st["iters"] == "all" else st["iters"]
            per.setdefault(st["rank"], set()).update(i2s[i] for i in iters if i2s[i] in prof_steps)
    per = {r: sorted(v) for r, v in per.items()}
    return sorted(set().union(*per.values())), per


def generate6(name, repeat):
    """A round-6 run: generated (spawned, or in network namespaces), or a copy of another without some ranks."""
    import torch

    cfg = ALL[name]
    outdir = OUT / f"{name}_r{repeat}"
    outdir.mkdir(parents=True, exist_ok=True)
    for f in outdir.glob("*"):
        f.unlink()
    t0 = time.time()
    if cfg["kind"] == "subset":
        src = OUT / f"{cfg['subset_of']}_r{repeat}"
        sman = json.loads((src / "manifest.json").read_text())
        traced = [r for r in range(cfg["world"]) if r not in cfg["drop"]]
        for r in traced:
            (outdir / f"rank{r}.pt.trace.json.gz").write_bytes((src / f"rank{r}.pt.trace.json.gz").read_bytes())
        i2s = {int(k): v for k, v in sman["iteration_to_profiler_step"].items()}
        own = ("truths", "note", "drop", "subset_of")
        cfg = {**ALL[cfg["subset_of"]], **{k: v for k, v in cfg.items() if k in own}}
    else:
        traced = list(range(cfg["world"]))
        if "net" in cfg:
            _launch_netns(name, cfg, repeat, outdir)
        else:
            import torch.multiprocessing as mp

            args = (cfg["world"], mr._free_port(), name, cfg, repeat, str(outdir))
            mp.spawn(_worker, args=args, nprocs=cfg["world"])
        i2s = {int(k): v for k, v in json.loads((outdir / "iter_to_step.tmp").read_text()).items()}
        (outdir / "iter_to_step.tmp").unlink()
    ev = {r: mr.trace_evidence(outdir / f"rank{r}.pt.trace.json.gz") for r in traced}
    prof_steps = sorted(set.intersection(*(set(e["steps"]) for e in ev.values())))  # all traced ranks' (prof_wait)
    truths = []
    for t in cfg["truths"]:
        steps, per = _truth_steps(t, cfg, i2s, prof_steps)
        truths.append({**t, "steps": steps} | ({"rank_steps": {str(r): v for r, v in per.items()}} if per else {}))
    comp = {r: {n: e["steps"][n]["dur_ms"] - e["steps"][n]["idle_ms"] for n in prof_steps} for r, e in ev.items()}

    def ratio(r, n):
        others = [comp[o][n] for o in comp if o != r]
        return round(comp[r][n] / max(statistics.median(others), 1e-6), 2)

    man = {
        "scenario": name,
        "repeat": repeat,
        "truths": truths,
        "cause": truths[0]["cause"],
        "ranks": truths[0]["ranks"],
        "steps": truths[0]["steps"],
        "world_size": cfg["world"],
        "traced_ranks": traced,
        "profiler_steps": prof_steps,
        "iteration_to_profiler_step": i2s,
        "note": cfg["note"],
        "config": {k: v for k, v in cfg.items() if k not in ("truths", "note")},
        "torch": torch.__version__,
        "seconds": round(time.time() - t0, 1),
        "observed": {
            str(r): {
                "median_step_ms": round(statistics.median(s["dur_ms"] for s in e["steps"].values()), 1),
                "median_non_compute_frac": round(
                    statistics.median(s["idle_ms"] / s["dur_ms"] for s in e["steps"].values()), 3
                ),
                "compute_ratio_by_step": {str(n): ratio(r, n) for n in prof_steps},
            }
            for r, e in ev.items()
        },
    }
    if cfg.get("batch_draw"):
        man["batch_by_step"] = {str(i2s[i]): [batch_size(repeat, r, i) for r in range(cfg["world"])] for i in i2s}
    if cfg["kind"] == "seqvar":
        man["seq_len_by_step"] = {str(i2s[i]): [seq_len(repeat, r, i) for r in range(cfg["world"])] for i in i2s}
    (outdir / "manifest.json").write_text(json.dumps(man, indent=2) + "\n")
    print(f"generated {outdir.name} in {man['seconds']}s: truths {truths}", flush=True)
    return outdir


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


STRAGGLERS = ("compute_straggler", "host_straggler", "input_straggler")


def _truth_ok(t, f, traced, kept, untraced, culprits=frozenset()):
    """(found, ranks right, steps right) of one round-6 truth among the findings `f`."""
    if t["cause"] == "untraced_culprit":  # no confident straggler on a traced rank but the run's other culprits
        blamed = [
            x for x in f if x["cause"] in STRAGGLERS and x["confidence"] >= 0.5 and not set(x["ranks"]) <= culprits
        ]
        ok = not blamed and set(t["ranks"]) <= set(untraced)
        return ok, ok, ok
    same = [x for x in f if x["cause"] == t["cause"]]
    if not same:
        return False, False, False
    t_ranks = t["ranks"] or traced
    t_steps = [s for s in t["steps"] if s in kept]
    if len(t_ranks) > 1 and t.get("rank_steps"):  # a moving straggler: a finding per rank, all together
        got = {(r, s) for x in same for r in x["ranks"] for s in x["steps"]}
        want = {(int(r), s) for r, v in t["rank_steps"].items() for s in v if s in kept}
        return True, {r for r, _ in got} == set(t_ranks), got == want
    best = max(same, key=lambda x: len(set(x["ranks"]) & set(t_ranks)))
    return True, sorted(best["ranks"]) == sorted(t_ranks), sorted(best["steps"]) == sorted(t_steps)


def score6(outdir, man, a):
    f = a["findings"]
    traced = man["traced_ranks"]
    kept = a["run"]["steps"]
    untraced = (a.get("lateness") or {}).get("untraced") or []
    missing = [r for r in range(man["world_size"]) if r not in traced]
    culprits = {r for t in man["truths"] if t["cause"] != "untraced_culprit" for r in t["ranks"]}
    oks = [_truth_ok(t, f, traced, kept, untraced, culprits) for t in man["truths"]]
    named = {t["cause"] for t in man["truths"]}
    top_ok = f[0]["cause"] in named or (
        "untraced_culprit" in named and not (f[0]["cause"] in STRAGGLERS and f[0]["confidence"] >= 0.5)
    )
    return {
        "run": outdir.name,
        "scenario": man["scenario"],
        "repeat": man["repeat"],
        "truth": {"cause": "+".join(t["cause"] for t in man["truths"]), "ranks": man["ranks"], "steps": man["steps"]},
        "truths": man["truths"],
        "missing": missing,
        "untraced_named": sorted(untraced) == missing,
        "kept_steps": kept,
        "excluded_steps": a["run"]["excluded_steps"],
        "findings": [
            {k: x[k] for k in ("cause", "ranks", "steps", "confidence", "time_lost_ns")}
            | {"evidence": x["evidence"], "summary": x["summary"]}
            for x in f
        ],
        "top": {
            "cause": f[0]["cause"],
            "ranks": f[0]["ranks"],
            "steps": f[0]["steps"],
            "confidence": round(f[0]["confidence"], 2),
            "time_lost_ms": round(f[0]["time_lost_ns"] / 1e6, 1),
        },
        "per_truth": [dict(cause=t["cause"], found=o[0], ranks=o[1], steps=o[2]) for t, o in zip(man["truths"], oks)],
        "cause_ok": top_ok and all(o[0] for o in oks),
        "cause_in_findings": all(o[0] for o in oks),
        "ranks_ok": all(o[1] for o in oks) and sorted(untraced) == missing,
        "steps_ok": all(o[2] for o in oks),
        "observed": man["observed"],
    }


def score(outdir):
    man = json.loads((outdir / "manifest.json").read_text())
    p = subprocess.run([TRACEDIAG, "analyze", str(outdir), "--format", "json"], capture_output=True, text=True)
    if p.returncode not in (0, 3):
        return {"run": outdir.name, "error": p.stderr.strip()[-500:]}
    a = json.loads(p.stdout)
    if "truths" in man:
        return score6(outdir, man, a)
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


def table6(results):
    """Round 6's table: every truth of a run, the findings with their confidence, the untraced ranks."""
    yn = lambda b: "yes" if b else "**no**"  # noqa: E731
    rows = [
        "| run | truths (cause ranks) | findings (cause ranks steps conf) | missing / named untraced | cause | ranks | "
        "steps |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['run']} | | ERROR {r['error'][:80]} | | | | |")
            continue
        k = r["kept_steps"]
        truths = "; ".join(f"{t['cause']} {t['ranks'] or '-'} {_fmt_steps(t['steps'], k)}" for t in r["truths"])
        found = "; ".join(
            f"{x['cause']} {x['ranks']} {_fmt_steps(x['steps'], k)} {x['confidence']:.2f}" for x in r["findings"]
        )
        miss = f"{r['missing'] or '-'} / {'yes' if r['untraced_named'] else '**no**'}"
        rows.append(
            f"| {r['run']} | {truths} | {found} | {miss} | {yn(r['cause_ok'])} | {yn(r['ranks_ok'])} | "
            f"{yn(r['steps_ok'])} |"
        )
    n = sum(1 for r in results if "error" not in r)
    acc = {k: sum(bool(r.get(k)) for r in results) for k in ("cause_ok", "cause_in_findings", "ranks_ok", "steps_ok")}
    rows.append("")
    rows.append(
        f"causes right {acc['cause_ok']}/{n}; every truth among findings {acc['cause_in_findings']}/{n}; "
        f"ranks right {acc['ranks_ok']}/{n}; steps right {acc['steps_ok']}/{n}"
    )
    return "\n".join(rows)


def table(results):
    if results and "truths" in results[0]:
        return table6(results)
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


def _worker_main(argv):
    """`--worker NAME RANK SEED OUTDIR`: one rank of a run launched in a network namespace."""
    import make_lateness_runs as ml

    name, rank, seed, outdir = argv[0], int(argv[1]), int(argv[2]), argv[3]
    cfg = ALL[name]
    _worker(rank, cfg["world"], 29611, name, cfg, seed, outdir, addr=f"{ml.NET_PREFIX}.1")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return _worker_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--set",
        default="heldout",
        choices=sorted(SETS),
        help="heldout: round 1-2 scenarios into $HELDOUT_OUT; healthy2: round 3 new healthy runs into "
        "$HELDOUT2_OUT; round6: mixed causes, incomplete rank sets, host-side causes, 8 ranks into $HELDOUT6_OUT; "
        "round7: 3/5/6 ranks, 4/5/7 steps, input straggler, slow node, periodic and two transients into $HELDOUT7_OUT; "
        "round8: 2/7/8 ranks, mid-run and simultaneous causes, uneven batches, a heavy middle stage into "
        "$HELDOUT8_OUT; "
        "round9: communication-bound jobs with a straggler, and their single-cause twins into $HELDOUT9_OUT; "
        "round10: periodic loader stalls, .item() syncs, a straggler hand-off, a straggler amid drawn batches, a "
        "shifted profiler window, an odd 1F1B split, a 6-rank job traced on 2 ranks into $HELDOUT10_OUT",
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
                (generate6 if args.set.startswith("round") else generate)(name, k)
            if (d / "manifest.json").exists():
                dirs.append(d)
    results = [score(d) for d in dirs]
    if not args.only:
        (OUT / "results.json").write_text(json.dumps(results, indent=1))
        (OUT / "results.md").write_text(table(results) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()

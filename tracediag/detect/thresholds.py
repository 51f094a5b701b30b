"""The numbers that separate a cause from noise, with where each default comes from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Thresholds:
    """Detector thresholds. Ratios are of medians over ranks or steps, so one noisy step or rank
    cannot reach them alone."""

    straggler_persistent_ratio: float = 1.3
    """A rank's compute, median over steps, at least this times its peers' median. NVRx flags a
    relative score below 0.7 (≈ 1.43×); MegaScale's stragglers were ~1.1× in forward; 1.3 sits
    above the 1.5× single-step noise of a loaded host once the median over steps is taken."""
    straggler_pattern_share: float = 0.75
    """A rank with the straggler pattern (last to arrive while its peers wait for its extra
    compute) on at least this share of the steps is a persistent straggler once its median compute
    ratio reaches `straggler_min_ratio`: being last with everyone waiting, step after step, is the
    signal; the size of the excess only has to clear noise (MegaScale's slow hosts were ~1.1×)."""
    straggler_ratio_pattern_share: float = 0.5
    """A rank at `straggler_persistent_ratio` also needs the pattern on at least this share of the
    steps: its peers wait for it on most steps, not on a few noisy ones."""
    straggler_min_ratio: float = 1.1
    """The least median compute ratio of a pattern-consistent persistent straggler."""
    straggler_pattern_chance: float = 0.01
    """...and being last that often must be unlikely by chance: P(≥ k of n steps) under a
    Binomial(n, 1/ranks) at most this. With 2 ranks one of them is always last, so 6 of 8 steps
    happens 14% of the time by chance (0.4% with 4 ranks)."""
    straggler_transient_ratio: float = 2.0
    """A single step is a straggler step when it shows the pattern, the step is slow for the whole
    job (`straggler_slow_step`) and the rank computes at least this times its peers' median: Holmes
    calls iterations over 2× normal irregular, and single healthy steps of an oversubscribed host
    reach 1.5–1.8× (with their peers waiting, so the pattern alone cannot tell)."""
    straggler_episode_ratio: float = 1.5
    """A step next to a transient straggler step of the same rank joins the episode at this lower
    ratio (with the pattern and a slow step): noise rarely strikes the same rank on adjacent steps."""
    straggler_slow_step: float = 1.2
    """...and the step itself is at least this times the median step (the job felt it; What-if
    counts a job straggling at S > 1.1)."""
    straggler_min_excess: float = 0.1
    """The rank's compute excess over its peers is at least this share of the step."""
    straggler_peer_wait: float = 0.5
    """The peers wait in the step's collectives at least this share of the excess (they absorb it),
    while the rank itself waits at most this share of the peers' wait (it arrives last)."""
    comm_share: float = 0.4
    """comm_bound: exposed collective communication at least this share of the step, median over
    ranks (healthy overlapped DDP: ~20%; the brief's 40–50%)."""
    comm_share_min_rank: float = 0.25
    """...and on every rank at least this share (job-wide, not one rank)."""
    comm_near_peak: float = 0.7
    """Achieved bus bandwidth at or above this share of the link peak: the link is saturated
    (nccl-tests reach 75–90% of peak)."""
    comm_far_below: float = 0.3
    """At or below this share: a slow or degraded link."""
    bubble_share: float = 0.15
    """pipeline_bubble: stages idle (no compute, no collective) at least this share of the step,
    median over stages."""
    step_share: float = 0.5
    """Once a job-wide cause (comm_bound, input_bound, pipeline_bubble) holds for the run (medians
    over steps and ranks), a step belongs to it when its own share reaches this fraction of the
    cause's threshold: single steps of a persistent cause scatter around the run's median, and
    cutting them at the full threshold would make the step list random."""
    input_share: float = 0.2
    """input_bound: data loading at least this share of the step on every rank (median over steps)."""
    input_stall: float = 0.5
    """...with the device idle from step start to first compute for at least this share of the
    loading time (the loader starves the device instead of running ahead)."""
    input_starved_share: float = 0.5
    """...on at least this share of a rank's steps, median over ranks: most steps, not a loader that
    falls behind now and then."""
    host_idle_share: float = 0.3
    """host_bound: the GPU idle (no compute, communication or copy) at least this share of the step,
    median over GPU ranks. Well-fed GPU traces idle 1–16% of the step (ns_resolution_trace,
    trace_diff); 30% is about twice the worst of them."""
    host_sync_share: float = 0.25
    """The hint blames synchronizations when blocking calls hold the host at least this share of the
    device's idle time."""
    host_launch_share: float = 0.5
    """Else it blames launch overhead when launch calls take at least this share of the idle time
    (half of it: launching, not the work between launches, sets the pace) ..."""
    host_small_kernel_share: float = 0.5
    """... or when at least this share of the kernels run shorter than their own launch with the queue
    at most `host_shallow_queue` deep, and launches take at least `host_launch_share_small_kernels`
    of the idle: kernels that finish before the next is launched idle the device at any share."""
    host_launch_share_small_kernels: float = 0.25
    """The launch share of the idle that blames launch overhead when most kernels are small."""
    host_shallow_queue: int = 2
    """A launch queue at most this deep (median) runs dry between kernels; a deeper one holds work."""
    host_held_share: float = 0.5
    """Else the hint blames work queued but held (events between streams, another device) when at
    least this share of the idle is "other" (not an empty queue, not launch latency) and the queue is
    deeper than `host_shallow_queue`."""
    host_input_hint_share: float = 0.1
    """Else it points at the data path when loading takes at least this share of the step (the hint
    only: half of `input_share`, which input_bound needs)."""
    host_on_host_share: float = 0.5
    """The summary says the device waits on its host when at least this share of the idle has
    nothing queued or only launch latency; below it the idle is held by syncs or events the trace
    may not link, and the confidence is halved unless synchronizations explain it."""
    bubble_of_ideal: float = 0.8
    """pipeline_bubble also needs the stages' idle share at least this times the ideal bubble
    (p−1)/(m+p−1): a schedule idles at least about its ideal; far below it the send/recv traffic is
    not a pipeline schedule (the real GPipe m=1 run idles 74% against 75%)."""
    warmup_ratio: float = 1.5
    """A leading step is warm-up when every rank's step, less its wait for peers in collectives, takes
    at least this times that rank's median of the same over the later steps (first iterations
    allocate, compile, build buckets on every rank; a rank that only waits for a slow peer is not
    slow itself)."""
    stage_ratio: float = 1.5
    """stage_imbalance: the heaviest pipeline stage's compute (median over steps) at least this times the
    median of the other stages'. The balanced 4-stage CPU pipelines here (the last stage adds a
    Linear(1024,10) and the loss) reach at most ~1.2x; a transformer's last stage with the logits and
    the loss over a 32k–256k vocabulary is commonly 1.5–3x a decoder stage."""
    stage_heavy_share: float = 0.75
    """...and it is the heaviest stage on at least this share of the steps (a persistent property of
    the partition, not one slow step)."""
    stage_wait: float = 0.5
    """...and the other stages wait (send/recv waits + idle, median) at least this share of its excess
    compute: they absorb it, the schedule does not hide it."""
    seq_step_ratio: float = 1.5
    """sequence_imbalance: a step is imbalanced when its slowest rank computes at least this times its
    peers' median, with the straggler pattern (last at a collective, the peers waiting for it). Single
    healthy steps of an oversubscribed host reach 1.5–1.8x, so the step count below does the separating."""
    seq_step_share: float = 0.5
    """...on at least this share of the steps (and at least `persistent_min_steps` + 1 steps)."""
    seq_max_rank_share: float = 0.5
    """...with no rank the slowest on more than this share of those steps (else it is one slow worker:
    compute_straggler) ..."""
    seq_min_slowest_ranks: int = 3
    """... and at least this many different slowest ranks (every rank on a smaller job): two slow
    workers taking turns are two stragglers, not uneven batches."""
    seq_min_corr: float = 0.5
    """... and, where the trace records the batches' shapes (Σ sequence length² per rank-step), the compute
    follows them at least this well (Pearson r): equal batches, or batches the compute does not follow,
    make the changing slowest rank something else (contention, noise). The real uneven-batch run reads
    r 0.86; 0.5 leaves half the variance explained."""
    lateness_together: float = 0.5
    """Ranks everyone waits for are explained as one group (a slow node) when the collectives where each is
    late (`lateness_late_share`) overlap at least this much (Jaccard); apart, each is its own cause with its
    own steps (two ranks late at different steps for different reasons)."""
    lateness_late_share: float = 0.5
    """A rank is *late* at a collective, for grouping, when it arrives at least this share of the last
    arrival's lateness after the median arrival: of a slow node's ranks only one is last at each collective,
    the others a few per cent earlier, all far behind the median."""
    lateness_masked: int = 8
    """When the ranks named explain less than `lateness_share` of the waiting counterfactually (had they
    arrived with the others, the peers would still wait that much for the next latest: a slow node whose
    slowest rank masks the others), the next latest ranks join them, at most this many (a node's GPUs),
    until the set explains it."""
    lateness_share: float = 0.5
    """The ranks everyone waits for explain at least this share of all waiting in collectives
    (most of it: a set explaining less leaves most of the waiting to someone else)."""
    lateness_gap: float = 3.0
    """...each of them causing at least this times the waiting any other rank causes: with two
    ranks the late one causes ≥ 75%; ranks that straggle by noise on a loaded host cause shares
    within 1.5–2.5x of each other (the 4-rank gloo fixtures: 37/25/23/14%)."""
    lateness_chance: float = 0.01
    """...and they are among the last arrivers at more instances than chance gives: P(≥ k of n
    instances) under a Binomial(n, set size / ranks) at most this (as `straggler_pattern_chance`)."""
    lateness_min_wait: float = 0.05
    """...and the waiting they cause, per waiting rank, is at least this share of the analysed time:
    below it the job hardly feels them (half of `straggler_min_excess`, since a finding per rank then
    still has to be priced by the what-if)."""
    lateness_episode_wait: float = 1.0
    """...or, instead of the chance test, an *episode*: in some step they make each waiting peer wait
    at least this times the median step (the step doubles; Holmes calls > 2x normal irregular, as
    `straggler_transient_ratio`). A checkpoint every 4th step or a GC pause is last at few
    instances, but by far; a loaded 4-rank gloo host's worst noise is 0.46 (healthy_ddp)."""
    lateness_step_share: float = 0.5
    """A waited-for rank's steps: where it causes, per waiting rank, at least this share of what it
    causes in its worst step (as `step_share`: the episode, not the noise around it; a persistent
    rank's steps are all alike)."""
    lateness_reason_share: float = 0.5
    """Why a waited-for rank is late: the part of its excess window (its windows before its late
    arrivals less its peers' of the same instances) that reaches this share names the reason (named
    host work, then loading, then compute, then idle); else the larger of compute and idle."""
    lateness_more_ops: float = 1.1
    """A late rank whose excess is compute runs *more ops* when it runs at least this times its peers'
    compute kernels/operators in its late steps (extra work); else the same ops take longer (a slower
    or throttled device, or bigger inputs to the same ops: an uneven shard or batch). One program on
    every rank runs the same op count."""
    lateness_small_op_share: float = 0.1
    """...unless its extra operators (on CPU-only ranks, at least `lateness_more_ops` × its peers' count) average
    at most this share of its peers' mean operator: too small to be arithmetic (a per-element loop, ``.item()``
    reads), their time is per-operator dispatch and counts as host time (`detect.op_overhead`). Held-out round
    10's host_item_sync: 0.003; extra matmuls (fixtures/runs/straggler_persistent) are longer than the mean."""
    slow_link_ratio: float = 2.0
    """slow_link: a rank's transfers on every link it has (or one pair's) take at least this times the
    other links' of the same class (medians over instances). A degraded link halves its rate or worse
    (a NIC or port negotiated down a speed grade, a PCIe link at half width, a lossy cable
    retransmitting); healthy links of one job move the same bytes within ~1.5x of each other once the
    median is taken (the ring fixtures' healthy links: 18 and 35 ms for 8 MiB on a loaded host)."""
    slow_link_gap: float = 3.0
    """...and at least this times the next rank's (pair's) score once its own links are set aside: one
    rank (or link) stands out, not a network that is slow or noisy everywhere (as `lateness_gap`)."""
    slow_link_chance: float = 0.01
    """...with more of its transfers slower than the reference than chance allows: P(≥ k of n) under a
    Binomial(n, 1/2) at most this (as `lateness_chance`): 7 of 7, or 10 of 11, pass; 6 of 6 does not."""
    slow_link_min_excess: float = 0.05
    """...and its transfers' excess over the reference, per analysed step, at least this share of the
    median step (as `lateness_min_wait`): sub-millisecond transfers of a pipeline's activations can differ
    several-fold between links on a loaded host without the job feeling it."""
    lateness_persistent_share: float = 0.5
    """A waited-for rank named for its compute is a persistent straggler when its late steps are at
    least this share of the steps (and at least `persistent_min_steps`), else a transient one (half,
    as `straggler_ratio_pattern_share`)."""
    healthy_near: float = 0.5
    """The healthy finding names the cause whose run-level measure came nearest its threshold when
    that measure reached at least this share of it (half-way: worth a look, not noise)."""
    persistent_min_steps: int = 2
    """A persistent straggler needs the pattern on at least this many steps (never 1 of 2)."""
    whatif_measurable_share: float = 0.01
    """A finding whose what-if recovers less than this share of the step (median over its steps) is
    reported as found but costing nothing measurable, and does not trip ``--fail-on``: one percent
    is below the step-to-step noise of every real run here (healthy gloo steps scatter 2–10%)."""
    replay_error_limit: float = 0.05
    """The what-if is withheld when replaying a rank's observed durations misses its observed steps
    by more than this (median over steps): the What-if analysis (Lin et al., OSDI'25) drops traces
    whose replay is off by more than 5%, since an edit's saving is then within the replay's own error."""

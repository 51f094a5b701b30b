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
    straggler_transient_ratio: float = 2.0
    """A single step is a straggler step when the rank computes at least this times its peers'
    median: Holmes calls iterations over 2× normal irregular. Single healthy steps on an
    oversubscribed host reach 1.5–1.8×."""
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
    input_share: float = 0.2
    """input_bound: data loading at least this share of the step on every rank (median over steps)."""
    input_stall: float = 0.5
    """...with the device idle from step start to first compute for at least this share of the
    loading time (the loader starves the device instead of running ahead)."""

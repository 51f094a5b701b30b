"""What the detectors read: small per-rank and cross-rank tables, never the event table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl


@dataclass(frozen=True, kw_only=True, eq=False)
class Facts:
    """The derived facts of one run (all times in ns, aligned clocks)."""

    steps: pl.DataFrame
    """Complete steps, one row per (rank, step): `analysis.STEP_SCHEMA` plus ``late_n`` (collective
    instances of the step where the rank arrived last) and ``coll_n`` (instances)."""
    collectives: pl.DataFrame
    """Matched instances, `analysis.COLLECTIVE_SCHEMA`."""
    p2p: pl.DataFrame
    """Per (rank, step): ``sends``, ``recvs``, ``first_send_ns`` (`derive.p2p.p2p_per_step`)."""
    pipelines: list[list[int]] = field(default_factory=list)
    """Ranks of each pipeline (`derive.p2p.pipeline_groups`)."""
    link_gbps: float | None = None
    """Peak bus bandwidth of the link in GB/s, when the user gave it."""
    host: pl.DataFrame | None = None
    """Per (rank, step) of GPU ranks: how the host feeds the device (`derive.host.HOST_SCHEMA`)."""
    kernel_steps: pl.DataFrame | None = None
    """Per (rank, step, name, category): ``count`` and ``total_ns`` of kernels (GPU ranks) or operators'
    self time (CPU ranks), `derive.kernels.kernel_steps`: which operators a stage runs more of."""
    late: pl.DataFrame | None = None
    """Per rank and matched instance of the steps: arrival, lateness, wait and waiting caused
    (`derive.lateness.LATE_ROW_SCHEMA`)."""
    transfers: pl.DataFrame | None = None
    """Transfer times of the send/recv pairs and of the collectives run by different member sets
    (`derive.transfers.TRANSFER_SCHEMA`): the part after the last participant arrived."""
    world_size: int | None = None
    """Ranks in the job, as the traces state it (more than the traced ranks when only some were profiled)."""

"""The result of `observed_vs_predicted.check`, observed against predicted: its components, links and plan, typed,
with their JSON form. Kept apart from the computation so `Analysis` can hold a `Check` without importing
the model and the trace types the comparison uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tracediag import display
from tracediag.api_types import checked

LABELS = {
    "step_time": "step time",
    "compute": "compute",
    "exposed_tp": "exposed TP communication",
    "exposed_cp": "exposed CP communication",
    "exposed_ep": "exposed EP all-to-all",
    "exposed_dp": "exposed DP communication",
    "exposed_pp": "exposed PP send/recv",
    "exposed_comm": "exposed communication (all kinds)",
    "bubble": "pipeline bubble",
    "idle": "idle (no compute, no communication)",
    "mfu": "MFU",
}
"""What a person reads for each component name."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Component:
    """One row of the comparison: a time per step in seconds, or MFU as a fraction."""

    name: str
    """`step_time`, `compute`, `exposed_<kind>`, `exposed_comm`, `bubble`, `idle` or `mfu`."""
    observed: float | None
    """Median over the trace's (rank, step) rows; None where the trace cannot tell."""
    predicted: float
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """Observed / predicted; None when either is missing or the prediction is zero."""
        if self.observed is None or self.predicted <= 0:
            return None
        return self.observed / self.predicted

    @property
    def label(self) -> str:
        """What a person reads ("exposed DP communication")."""
        return LABELS[self.name]

    @property
    def unit(self) -> str:
        """The value's unit: "s" (seconds per step) or "fraction" (MFU)."""
        return "fraction" if self.name == "mfu" else "s"

    def to_dict(self) -> dict[str, Any]:
        """The component's JSON form (the check's ``components``)."""
        ratio = self.ratio
        return {
            "component": self.name,
            "label": self.label,
            "unit": self.unit,
            "observed": self.observed,
            "predicted": self.predicted,
            "ratio": None if ratio is None else round(ratio, 4),
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Component:
        """The component a `to_dict` form describes."""
        observed = d.get("observed")
        return cls(
            name=d["component"],
            observed=None if observed is None else float(observed),
            predicted=float(d["predicted"]),
            note=d.get("note", ""),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkCheck:
    """Achieved bus bandwidth of one collective kind and op against the model's link figure."""

    kind: str | None
    """tp/cp/ep/dp/pp, or None when the trace cannot tell which kind these collectives are."""
    kind_from: str
    """How the kind was decided (group name, membership, group size, ...) or why it could not be."""
    op: str
    groups: tuple[str, ...]
    """Group names, each with the trace's description when it has one: "3 (dp0)"."""
    collectives: int
    busbw_gbps: float
    """Median achieved bus bandwidth (nccl-tests convention), GB/s."""
    link: str | None
    link_busbw_gbps: float | None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """Achieved over the link's figure (None without a figure)."""
        return self.busbw_gbps / self.link_busbw_gbps if self.link_busbw_gbps else None

    def to_dict(self) -> dict[str, Any]:
        """The link check's JSON form (the check's ``links``)."""
        ratio = self.ratio
        return {
            "kind": self.kind,
            "kind_from": self.kind_from,
            "op": self.op,
            "groups": list(self.groups),
            "collectives": self.collectives,
            "busbw_gbps": round(self.busbw_gbps, 4),
            "link": self.link,
            "link_busbw_gbps": self.link_busbw_gbps,
            "ratio": None if ratio is None else round(ratio, 4),
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LinkCheck:
        """The link check a `to_dict` form describes."""
        figure = d.get("link_busbw_gbps")
        return cls(
            kind=d.get("kind"),
            kind_from=d.get("kind_from", ""),
            op=d["op"],
            groups=tuple(d.get("groups", ())),
            collectives=int(d["collectives"]),
            busbw_gbps=float(d["busbw_gbps"]),
            link=d.get("link"),
            link_busbw_gbps=None if figure is None else float(figure),
            note=d.get("note", ""),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckedPlan:
    """What was predicted for: model, device, GPUs, split degrees, engine and batch shape."""

    model: str
    device: str
    gpus: int
    split: tuple[tuple[str, int], ...]
    """(dimension, degree) in the order tp, pp, dp, cp, ep, vpp, zero."""
    engine: str
    micro_batch: int
    seq_len: int
    global_batch: int

    def to_dict(self) -> dict[str, Any]:
        """The plan's JSON form (the check's ``plan``)."""
        return {
            "model": self.model,
            "device": self.device,
            "gpus": self.gpus,
            "split": dict(self.split),
            "engine": self.engine,
            "micro_batch": self.micro_batch,
            "seq_len": self.seq_len,
            "global_batch": self.global_batch,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckedPlan:
        """The plan a `to_dict` form describes."""
        return cls(
            model=str(d["model"]),
            device=str(d["device"]),
            gpus=int(d["gpus"]),
            split=tuple((str(k), int(v)) for k, v in d.get("split", {}).items()),
            engine=str(d.get("engine", "")),
            micro_batch=int(d["micro_batch"]),
            seq_len=int(d["seq_len"]),
            global_batch=int(d["global_batch"]),
        )


@checked
@dataclass(frozen=True, slots=True, kw_only=True, repr=False)
class Check:
    """Observed against predicted (`Analysis.check`; the JSON `check` section is `to_dict`)."""

    components: tuple[Component, ...]
    links: tuple[LinkCheck, ...]
    sentence: str
    """One sentence on the largest gap."""
    notes: tuple[str, ...] = ()
    """Caveats for the whole comparison (world size differs, CPU-only trace, ...)."""
    plan: CheckedPlan
    """What was predicted for."""

    def __repr__(self) -> str:
        p = self.plan
        return f"<Check: {p.model} on {p.gpus} x {p.device}: {display.cut(self.sentence) or 'no gap stated'}>"

    def _repr_html_(self) -> str | None:
        """The report's observed-against-predicted tables (`tracediag.report.notebook`)."""
        return display.html(self)

    def to_dict(self) -> dict[str, Any]:
        """The check's JSON form (the analysis's ``check``)."""
        return {
            "plan": self.plan.to_dict(),
            "components": [c.to_dict() for c in self.components],
            "links": [li.to_dict() for li in self.links],
            "sentence": self.sentence,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Check:
        """The check a `to_dict` form describes."""
        return cls(
            components=tuple(Component.from_dict(c) for c in d.get("components", [])),
            links=tuple(LinkCheck.from_dict(li) for li in d.get("links", [])),
            sentence=d.get("sentence", ""),
            notes=tuple(d.get("notes", [])),
            plan=CheckedPlan.from_dict(d["plan"]),
        )

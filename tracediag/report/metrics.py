"""The metrics of a watch (`tracediag.watch`) in Prometheus' text exposition format.

`WatchMetrics` keeps counters over the windows and notices of one watch and the gauges of its last
window; `snapshot()` is an immutable tuple of `Family`, replaced whole after each update, so an HTTP
thread can read it while the watch goes on. `exposition` writes it as Prometheus text (version
0.0.4), the format of the node exporter's textfile collector too. Names follow Prometheus'
conventions: the ``tracediag_`` prefix, base units in the name (``_seconds``), ``_ratio`` for a
share in 0..1, ``_total`` for counters. docs/watch.md lists them; `METRICS` is that list.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracediag.watching.result import Window

Labels = tuple[tuple[str, str], ...]

METRICS: dict[str, tuple[str, str]] = {
    "tracediag_windows_analysed_total": ("counter", "Profiler windows analysed (one record each)."),
    "tracediag_windows_incomplete_total": ("counter", "Windows closed by --window-timeout with ranks missing."),
    "tracediag_files_skipped_total": ("counter", "Trace files left out, by reason (truncated, unreadable, late, ...)."),
    "tracediag_changes_total": ("counter", "Changes between windows, by kind (step_time, new_straggler, ...)."),
    "tracediag_regressions_total": ("counter", "Windows whose step time regressed against the job's baseline."),
    "tracediag_window_index": ("gauge", "Index of the last window analysed (1 = the job's first)."),
    "tracediag_window_end_timestamp_seconds": ("gauge", "End of the last window's recorded span (Unix time)."),
    "tracediag_window_ranks": ("gauge", "Ranks whose file of the last window was read."),
    "tracediag_window_missing_ranks": ("gauge", "Ranks with no file for the last window when it was closed."),
    "tracediag_job_step_seconds": (
        "gauge",
        "The job's step time in the last window (median over steps of the slowest rank).",
    ),
    "tracediag_step_seconds": ("gauge", "Median step time per rank in the last window."),
    "tracediag_exposed_comm_ratio": ("gauge", "Communication not hidden behind compute over step time, per rank."),
    "tracediag_idle_ratio": ("gauge", "Idle time over step time, per rank."),
    "tracediag_caused_wait_ratio": ("gauge", "Each rank's share of the waiting it caused the others."),
    "tracediag_waited_for": ("gauge", "1 for each rank everyone waited for in the last window."),
    "tracediag_cause_time_lost_seconds": ("gauge", "Time lost per cause over the last window's steps (what-if)."),
    "tracediag_mfu_ratio": ("gauge", "Observed MFU in the last window against the job's plan (`--plan`)."),
    "tracediag_mfu_predicted_ratio": ("gauge", "The plan's predicted MFU (`--plan`)."),
    "tracediag_step_time_change_ratio": (
        "gauge",
        "The last window's step time change against the baseline (0.25 = 25% slower); 0 when none was found.",
    ),
}


@dataclass(frozen=True, slots=True)
class Family:
    """One metric: its name, type, help and samples (labels, value)."""

    name: str
    kind: str
    help: str
    samples: tuple[tuple[Labels, float], ...]


class WatchMetrics:
    """Counters over one watch and the gauges of its last window (see the module docstring)."""

    def __init__(self) -> None:
        self._counters: dict[tuple[str, Labels], float] = {
            ("tracediag_windows_analysed_total", ()): 0,
            ("tracediag_windows_incomplete_total", ()): 0,
            ("tracediag_regressions_total", ()): 0,
        }
        self._gauges: dict[str, list[tuple[Labels, float]]] = {}
        self._snapshot: tuple[Family, ...] = self._families()

    def snapshot(self) -> tuple[Family, ...]:
        """The metric families as of the last update."""
        return self._snapshot

    def notice(self, reason: str) -> None:
        """A file left out (a `watching.Notice` of `reason`)."""
        key = ("tracediag_files_skipped_total", (("reason", reason),))
        self._counters[key] = self._counters.get(key, 0) + 1
        self._snapshot = self._families()

    def window(self, w: Window) -> None:
        """Count window `w` and take its gauges."""
        c = self._counters
        c[("tracediag_windows_analysed_total", ())] += 1
        c[("tracediag_windows_incomplete_total", ())] += bool(w.missing_ranks)
        c[("tracediag_regressions_total", ())] += w.regressed
        for change in w.changes:
            key = ("tracediag_changes_total", (("kind", change.kind),))
            c[key] = c.get(key, 0) + 1

        def by_rank(m: dict[int, float] | object) -> list[tuple[Labels, float]]:
            return [((("rank", str(r)),), v) for r, v in sorted(m.items())]  # type: ignore[attr-defined]

        lost: dict[str, float] = {}
        for f in w.findings:
            if f.cause.value != "healthy":
                lost[f.cause.value] = lost.get(f.cause.value, 0.0) + f.time_lost_ns / 1e9
        step_change = next((ch.value for ch in w.changes if ch.kind == "step_time"), 0.0)
        g: dict[str, list[tuple[Labels, float]]] = {
            "tracediag_window_index": [((), w.index)],
            "tracediag_window_end_timestamp_seconds": [((), w.end_ns / 1e9)],
            "tracediag_window_ranks": [((), len(w.ranks))],
            "tracediag_window_missing_ranks": [((), len(w.missing_ranks))],
            "tracediag_step_seconds": by_rank(w.step_seconds_by_rank),
            "tracediag_exposed_comm_ratio": by_rank(w.exposed_comm_ratio_by_rank),
            "tracediag_idle_ratio": by_rank(w.idle_ratio_by_rank),
            "tracediag_caused_wait_ratio": by_rank(w.caused_wait_share_by_rank),
            "tracediag_waited_for": [((("rank", str(r)),), 1) for r in w.waited_for],
            "tracediag_cause_time_lost_seconds": [((("cause", k),), v) for k, v in sorted(lost.items())],
            "tracediag_step_time_change_ratio": [((), step_change)],
        }
        if w.step_seconds is not None:
            g["tracediag_job_step_seconds"] = [((), w.step_seconds)]
        if w.mfu is not None:
            g["tracediag_mfu_ratio"] = [((), w.mfu)]
        if w.mfu_predicted is not None:
            g["tracediag_mfu_predicted_ratio"] = [((), w.mfu_predicted)]
        self._gauges = g
        self._snapshot = self._families()

    def _families(self) -> tuple[Family, ...]:
        out = []
        for name, (kind, text) in METRICS.items():
            if kind == "counter":
                samples = [(labels, v) for (n, labels), v in sorted(self._counters.items()) if n == name]
            else:
                samples = self._gauges.get(name, [])
            if samples:
                out.append(Family(name, kind, text, tuple((labels, float(v)) for labels, v in samples)))
        return tuple(out)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if v != int(v) or abs(v) >= 1e15 else str(int(v))


def exposition(families: tuple[Family, ...]) -> str:
    """The Prometheus text exposition (format 0.0.4) of `families`."""
    lines = []
    for f in families:
        lines.append(f"# HELP {f.name} {f.help.replace(chr(92), chr(92) * 2).replace(chr(10), ' ')}")
        lines.append(f"# TYPE {f.name} {f.kind}")
        for labels, value in f.samples:
            inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels)
            lines.append(f"{f.name}{{{inner}}} {_number(value)}" if inner else f"{f.name} {_number(value)}")
    return "\n".join(lines) + "\n"

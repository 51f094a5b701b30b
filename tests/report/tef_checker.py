"""A strict reader of the Trace Event Format (the Chrome/Perfetto JSON trace format), written from its
spec, for the tests of `tracediag.report.perfetto`: it parses a file, refuses what the format does not
allow, and returns the events for queries. (Perfetto's `trace_processor` package downloads its binary
on first use, so it cannot run offline here.)

Checked: the JSON Object Format (``traceEvents`` list, ``displayTimeUnit`` ``ms``/``ns``); per phase
the required fields (X: name, ts, dur; C: name, ts, numeric args; M: a known metadata name and its
argument; s/f: name, id, ts, f's ``bp`` ``e`` when given); pid/tid integers; ts and dur numbers ≥ 0;
X slices of one thread nest (none partly overlaps another) on the threads `nesting_threads` names;
every flow id has one start and one finish, the start not after the finish, each inside a slice of
its thread (the slice it binds to).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

PHASES = {"X", "B", "E", "i", "I", "C", "M", "s", "t", "f", "b", "e", "n"}
METADATA = {
    "process_name": "name",
    "process_sort_index": "sort_index",
    "process_labels": "labels",
    "thread_name": "name",
    "thread_sort_index": "sort_index",
}


class TefError(AssertionError):
    """The file is not valid Trace Event Format."""


@dataclass
class Trace:
    """A parsed, checked trace."""

    events: list[dict[str, Any]]
    other: dict[str, Any]

    def of(self, ph: str, **fields: Any) -> list[dict[str, Any]]:
        """Events of phase `ph` whose fields equal `fields`."""
        return [e for e in self.events if e["ph"] == ph and all(e.get(k) == v for k, v in fields.items())]

    def process_names(self) -> dict[int, str]:
        return {e["pid"]: e["args"]["name"] for e in self.of("M", name="process_name")}

    def thread_names(self) -> dict[tuple[int, int], str]:
        return {(e["pid"], e["tid"]): e["args"]["name"] for e in self.of("M", name="thread_name")}

    def sort_index(self) -> dict[int, int]:
        return {e["pid"]: e["args"]["sort_index"] for e in self.of("M", name="process_sort_index")}


def _num(e: dict[str, Any], key: str) -> float:
    v = e.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        msg = f"{key} must be a number >= 0: {e}"
        raise TefError(msg)
    return float(v)


def _int(e: dict[str, Any], key: str) -> None:
    if isinstance(e.get(key), bool) or not isinstance(e.get(key), int):
        msg = f"{key} must be an integer: {e}"
        raise TefError(msg)


def _check_event(e: Any) -> None:
    if not isinstance(e, dict):
        msg = f"an event is not an object: {e!r}"
        raise TefError(msg)
    ph = e.get("ph")
    if ph not in PHASES:
        msg = f"unknown phase {ph!r}: {e}"
        raise TefError(msg)
    _int(e, "pid")
    if ph != "M" or e["name"].startswith("thread_"):
        _int(e, "tid")
    if "args" in e and not isinstance(e["args"], dict):
        msg = f"args must be an object: {e}"
        raise TefError(msg)
    if ph == "M":
        key = METADATA.get(e.get("name"))
        if key is None or key not in e.get("args", {}):
            msg = f"metadata event without a known name and its argument: {e}"
            raise TefError(msg)
        return
    if not isinstance(e.get("name"), str):
        msg = f"name must be a string: {e}"
        raise TefError(msg)
    _num(e, "ts")
    if ph == "X":
        _num(e, "dur")
    if ph == "C" and not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in e["args"].values()):
        msg = f"counter values must be numbers: {e}"
        raise TefError(msg)
    if ph in "stf":
        if "id" not in e:
            msg = f"flow event without id: {e}"
            raise TefError(msg)
        if ph == "f" and e.get("bp", "e") != "e":
            msg = f"flow finish bp must be 'e': {e}"
            raise TefError(msg)


def _enclosing(slices: list[tuple[int, int]], ts: int) -> bool:
    return any(lo <= ts <= hi for lo, hi in slices)


def load(path: str | Path, nesting_threads: set[int] | None = None) -> Trace:
    """Parse and check `path`; `nesting_threads`: tids whose X slices must nest (None: every thread)."""
    doc = orjson.loads(Path(path).read_bytes())
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        msg = "not the JSON Object Format: no traceEvents list"
        raise TefError(msg)
    if doc.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        msg = f"displayTimeUnit {doc['displayTimeUnit']!r}"
        raise TefError(msg)
    events = doc["traceEvents"]
    for e in events:
        _check_event(e)
    # in whole ns (the µs values are decimals with three places): no float sum decides a nesting
    slices: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            lo = round(e["ts"] * 1000)
            slices[e["pid"], e["tid"]].append((lo, lo + round(e["dur"] * 1000)))
    for (pid, tid), spans in slices.items():
        if nesting_threads is not None and tid not in nesting_threads:
            continue
        stack: list[int] = []
        for lo, hi in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= lo:
                stack.pop()
            if stack and hi > stack[-1]:
                msg = f"slices on pid {pid} tid {tid} overlap without nesting at ts {lo}"
                raise TefError(msg)
            stack.append(hi)
    flows: dict[Any, dict[str, dict[str, Any]]] = defaultdict(dict)
    for e in events:
        if e["ph"] in "sf":
            if e["ph"] in flows[e["id"]]:
                msg = f"flow id {e['id']} has two {e['ph']} events"
                raise TefError(msg)
            flows[e["id"]][e["ph"]] = e
    for fid, pair in flows.items():
        if set(pair) != {"s", "f"}:
            msg = f"flow id {fid} is not one start and one finish"
            raise TefError(msg)
        if pair["s"]["ts"] > pair["f"]["ts"]:
            msg = f"flow id {fid} finishes before it starts"
            raise TefError(msg)
        for end in pair.values():
            if not _enclosing(slices[end["pid"], end["tid"]], round(end["ts"] * 1000)):
                msg = f"flow id {fid}: no slice of its thread encloses {end}"
                raise TefError(msg)
    return Trace(events=events, other=doc.get("otherData", {}))


def phases(trace: Trace) -> Counter:
    """How many events per phase."""
    return Counter(e["ph"] for e in trace.events)

"""What `tracediag hang` finds in Flight Recorder dumps: typed, frozen, and the JSON of docs/hang.md."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from tracediag.api_types import checked

SCHEMA = "tracediag.hang/2"
"""The ``schema`` of the JSON document (docs/hang.md); bumped when a field changes meaning."""

Kind = Literal["missing_rank", "op", "sizes", "dtypes", "membership", "p2p_unmatched"]
GroupStatus = Literal["consistent", "desync", "hang", "stuck", "undecided"]
Verdict = Literal["consistent", "desync", "hang", "undecided"]
RankStatus = Literal["waiting", "late", "done", "no_dump"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    """One Python frame of a Flight Recorder entry (innermost first, as torch records them)."""

    name: str
    filename: str
    line: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Disagreement:
    """The first point where a group's ranks do not agree."""

    kind: Kind
    """``missing_rank``: some members never enqueued it; ``op``/``sizes``/``dtypes``: they enqueued
    different ones; ``membership``: their dumps list different members; ``p2p_unmatched``: a send or recv
    with no counterpart on its peer."""
    seq_id: int | None
    """The collective (or, for p2p, the sender's point-to-point) sequence id; None for membership."""
    op: str | None
    """What most ranks enqueued there (for p2p: ``send`` or ``recv``)."""
    culprit_ranks: tuple[int, ...]
    """The ranks that differ from the majority (empty on a tie: then nobody can be singled out)."""
    agreeing_ranks: tuple[int, ...]
    expected: str | None
    """The majority's value, as text (``all_reduce``, ``[[4]]``, ``['Float']``); None on a tie."""
    found: dict[int, str] = field(default_factory=dict)
    """Each differing (or, on a tie, each) rank's value, as text."""
    peer: int | None = None
    """For ``p2p_unmatched``: the rank that has no matching op."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankState:
    """Where one member of a group is, from its dump."""

    rank: int
    status: RankStatus
    """``waiting``: an entry of this group is not complete; ``late``: it never enqueued the collective
    the others wait in; ``done``: everything it enqueued completed; ``no_dump``: no dump of it was read."""
    last_enqueued: int | None = None
    last_enqueued_op: str | None = None
    last_completed: int | None = None
    last_completed_op: str | None = None
    waiting_in: int | None = None
    """The collective sequence id of its oldest incomplete entry."""
    waiting_op: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupReport:
    """One process group across ranks."""

    pg_name: str
    pg_desc: str | None
    ranks: tuple[int, ...]
    """Its member (global) ranks."""
    membership: Literal["pg_config", "world", "entries"]
    """Where `ranks` comes from: the dumps' ``pg_config``; the world (the default group, whose
    ``pg_config`` gloo leaves empty); or the ranks whose entries name the group (a member that enqueued
    nothing in it is then not seen)."""
    status: GroupStatus
    """``desync``: ranks enqueued different things; ``hang``: ranks wait for a rank that never arrived;
    ``stuck``: ranks wait and every member arrived; ``undecided``: ranks wait and only members without a
    dump can be the late ones; ``consistent``: none of these."""
    disagreement: Disagreement | None
    waited_seq: int | None
    """The collective most waiting ranks are in."""
    waited_op: str | None
    waiting_ranks: tuple[int, ...]
    late_ranks: tuple[int, ...]
    """Members with a dump that never enqueued `waited_seq`."""
    no_dump_ranks: tuple[int, ...]
    states: tuple[RankState, ...]
    undecided: str | None = None
    """What the missing dumps leave open."""
    hint: str | None = None
    """A pattern worth reading (a rank with one collective fewer than the others)."""
    first_ns: int | None = None
    """When the problem's earliest entry was created (orders the groups: the earliest is the cause)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LateFrames:
    """The last stack a late rank recorded, and the stack of the collective the others wait in."""

    rank: int
    pg_name: str
    seq_id: int | None
    op: str | None
    role: Literal["late_last_entry", "waited_collective"]
    frames: tuple[Frame, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RankJoin:
    """How one rank's profiler trace was joined to its dump (`desync.join`)."""

    rank: int
    trace: str
    method: Literal["seq", "time", "none"]
    """``seq``: by process group and sequence id; ``time``: by the entry's creation time inside a trace
    call of its op; ``none``: not joined (`why`)."""
    matched: int
    """Dump collectives matched to a trace call."""
    dump_entries: int
    """The rank's collective entries in its dump."""
    trace_calls: int
    """The trace's collective calls."""
    offset_ns: int | None = None
    """Median of trace time minus the entry's creation time over the matched pairs."""
    why: str | None = None
    """Why not joined, or what to know about the join (a clock far off the dump's)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostOp:
    """A top-level host operator or annotation on the thread that calls the collectives."""

    name: str
    kind: str
    ts: int
    """Start, on the trace's clock (ns)."""
    dur_ns: int
    inside_ns: int
    """The part of it inside the window after the last completed collective."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostActivity:
    """What a late rank's host did after its last completed collective, from its profiler trace."""

    rank: int
    trace: str
    pg_name: str
    after_seq: int
    """The last completed collective (the dump's), joined in the trace: the window starts at its end."""
    window_start: int
    """On the trace's clock (ns)."""
    window_ns: int
    until: Literal["next_collective", "trace_end"]
    """Where the window ends: the rank's next collective call in the trace, or the end of its trace."""
    method: Literal["seq", "time"]
    """How its trace was joined to its dump (`RankJoin.method`)."""
    busy_ns: int
    """Top-level host time inside the window (the rest: idle, or work the profiler did not record)."""
    ops: tuple[HostOp, ...] = ()
    """Longest (inside the window) first, at most 5."""


@checked
@dataclass(frozen=True, slots=True, kw_only=True)
class HangReport:
    """The answer of `tracediag.hang`: one sentence, the culprit, and every group's table."""

    verdict: Verdict
    sentence: str
    culprit_ranks: tuple[int, ...]
    culprit_group: str | None
    culprit_seq: int | None
    culprit_op: str | None
    world: tuple[int, ...]
    dumped_ranks: tuple[int, ...]
    missing_dumps: tuple[int, ...]
    """Ranks of the job (listed in a group, below the highest rank, or under ``world_size``) with no dump."""
    groups: tuple[GroupReport, ...]
    frames: tuple[LateFrames, ...] = ()
    joins: tuple[RankJoin, ...] = ()
    """One per profiler trace given (`tracediag.hang(..., traces=...)`), by rank."""
    activity: tuple[HostActivity, ...] = ()
    """Per culprit rank whose trace joined: its host after its last completed collective."""
    notes: tuple[str, ...] = ()
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        """Whether a hang or desync was found (the CLI exits 3)."""
        return self.verdict != "consistent"

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of docs/hang.md (``schema`` first)."""
        out = {"schema": SCHEMA, **asdict(self)}
        for g in out["groups"]:
            if g["disagreement"]:
                g["disagreement"]["found"] = {str(k): v for k, v in g["disagreement"]["found"].items()}
        return out

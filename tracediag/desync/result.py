"""What `tracediag hang` finds in Flight Recorder dumps: typed, frozen, and the JSON of docs/hang.md."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

SCHEMA = "tracediag.hang/1"
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

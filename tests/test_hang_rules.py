"""One rule of the hang analysis per test, on dumps in NCCL's layout (states ``started``/``completed``,
``nccl:send 0->1`` names, a filled ``pg_config``) built from a real gloo entry of fixtures/hang: gloo
records no point-to-point ops and leaves ``pg_config`` empty, so these rules have no real gloo fixture."""

from __future__ import annotations

import copy
import pickle

from conftest import FIXTURES

import tracediag
from tracediag.ingest.safepickle import load_plain

REAL = FIXTURES / "hang" / "healthy" / "nccl_trace_rank_0"


def _template() -> tuple[dict, dict]:
    doc = load_plain(REAL.read_bytes(), str(REAL))
    return doc, doc["entries"][0]


def _entry(base: dict, rid: int, seq: int, name: str, state: str, **kw) -> dict:
    e = copy.deepcopy(base)
    e.update(
        record_id=rid,
        collective_seq_id=seq,
        profiling_name=name,
        state=state,
        retired=state == "completed",
        process_group=("0", "default_pg"),
        pg_id=0,
    )
    e.update(kw)
    return e


def _write(tmp_path, per_rank: dict[int, list[dict]], members: dict[int, list[int]] | None = None) -> None:
    doc, _ = _template()
    n = len(per_rank)
    for rank, entries in per_rank.items():
        d = copy.deepcopy(doc)
        ranks = (members or {}).get(rank, list(range(n)))
        d["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": str(ranks)}}
        d["entries"] = entries
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(d, protocol=2))


def test_send_with_no_recv(tmp_path):
    _, base = _template()
    ar = _entry(base, 0, 1, "nccl:all_reduce", "completed")
    send = _entry(base, 1, 1, "nccl:send 0->1", "started", is_p2p=True, p2p_seq_id=1)
    late = _entry(base, 1, 2, "nccl:all_reduce", "started")
    _write(tmp_path, {0: [ar, send], 1: [ar, late]})
    r = tracediag.hang(tmp_path)
    d = r.groups[0].disagreement
    assert (d.kind, d.op, d.seq_id, d.peer, d.culprit_ranks) == ("p2p_unmatched", "send", 1, 1, (1,))
    assert r.sentence == "Rank 0's send #1 in group 0 (default_pg) has no matching recv on rank 1."


def test_matched_send_and_recv_are_consistent(tmp_path):
    _, base = _template()
    send = _entry(base, 0, 0, "nccl:send 0->1", "completed", is_p2p=True, p2p_seq_id=1)
    recv = _entry(base, 0, 0, "nccl:recv 1<-0", "completed", is_p2p=True, p2p_seq_id=1)
    _write(tmp_path, {0: [send], 1: [recv]})
    assert tracediag.hang(tmp_path).verdict == "consistent"


def test_group_membership_disagreement(tmp_path):
    _, base = _template()
    ar = _entry(base, 0, 1, "nccl:all_reduce", "completed")
    _write(tmp_path, {0: [ar], 1: [ar], 2: [ar]}, members={2: [0, 2]})
    d = tracediag.hang(tmp_path).groups[0].disagreement
    assert (d.kind, d.culprit_ranks, d.expected, d.found) == ("membership", (2,), "[0, 1, 2]", {2: "[0, 2]"})


def test_a_tie_names_no_culprit(tmp_path):
    _, base = _template()
    _write(
        tmp_path,
        {0: [_entry(base, 0, 1, "nccl:all_reduce", "started")], 1: [_entry(base, 0, 1, "nccl:broadcast", "started")]},
    )
    r = tracediag.hang(tmp_path)
    assert (r.verdict, r.culprit_ranks) == ("desync", ())
    assert r.groups[0].disagreement.found == {0: "all_reduce", 1: "broadcast"}


def test_every_rank_in_the_collective_is_stuck_not_late(tmp_path):
    _, base = _template()
    done = _entry(base, 0, 1, "nccl:all_reduce", "completed")
    _write(tmp_path, {r: [done, _entry(base, 1, 2, "nccl:all_reduce", "started")] for r in range(3)})
    r = tracediag.hang(tmp_path)
    assert (r.verdict, r.groups[0].status, r.culprit_ranks, r.groups[0].late_ranks) == ("hang", "stuck", (), ())
    assert "no rank is late" in r.sentence


def test_completed_state_counts_without_retired(tmp_path):
    """NCCL marks completion in `state`; an unretired completed entry is not waiting."""
    _, base = _template()
    e = _entry(base, 0, 1, "nccl:all_reduce", "completed", retired=False)
    _write(tmp_path, {0: [e], 1: [e]})
    assert tracediag.hang(tmp_path).verdict == "consistent"


def test_a_gap_in_the_dumped_ranks_is_a_missing_dump(tmp_path):
    _, base = _template()
    e = _entry(base, 0, 1, "nccl:all_reduce", "started")
    _write(tmp_path, {0: [e], 1: [e], 2: [e]}, members={r: [0, 1, 2] for r in range(3)})
    (tmp_path / "nccl_trace_rank_1").rename(tmp_path / "nccl_trace_rank_5")
    r = tracediag.hang(tmp_path)
    assert r.missing_dumps == (1, 3, 4)

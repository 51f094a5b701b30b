"""`tracediag.hang` names the right culprit on every real gloo fixture of fixtures/hang (issue 25)."""

from __future__ import annotations

import orjson
import pytest
from conftest import FIXTURES

import tracediag
from tracediag.desync.result import SCHEMA

HANG = FIXTURES / "hang"

EXPECTED = {
    # scenario: (verdict, culprit ranks, group, seq, op, kind of the first disagreement, waiting ranks)
    "skip_allreduce": ("desync", (1,), "0", 6, "all_reduce", "op", (0, 1, 2, 3)),
    "allgather_vs_allreduce": ("desync", (2,), "0", 4, "all_reduce", "op", (0, 1, 2, 3)),
    "mismatched_sizes": ("desync", (3,), "0", 4, "all_reduce", "sizes", (0, 1, 2, 3)),
    "mismatched_dtypes": ("desync", (3,), "0", 4, "all_reduce", "dtypes", ()),
    "host_stuck": ("hang", (2,), "0", 25, "all_reduce", "missing_rank", (0, 1, 3)),
    "host_stuck_json": ("hang", (2,), "0", 25, "all_reduce", "missing_rank", (0, 1, 3)),
    "host_stuck_traced": ("hang", (2,), "0", 9, "all_reduce", "missing_rank", (0, 1, 3)),
    "killed": ("undecided", (3,), "0", 4, "all_reduce", None, (0, 1, 2)),
    "p2p_unmatched": ("hang", (0,), "0", 2, "all_reduce", "missing_rank", (1, 2, 3)),
    "two_groups": ("hang", (1,), "1", 3, "all_reduce", "missing_rank", (0,)),
    "healthy": ("consistent", (), None, None, None, None, ()),
}


def test_every_fixture_has_an_expectation():
    assert sorted(EXPECTED) == sorted(p.parent.name for p in HANG.glob("*/manifest.json"))


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_culprit(scenario):
    verdict, culprits, group, seq, op, kind, waiting = EXPECTED[scenario]
    r = tracediag.hang(HANG / scenario)
    assert (r.verdict, r.culprit_ranks, r.culprit_group, r.culprit_seq, r.culprit_op) == (
        verdict,
        culprits,
        group,
        seq,
        op,
    )
    cause = next((g for g in r.groups if g.pg_name == group), None)
    if cause is not None:
        assert (cause.disagreement.kind if cause.disagreement else None) == kind
        assert cause.waiting_ranks == waiting
    assert r.found is (verdict != "consistent")


def test_host_stuck_sentence_and_last_completed():
    r = tracediag.hang(HANG / "host_stuck")
    assert r.sentence.startswith(
        "Rank 2 never entered all_reduce #25 of group 0 (default_pg); ranks 0, 1, 3 have been waiting in it; "
        "rank 2's last completed collective there is #24 (all_reduce)"
    )
    states = {s.rank: s for s in r.groups[0].states}
    assert [states[k].status for k in range(4)] == ["waiting", "waiting", "late", "waiting"]
    assert states[2].last_completed == 24
    assert states[0].last_completed == 24
    late = next(f for f in r.frames if f.role == "late_last_entry")
    assert (late.rank, late.seq_id) == (2, 24)
    assert late.frames[2].name == "_scenario"


def test_skip_is_hinted_by_the_op_counts():
    r = tracediag.hang(HANG / "skip_allreduce")
    assert r.groups[0].hint == "rank 1 enqueued 5 all_reduce where the others enqueued 6 (from #1 on)"
    assert "Rank 1 called barrier as collective #6 of group 0 (default_pg) where ranks 0, 2, 3 called all_reduce" in (
        r.sentence
    )


def test_sizes_and_dtypes_name_the_values():
    sizes = tracediag.hang(HANG / "mismatched_sizes").groups[0].disagreement
    assert (sizes.expected, sizes.found) == ("[[4]]", {3: "[[8]]"})
    dtypes = tracediag.hang(HANG / "mismatched_dtypes").groups[0].disagreement
    assert (dtypes.expected, dtypes.found) == ("['Float']", {3: "['Int']"})


def test_killed_rank_is_named_and_the_rest_still_analysed():
    r = tracediag.hang(HANG / "killed")
    assert r.missing_dumps == (3,)
    assert r.world == (0, 1, 2, 3)
    g = r.groups[0]
    assert g.no_dump_ranks == (3,)
    assert g.late_ranks == ()
    assert g.undecided.startswith("without a dump of rank 3 it is undecided whether it entered all_reduce #4")
    assert "rank 3 wrote no dump" in r.sentence


def test_world_size_names_ranks_no_dump_mentions():
    r = tracediag.hang(HANG / "killed", world_size=6)
    assert r.missing_dumps == (3, 4, 5)


def test_two_groups_only_one_hangs():
    r = tracediag.hang(HANG / "two_groups")
    assert {g.pg_name: g.status for g in r.groups} == {"0": "consistent", "1": "hang", "2": "consistent"}
    assert {g.pg_name: g.ranks for g in r.groups} == {"0": (0, 1, 2, 3), "1": (0, 1), "2": (2, 3)}


def test_json_document():
    doc = orjson.loads(orjson.dumps(tracediag.hang(HANG / "mismatched_sizes").to_dict()))
    assert doc["schema"] == SCHEMA
    assert doc["verdict"] == "desync"
    assert doc["culprit_ranks"] == [3]
    assert doc["groups"][0]["disagreement"]["found"] == {"3": "[[8]]"}
    assert set(doc) >= {"sentence", "world", "dumped_ranks", "missing_dumps", "groups", "frames", "notes", "skipped"}

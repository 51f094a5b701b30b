"""The seeded fuzzer over every reader and file-taking option (`cases`): TRACEDIAG_FUZZ_N cases (default
150, about 30 s on 2 cores) from seed TRACEDIAG_FUZZ_SEED (default 0), each mutating one real input of
`ingest`, `analyze`, `calibrate`, `hang`, `analyze --plan` or `predict --profile` and running the CLI in
process. Every case must keep the invariant of `cases.problems`, and leave its inputs as they were.
A failing seed replays alone: TRACEDIAG_FUZZ_SEED=<seed> TRACEDIAG_FUZZ_N=1. The longer campaign is
benchmarks/fuzz_campaign.py."""

from __future__ import annotations

import os
import random

import pytest
from conftest import time_limit

from fuzz import cases, mutate

N = int(os.environ.get("TRACEDIAG_FUZZ_N", "150"))
SEED = int(os.environ.get("TRACEDIAG_FUZZ_SEED", "0"))
BLOCK = 25
CASE_SECONDS = 60


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    return cases.side_files(tmp_path_factory.mktemp("sides"))


@pytest.mark.parametrize("start", range(SEED, SEED + N, BLOCK))
def test_fuzzed_inputs_keep_the_invariant(tmp_path, sides, start):
    failed = []
    for seed in range(start, min(start + BLOCK, SEED + N)):
        case = cases.build(seed, tmp_path / str(seed), sides)
        before = cases.digests(cases.inputs(case))
        with time_limit(CASE_SECONDS):
            outcome = cases.run(case)
        found = cases.problems(outcome)
        if cases.digests(cases.inputs(case)) != before:
            found.append("an input changed")
        if found:
            tail = outcome.output.strip().splitlines()[-3:]
            failed.append(f"seed {seed} ({case.kind}: {case.what}; {' '.join(case.args[:2])}): {found} {tail}")
    assert not failed, "\n".join(failed)


def test_a_hostile_value_is_a_copy_so_a_seed_replays_alone():
    """The campaign's seed 1203527 failed in the run but not replayed alone: a mutation wrote into a `[]`
    or `{}` of `HOSTILE_VALUES` put in an earlier case's document, so later cases got the grown value."""
    rng = random.Random(0)
    before = repr(mutate.HOSTILE_VALUES)
    for _ in range(500):
        value = mutate.hostile_value(rng)
        if isinstance(value, list):
            value.append([])
        elif isinstance(value, dict):
            value["grown"] = 1
    assert repr(mutate.HOSTILE_VALUES) == before

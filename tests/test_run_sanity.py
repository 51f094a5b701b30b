"""Files of different runs are refused before any cross-rank analysis, unless --allow-mixed (issue 11)."""

from __future__ import annotations

import orjson
import pytest
from conftest import FIXTURES, KINETO, SAMPLES, needs_shared

import tracediag
from tracediag.cli import cli
from tracediag.same_run import MixedRunError, mixed_run_problems

RUNS = FIXTURES / "runs"


@needs_shared(SAMPLES / "hta")
def test_a100_rank_of_8_and_v100_rank_of_2_are_refused_in_one_line(runner):
    result = runner.invoke(cli, ["analyze", str(SAMPLES / "hta" / "trace_diff")])
    assert result.exit_code == 2
    (line,) = [x for x in result.output.splitlines() if x.strip()]
    assert line.startswith("Error: ")
    assert "control/control.json.gz" in line
    assert "test/test.json.gz" in line
    assert "world sizes differ" in line
    assert "device types differ" in line
    assert "--allow-mixed" in line


@needs_shared(SAMPLES / "hta")
def test_allow_mixed_analyses_each_file_alone(runner):
    result = runner.invoke(cli, ["analyze", str(SAMPLES / "hta" / "trace_diff"), "--allow-mixed", "--format", "json"])
    assert result.exit_code == 0, result.output
    docs = orjson.loads(result.output)["per_file"]
    assert sorted(d["file"].rsplit("/", 2)[-2] for d in docs) == ["control", "test"]
    assert [d["run"]["world_size"] for d in docs] == [2, 8]  # rank 1 of 2 (V100) sorts before rank 3 of 8
    assert all(d["collectives"] == [] for d in docs)  # nothing matched across unrelated files


def test_consecutive_runs_of_the_same_job_are_refused_by_time():
    """Two real 4-rank runs made one after the other: same world size, backend and collectives."""
    run = tracediag.load(
        [RUNS / "comm_bound" / "rank0.pt.trace.json.gz", RUNS / "healthy_ddp" / "rank1.pt.trace.json.gz"]
    )
    (problem,) = mixed_run_problems(run)
    assert "time spans do not overlap" in problem
    with pytest.raises(MixedRunError, match=r"comm_bound/rank0\.pt\.trace\.json\.gz"):
        tracediag.analyze(run)


def test_different_world_sizes_are_refused():
    run = tracediag.load(
        [KINETO / "gen_torch2.13cpu_gloo_2rank_rank0.pt.trace.json.gz", RUNS / "comm_bound" / "rank1.pt.trace.json.gz"]
    )
    assert any(p.startswith("world sizes differ") and ": 2" in p and ": 4" in p for p in mixed_run_problems(run))


@pytest.mark.parametrize("name", sorted(p.parent.name for p in RUNS.glob("*/manifest.json")), ids=str)
def test_ranks_of_one_run_pass(name):
    assert mixed_run_problems(tracediag.load(sorted(RUNS.glob(f"{name}/*.pt.trace.json.gz")), jobs=1)) == []


@needs_shared(SAMPLES / "hta")
def test_sampled_ranks_of_one_job_pass():
    """trace_filter: ranks 0 and 1 of 128, sampled from one job."""
    assert mixed_run_problems(tracediag.load(SAMPLES / "hta" / "trace_filter", jobs=1)) == []


@needs_shared(SAMPLES / "hta")
def test_sampled_ranks_match_only_what_can_be_matched():
    """trace_filter, ranks 0 and 1 of 128: of its 10 collectives (NCCL `SendRecv` kernels, their operation
    read from the host collective that launched them), 5 overlap on the two ranks once the clocks are
    aligned and are matched; the other 5 end on one rank before the other arrives and are not (no wait,
    no blame)."""
    a = tracediag.analyze(tracediag.load(SAMPLES / "hta" / "trace_filter", jobs=1))
    assert a.collectives.height == 5
    assert (a.collectives["n_ranks"] == 2).all()
    assert any(w.startswith("5 collective instances could not be matched") for w in a.warnings)
    # the waits are those of the matched 5 only: each rank's wait at an instance is at most its skew
    skews = int(a.collectives["skew_ns"].sum())
    assert 0 < a.steps["wait_ns"].sum() <= skews
    assert "compute_straggler" not in [f.cause for f in a.findings]


def test_matched_gloo_collectives_are_kept():
    """Real gloo all-reduces of one run: every rank leaves after the last arrives, nothing is dropped."""
    a = tracediag.analyze(tracediag.load(sorted((RUNS / "straggler_persistent").glob("rank*.pt.trace.json.gz"))))
    assert a.collectives.height > 0
    assert not any("could not be matched" in w for w in a.warnings)


@pytest.mark.parametrize(("ranks", "blamed"), [((0, 1), None), ((0, 1, 3), None), ((1, 2), 2)], ids=str)
def test_a_subset_of_ranks_never_blames_a_present_rank_for_an_absent_straggler(ranks, blamed):
    """Ranks of the real persistent-straggler run (rank 2 slow, world size 4) analysed without all
    ranks: without rank 2 nobody present is blamed, and comm_bound says an untraced rank may be the
    cause (half confidence); with rank 2 present it is named."""
    run = tracediag.load([RUNS / "straggler_persistent" / f"rank{r}.pt.trace.json.gz" for r in ranks], jobs=1)
    findings = tracediag.analyze(run).findings
    stragglers = [f.ranks for f in findings if f.cause == "compute_straggler"]
    if blamed is None:
        assert stragglers == []
        (comm,) = [f for f in findings if f.cause == "comm_bound"]
        assert f"only {len(ranks)} of 4 ranks traced" in comm.summary
        assert comm.confidence <= 0.5
    else:
        assert stragglers == [(blamed,)]


def test_device_types_keep_the_model_names_whole():
    """HTA's triton example ran on an `NVIDIA A100-PG509-200`: its type kept the name cut to
    `NVIDIA A100-PG509-` (the trailing digits were taken for an index)."""
    from tracediag.same_run import _device_type

    (info,) = tracediag.load(
        KINETO / "hta_triton_example.json.gz", jobs=1, rank_map={"hta_triton_example.json.gz": 0}
    ).meta.files
    gpus = [d for d in info.devices if "A100" in d]
    assert gpus
    assert {_device_type(d) for d in gpus} == {"NVIDIA A100-PG509-200"}
    assert [_device_type(d) for d in ("cpu:2048", "cpu:0", "gpu0", "Tesla T4", "cuda:1")] == [
        "cpu",
        "cpu",
        "gpu",
        "Tesla T4",
        "cuda",
    ]

"""`tracediag analyze` wiring: formats, output file, --fail-on, bad input, Parquet input (issue 3)."""

from __future__ import annotations

import orjson
import pytest
from conftest import FIXTURES

from tracediag.cli import cli
from tracediag.cli.common import EXIT_FINDING

RUN = FIXTURES / "runs" / "straggler_persistent"
TRACES = [str(p) for p in sorted(RUN.glob("rank*.pt.trace.json.gz"))]


def test_text_names_cause_rank_and_steps_first(runner):
    """The text says what the JSON says: the run, the finding first, and a per-step table whose rows are
    the means over ranks of the JSON's steps (a rendering bug or a different analysis would differ)."""
    result = runner.invoke(cli, ["analyze", *TRACES, "-j", "1"])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(runner.invoke(cli, ["analyze", *TRACES, "-j", "1", "--format", "json"]).stdout)
    (finding,) = doc["findings"]
    lines = result.stdout.splitlines()
    assert lines[0] == "tracediag analyze: 4 ranks (world size 4), 8 steps (2..9), 0 partial rank-steps left out"
    assert lines[2] == (
        f"1. compute_straggler  rank 2  steps 2..9  lost {finding['time_lost_ns'] / 1e6:,.1f} ms over 8 steps  "
        f"confidence {finding['confidence']:.2f}"
    )
    assert lines[3].strip() == finding["summary"]
    assert lines[4].strip() == f"what-if: {finding['whatif']}"
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["step", "dur"])
    rows = [line.split() for line in lines[header + 1 :] if line.strip()]
    assert [int(r[0]) for r in rows] == doc["run"]["steps"] == list(range(2, 10))
    for row in rows:
        mine = [s for s in doc["steps"] if s["step"] == int(row[0])]
        assert len(mine) == 4
        assert float(row[1]) == round(sum(s["dur_ns"] for s in mine) / 4 / 1e6, 1)
        assert float(row[2]) == round(sum(s["compute_ns"] for s in mine) / 4 / 1e6, 1)
        assert row[-3:-1] == ["rank", "2"]  # the rank computing longest: the straggler, every step


def test_json_to_file_and_fail_on_exits_3(runner, tmp_path):
    out = tmp_path / "a.json"
    args = ["analyze", str(RUN / "rank*.pt.trace.json.gz"), "-j", "1", "--format", "json", "-o", str(out)]
    result = runner.invoke(cli, [*args, "--fail-on", "comm_bound,compute_straggler"])
    assert result.exit_code == EXIT_FINDING
    assert result.stdout == ""  # the report went to the file
    assert out.read_bytes().endswith(b"}\n")
    doc = orjson.loads(out.read_bytes())
    assert doc["schema_version"] == "1.9"
    assert doc["run"]["steps"] == list(range(2, 10))
    assert [(f["cause"], f["ranks"], f["steps"]) for f in doc["findings"]] == [
        ("compute_straggler", [2], doc["run"]["steps"])
    ]
    assert doc["run"]["ranks"] == [0, 1, 2, 3]
    assert len(doc["steps"]) == 4 * 8
    assert runner.invoke(cli, [*args, "--fail-on", "input_bound"]).exit_code == 0


def test_parquet_from_ingest_gives_the_same_findings(runner, tmp_path):
    pq = tmp_path / "run.parquet"
    assert runner.invoke(cli, ["ingest", *TRACES, "-j", "1", "-o", str(pq)]).exit_code == 0
    direct = orjson.loads(runner.invoke(cli, ["analyze", *TRACES, "-j", "1", "--format", "json"]).stdout)
    cached = orjson.loads(runner.invoke(cli, ["analyze", str(pq), "--format", "json"]).stdout)
    assert cached == direct  # every section: steps, collectives, findings, what-if, lateness, kernels
    assert [f["cause"] for f in direct["findings"]] == ["compute_straggler"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--fail-on", "slow"], "unknown cause 'slow'"),
        (["--link-gbps", "warp-drive"], "unknown link"),
        (["--step-regex", "^nothing (\\d+)$"], "no host row matches --step-regex"),
        (["--step-regex", "(unclosed"], "not a valid regular expression"),
    ],
    ids=["fail-on", "link", "no-steps", "bad-regex"],
)
def test_bad_options_exit_2_with_one_line(runner, extra, message):
    result = runner.invoke(cli, ["analyze", *TRACES, "-j", "1", *extra])
    assert result.exit_code == 2
    assert result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]  # click's usage lines come first for a bad option value
    assert last.startswith("Error: ")
    assert message in last
    assert "Traceback" not in result.output


def test_an_internal_error_is_one_line_with_exit_1(monkeypatch, capsys) -> None:
    """A bug (not bad input) still gives one line, not a traceback; TRACEDIAG_DEBUG re-raises it."""
    import tracediag.execute.driver as driver
    from tracediag.cli import main

    def broken(*_a, **_k):
        msg = "division by zero"
        raise ZeroDivisionError(msg)

    monkeypatch.setattr(driver, "analyze_sources", broken)  # `analyze` imports it when it runs
    monkeypatch.setattr("sys.argv", ["tracediag", "analyze", *TRACES, "-j", "1"])
    monkeypatch.delenv("TRACEDIAG_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("Error: internal error (ZeroDivisionError: division by zero)")
    monkeypatch.setenv("TRACEDIAG_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        main()


def test_traces_without_step_markers_are_one_line_exit_2(runner):
    """A run with no step marker for the given --step-regex is refused in one line, exit 2."""
    from conftest import KINETO

    result = runner.invoke(cli, ["analyze", str(KINETO / "hta_triton_example.json.gz"), "--step-regex", "^nomatch$"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "--step-regex" in lines[0]
    assert "no host row matches" in lines[0]


@pytest.mark.parametrize("command", [["analyze", "fixtures/runs/healthy_ddp"], ["ingest", "fixtures/runs/healthy_ddp"]])
def test_an_empty_output_path_is_refused_not_ignored(runner, command):
    """`-o ""` names no file: refused in one line naming the option (it used to exit 0, writing nothing)."""
    result = runner.invoke(cli, [*command, "-o", ""])
    assert result.exit_code == 2
    assert "Invalid value for '-o' / '--output': an empty path names no file" in result.output

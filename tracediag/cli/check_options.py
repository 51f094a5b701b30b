"""What `tracediag analyze` gets for the observed-vs-predicted check and the HTML report.

`check_options` adds `--html FILE`, `--plan plan.json` and `predict`'s model options (`--model`,
`--gpu`, `--tp`, ...; the same definitions, none required) to a command; the command passes the
extra keyword arguments to `add_check` (before rendering) and `finish_report` (after).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tracediag.cli.common import FilePath, InputError, read_user_file
from tracediag.cli.model_options import (
    checked_numbers,
    device_options,
    model_options,
    prediction_from_options,
    split_options,
)
from tracediag.errors import TracediagError

if TYPE_CHECKING:
    from collections.abc import Callable

    from tracediag.analysis import Analysis
    from tracediag.model.predict import Prediction
    from tracediag.run import Run

_NOT_SHARED = {"fmt"}
"""`predict` options that mean something else (or nothing) for `analyze`."""
_NEEDED = ("gpu", "seq_len", "global_batch")


def _optional(param: click.Parameter) -> click.Parameter:
    p = copy.copy(param)
    p.required = False
    return p


def _predict_params() -> list[click.Parameter]:
    """`tracediag predict`'s model, device and split options (the same decorators; its ``-o`` aside),
    built here so that `analyze` does not import the `predict` command and the model it runs."""

    @model_options
    @device_options
    @split_options
    def options() -> None: ...

    # click collects decorators bottom-up; a command lists them top-down
    return list(reversed(options.__click_params__))  # type: ignore[attr-defined]


def check_options(f: Callable) -> Callable:
    """Decorator: add `--html`, `--plan` and the model options of `tracediag predict`."""
    params = [
        click.Option(
            ["--html", "html_path"],
            type=FilePath(dir_okay=False, path_type=Path),
            help="Also write the report as one self-contained HTML file (opens offline).",
        ),
        click.Option(
            ["--plan", "plan_path"],
            type=FilePath(exists=True, dir_okay=False, path_type=Path),
            help="Compare with a prediction saved by `tracediag predict -o` (instead of --model ...).",
        ),
        *(_optional(p) for p in _predict_params() if p.name not in _NOT_SHARED),
    ]
    # click applies decorators bottom-up and reverses the list it collects; keep the order above
    f.__click_params__ = [*getattr(f, "__click_params__", []), *reversed(params)]
    return f


def _prediction(kw: dict[str, Any], analysis: Analysis) -> Prediction | None:
    if kw["plan_path"] is not None:
        from tracediag.model.predict import load_prediction

        prediction = read_user_file(kw["plan_path"], "--plan", load_prediction, "tracediag prediction")
        for part in (prediction.model, prediction.split, prediction.training):
            checked_numbers(part, kw["plan_path"])
        return prediction
    if kw["model_name"] is None and kw["layers"] is None:
        return None
    missing = [n for n in _NEEDED if kw[n] is None]
    if missing:
        msg = f"a model check needs --{' --'.join(m.replace('_', '-') for m in missing)} (or --plan plan.json)"
        raise InputError(msg)
    gpus = kw["gpus"] if kw["gpus"] is not None else analysis.world_size
    return prediction_from_options({**kw, "gpus": gpus})


def add_check(analysis: Analysis, run: Run, kw: dict[str, Any]) -> Analysis:
    """The analysis with its `check` when a plan or a model was given; else unchanged."""
    try:
        prediction = _prediction(kw, analysis)
    except TracediagError as e:
        raise InputError(str(e).replace("\n\n", " ")) from None
    if prediction is None:
        return analysis
    from tracediag.observed_vs_predicted import check

    result = check(analysis, prediction, run=run)
    return dataclasses.replace(analysis, check=result)


def finish_report(
    analysis: Analysis, kw: dict[str, Any], run: Run | None = None, step_regex: str | None = None
) -> None:
    """Write the HTML report when `--html` was given (with `run`, the events analysed: its timelines)."""
    if kw["html_path"] is not None:
        from tracediag.cli.report import write_html

        write_html(analysis, kw["html_path"], run=run, step_regex=step_regex)

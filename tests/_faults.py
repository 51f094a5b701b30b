"""Task functions that fail on purpose, for the executor fault tests (shipped to real workers)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tracediag.execute.task import RankTask, summarize_files

CRASH_RANK = 1


def crash_first_attempt(tasks: list[RankTask]) -> list[dict]:
    """Summarise, then kill the worker process before it reports, on the first attempt of `CRASH_RANK`."""
    rows = summarize_files(tasks)
    if any(r["ok"] and r["rank"] == CRASH_RANK and r["attempt"] == 1 for r in rows):
        os._exit(1)
    return rows


def storage_fails(tasks: list[RankTask]) -> list[dict]:
    """Every attempt at a task holding the file of rank 2 raises OSError (its storage is gone)."""
    for task in tasks:
        if "rank2." in Path(task.path).name:
            with (Path(task.out) / "storage_fails.log").open("a") as log:
                log.write(f"{len(tasks)}\n")
            msg = f"cannot write under {task.out}: read-only file system"
            raise OSError(msg)
    return summarize_files(tasks)


DOOMED_NODE = "TRACEDIAG_TEST_DOOMED_NODE"
"""Set in the environment of the Ray node the node-death test kills; its workers inherit it."""


def stall_on_doomed_node(tasks: list[RankTask]) -> list[dict]:
    """On the doomed node: summarise, note this worker's pid under ``stalled/``, then wait (up to 5
    minutes) to be killed with the node before reporting. Elsewhere: first wait (up to 2 minutes) until
    a task stalls on the doomed node, so that this node's busy CPU makes Ray place tasks there, then
    summarise."""
    folder = Path(tasks[0].out) / "stalled"
    if os.environ.get(DOOMED_NODE):
        rows = summarize_files(tasks)
        folder.mkdir(parents=True, exist_ok=True)
        for task in tasks:
            (folder / f"{task.key}.tmp").write_text(str(os.getpid()))
            (folder / f"{task.key}.tmp").replace(folder / task.key)
        time.sleep(300)
        return rows
    deadline = time.monotonic() + 120
    while not (folder.is_dir() and any(folder.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.05)
    return summarize_files(tasks)

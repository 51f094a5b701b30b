"""Task functions that fail on purpose, for the executor fault tests (shipped to real workers)."""

from __future__ import annotations

import os

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
        if "rank2." in os.path.basename(task.path):
            with open(os.path.join(task.out, "storage_fails.log"), "a") as log:
                log.write(f"{len(tasks)}\n")
            raise OSError(f"cannot write under {task.out}: read-only file system")
    return summarize_files(tasks)

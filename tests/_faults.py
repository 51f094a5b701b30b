"""Task functions that fail on purpose, for the executor fault tests (shipped to real workers)."""

from __future__ import annotations

import os

from tracediag.execute.task import RankTask, summarize_file

CRASH_RANK = 1


def crash_first_attempt(task: RankTask) -> dict:
    """Summarise, then kill the worker process before it reports, on the first attempt of `CRASH_RANK`."""
    row = summarize_file(task)
    if row["ok"] and row["rank"] == CRASH_RANK and row["attempt"] == 1:
        os._exit(1)
    return row


def storage_fails(task: RankTask) -> dict:
    """Every attempt at the file of rank 2 raises OSError (its output storage is gone); others succeed."""
    if "rank2." in os.path.basename(task.path):
        with open(os.path.join(task.out, "storage_fails.log"), "a") as log:
            log.write(f"{os.getpid()}\n")
        raise OSError(f"cannot write under {task.out}: read-only file system")
    return summarize_file(task)

"""Whether this process is a fork of one that had imported tracediag (process state, not configuration).

Imported by the package itself, so the hook is in place from `import tracediag` on, however little of
the package a process has used before it forks.
"""

from __future__ import annotations

import os

_FORK = {"after_import": False}


def _forked() -> None:
    _FORK["after_import"] = True


def forked_after_import() -> bool:
    """True in a child forked after `import tracediag` (polars' thread pool may not survive that fork)."""
    return _FORK["after_import"]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)

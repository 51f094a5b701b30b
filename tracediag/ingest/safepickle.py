"""A pickle loader for untrusted files that builds only plain data.

A Flight Recorder dump is a pickle, and a pickle is a program: its ``GLOBAL``/``STACK_GLOBAL`` opcodes
import any callable and ``REDUCE``/``BUILD``/``INST``/``OBJ``/``NEWOBJ`` call it, so ``pickle.load`` on a
file from a job's shared folder runs whatever the file says. `load_plain` refuses every opcode that names
a class or function: every such opcode goes through ``find_class`` (extension codes included), which
raises here, and persistent ids and out-of-band buffers are left without handlers, so they raise too. What
remains builds only dicts, lists, tuples, sets, str, bytes, int, float, bool and None (Python's "Restricting
Globals" recipe with nothing allowed).
"""

from __future__ import annotations

import gc
import io
import pickle
from typing import Any

from tracediag.errors import TraceError


class _Refused(pickle.UnpicklingError):
    """The pickle names a class or function."""


class _PlainUnpickler(pickle.Unpickler):
    """`pickle.Unpickler` (the C one) with no class or function allowed."""

    def find_class(self, module: str, name: str) -> Any:
        msg = f"it names {module}.{name} (not run); only plain data (dicts, lists, strings, numbers) is loaded"
        raise _Refused(msg)


def load_plain(data: bytes, path: str) -> Any:
    """The object a pickle holds, built from plain containers and scalars only.

    Parameters
    ----------
    data
        The pickle's bytes (already gunzipped).
    path
        The file, for the message.

    Raises
    ------
    TraceError
        On a pickle that names a class or function (it is never called), a truncated or corrupt pickle,
        or one nested too deeply.
    """
    paused = gc.isenabled()
    gc.disable()  # a dump is ~10 containers per entry and holds no cycle: the collector would only rescan them
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except _Refused as e:
        raise TraceError(path, f"refused pickle: {e}") from None
    except pickle.UnpicklingError as e:
        kind = "truncated" if "truncated" in str(e) else "corrupt"
        raise TraceError(path, f"{kind} pickle ({e})") from None
    except EOFError:
        raise TraceError(path, "truncated pickle (the data ends before its STOP opcode)") from None
    except RecursionError:
        raise TraceError(path, "pickle nested too deeply") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, MemoryError) as e:
        raise TraceError(path, f"corrupt pickle ({type(e).__name__}: {e})") from None
    finally:
        if paused:
            gc.enable()

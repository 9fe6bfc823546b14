"""The errors a user can fix, and how every command reports them: one line, exit status 1.

raise ConfigError("trainer.global_batch_size=7 must divide over 8 devices")
...
except ConfigError as e:
    exit_with(e)              # prints `error: ...` and exits 1 (HYDRA_FULL_ERROR=1: traceback)
"""

from __future__ import annotations

import os
import sys


class ConfigError(ValueError):
    """A value the user gave is missing, unknown, out of range or does not fit (a config key, a
    file, a command-line option); the message is one line naming it and what was expected."""


def one_line(e: BaseException, limit: int = 600) -> str:
    """`e`'s message on one line (whitespace runs, newlines included, become one space), cut to
    `limit` characters; the exception's type name when it has no message. Library errors that end
    in a multi-line dump (Orbax's TensorStore spec) keep their first sentence and its cause."""
    text = str(e).strip()
    if "See full TensorStore details" in text:
        text = text.splitlines()[0].split(" See full TensorStore details")[0]
        if e.__cause__ is not None:
            text += f" <- {type(e.__cause__).__name__}: {one_line(e.__cause__, limit)}"
    text = " ".join(text.split())
    if not text:
        return type(e).__name__
    return text if len(text) <= limit else text[:limit] + " ..."


def exit_with(e: BaseException, prefix: str = "error: "):
    """Exits with status 1 and the one line `<prefix><message>`; with HYDRA_FULL_ERROR=1 (the
    variable Hydra users know) re-raises instead, for the traceback."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise e
    sys.exit(prefix + one_line(e, limit=10_000))

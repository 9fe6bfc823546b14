"""The config's XLA compiler flags (`run.xla_flags`), put into XLA_FLAGS before a backend starts.

XLA reads XLA_FLAGS once per process, when JAX starts its first backend (importing jax does not),
so `python -m train.main` sets them right after composing the config. The config's flags come
first and the environment's own XLA_FLAGS after them: XLA keeps the last of a repeated flag, so a
flag set in the shell wins over the config's (`tests/test_train_xla_flags.py` shows both). Flags of
another backend are ignored (an `--xla_gpu_*` flag changes nothing on a TPU or a CPU); a flag XLA
does not know stops the process at its start with XLA's own line, "Unknown flag in XLA_FLAGS".
"""

from __future__ import annotations

import logging
import os
import re

from train.errors import ConfigError

log = logging.getLogger(__name__)

_FLAG = re.compile(r"--[A-Za-z0-9_]+(=\S*)?")

_applied: str | None = None  # the flags this process's backends start with, once set


def parse(flags: str | None) -> str:
    """`flags` as one space-separated string; a ConfigError names a word that is not `--name` or
    `--name=value`."""
    words = (flags or "").split()
    for w in words:
        if not _FLAG.fullmatch(w):
            raise ConfigError(f"run.xla_flags: {w!r} is not an XLA flag (--name or --name=value)")
    return " ".join(words)


def merged(config_flags: str, env_flags: str | None) -> str:
    """XLA_FLAGS for a run: the config's flags, then the environment's (which win a repeat)."""
    return f"{config_flags} {env_flags or ''}".strip()


def apply(flags: str | None) -> None:
    """Puts the config's flags into XLA_FLAGS, once per process: the same flags again change
    nothing; other flags are a ConfigError (XLA has read them already, e.g. in a -m sweep, whose
    jobs share one process)."""
    global _applied
    flags = parse(flags)
    if _applied is not None:
        if flags != _applied:
            raise ConfigError(
                f"run.xla_flags: this process started XLA with {_applied!r}; XLA reads its flags "
                f"once per process, so {flags!r} needs a process of its own"
            )
        return
    os.environ["XLA_FLAGS"] = merged(flags, os.environ.get("XLA_FLAGS"))
    _applied = flags


def log_applied() -> None:
    """One line with the XLA_FLAGS the config's flags went into, when it has any: said before XLA
    reads them, so XLA's own line about a flag it does not know follows it."""
    if _applied:
        log.info("XLA_FLAGS=%r (run.xla_flags, then the shell's)", os.environ.get("XLA_FLAGS"))

"""The errors a user can fix, and how every command reports them: one line, exit status 1.

raise ConfigError("trainer.global_batch_size=7 must divide over 8 devices")
...
except ConfigError as e:
    exit_with(e)              # prints `error: ...` and exits 1 (HYDRA_FULL_ERROR=1: traceback)

A full disk is not the user's input: DiskFullError, one line too, exit status EXIT_DISK_FULL (74)
from `python -m train.main`, and the same command resumes once space is back.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import shutil
import sys


class ConfigError(ValueError):
    """A value the user gave is missing, unknown, out of range or does not fit (a config key, a
    file, a command-line option); the message is one line naming it and what was expected."""


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose usage error is the one line `error: ...` (exit status 2, as
    argparse's) instead of the usage block and the error; --help prints the usage. (The data
    builders' commands have their own: data/cli.py.)"""

    def error(self, message: str):
        self.exit(2, f"error: {message} ({self.prog} --help lists the options)\n")


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


def first_few(names, n: int = 3) -> str:
    """`names` for one line: the first `n`, then how many more."""
    names = list(names)
    shown = ", ".join(names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def exit_with(e: BaseException, prefix: str = "error: "):
    """Exits with status 1 and the one line `<prefix><message>`; with HYDRA_FULL_ERROR=1 (the
    variable Hydra users know) re-raises instead, for the traceback."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise e
    sys.exit(prefix + one_line(e, limit=10_000))


@contextlib.contextmanager
def user_errors(prefix: str = "error: "):
    """A command's body: a ConfigError raised inside ends the command with its one line
    (`exit_with`), as `python -m train.main` does. The bench commands run under it."""
    try:
        yield
    except ConfigError as e:
        exit_with(e, prefix)


def output_file(path: str, option: str) -> str:
    """`path` made ready for a command's output file named by `option` (--json, --out, ...): its
    folder created, before the command does its work. ConfigError when it cannot be: the path is
    a folder, or a file stands where a folder must be. Returns `path`."""
    path = os.fspath(path)
    if "://" in path:  # a bucket's object: its "folders" need no making
        return path
    if os.path.isdir(path):
        raise ConfigError(f"{option} {path}: a folder; expected a file name")
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        raise ConfigError(f"{option} {path}: a file stands where its folder must be") from e
    except OSError as e:
        raise ConfigError(f"{option} {path}: its folder cannot be made ({e.strerror})") from e
    return path


EXIT_DISK_FULL = 74  # sysexits.h EX_IOERR: free some space, then run the same command again

# How a full disk (or an exhausted quota) reads in an exception: OSError's errno, or the text of
# TensorStore's RESOURCE_EXHAUSTED error that Orbax re-raises as a ValueError.
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "os_error_code='28'")


class DiskFullError(Exception):
    """A write failed because the disk (or quota) holding `path` is full. `python -m train.main`
    prints its one line and exits EXIT_DISK_FULL; the run resumes with the same command once
    space is back (docs/training.md, "A full disk")."""

    def __init__(self, path, what: str = "", after: str = ""):
        self.path = str(path)
        what = what or str(path)
        super().__init__(
            f"disk full: cannot write {what} ({free_space(path)}){after}. Free some space, then "
            "run the same command again"
        )


def is_disk_full(e: BaseException) -> bool:
    """Whether `e` (or an exception it was raised from) says the disk or quota is full."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _DISK_FULL_ERRNOS:
            return True
        if any(t in str(e) for t in _DISK_FULL_TEXTS):
            return True
        e = e.__cause__ or e.__context__
    return False


@contextlib.contextmanager
def disk_full_names(path, what: str = ""):
    """Inside it, an OSError that says the disk is full becomes a DiskFullError naming `path`."""
    try:
        yield
    except OSError as e:
        if is_disk_full(e):
            raise DiskFullError(path, what) from e
        raise


def free_space(path) -> str:
    """'<n> free on <mount>' for the filesystem that holds `path` (its nearest existing parent);
    a bucket has no such figure."""
    path = str(path)
    if "://" in path:
        return "a bucket: check its quota"
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return "free space unknown"
    return f"{_size(free)} free on {_mount_point(probe)}"


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _mount_point(path: str) -> str:
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path

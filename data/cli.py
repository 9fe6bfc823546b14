"""What the builders' command lines share (python -m data.maze | arc | shakespeare_char |
openwebtext | sudoku | sudoku_easy): the parser, with the module docstring as its help, the
closing summary, and `run`, which ends a bad input in one line."""

from __future__ import annotations

import argparse
import os
import sys

from data.download import DownloadError


class BuildError(RuntimeError):
    """What the machine lacks for a build, with the message saying how to get it (a tokenizer's
    files offline, an optional package)."""


# What a builder's user can fix, each raised with a message naming the file or value: a missing or
# malformed input (OSError, the builders' format errors, which are ValueErrors), an output folder
# that exists, a bad value, a failed download, what the machine lacks.
USER_ERRORS = (OSError, ValueError, DownloadError, BuildError)


def run(main, argv=None):
    """`python -m data.<builder>`: main(argv); a user error ends it with the one line
    `error: <message>` and exit status 1. HYDRA_FULL_ERROR=1 (as for train's commands) re-raises
    it, for the traceback."""
    try:
        return main(argv)
    except USER_ERRORS as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.exit("error: " + (" ".join(str(e).split()) or type(e).__name__))


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose usage error is the one line `error: ...` (exit status 2, as
    argparse's) instead of the usage block and the error; --help prints the usage (train's
    commands: train.errors.OneLineParser, the same)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} ({self.prog} --help lists the options)\n")


def parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """`python -m <module>`'s parser; `doc` (the module docstring) is printed as written."""
    return OneLineParser(
        prog=f"python -m {module}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def print_summary(summary: dict) -> dict:
    """One `key: value` line per entry, keys right-aligned; returns `summary`."""
    width = max(map(len, summary), default=0)
    for k, v in summary.items():
        print(f"{k:>{width}}: {v}")
    return summary

"""What the builders' command lines share (python -m data.maze | arc | shakespeare_char |
openwebtext): the parser, with the module docstring as its help, and the closing summary."""

from __future__ import annotations

import argparse


def parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """`python -m <module>`'s parser; `doc` (the module docstring) is printed as written."""
    return argparse.ArgumentParser(
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

"""`python -m parity {gpt,trm} [options]`: print the per-module parity table for a port."""

from __future__ import annotations

import importlib
import sys

_REPORTS = {"gpt": "parity.report_gpt", "trm": "parity.report_trm"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in _REPORTS or argv[0] in ("-h", "--help"):
        print(f"usage: python -m parity {{{','.join(_REPORTS)}}} [--help | report options]")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(_REPORTS[argv[0]])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())

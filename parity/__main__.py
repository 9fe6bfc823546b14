"""`python -m parity {gpt,trm,diff} [options]`: per-module parity tables.

- `gpt`, `trm`: this repository's two ports against their PyTorch references;
- `diff TORCH_FACTORY NNX_FACTORY`: any torch module against its NNX port (parity/diff.py).
"""

from __future__ import annotations

import importlib
import sys

_REPORTS = {"gpt": "parity.report_gpt", "trm": "parity.report_trm", "diff": "parity.diff"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in _REPORTS or argv[0] in ("-h", "--help"):
        print(f"usage: python -m parity {{{','.join(_REPORTS)}}} [--help | report options]")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    from parity.backend import quiet_tpu_probe

    quiet_tpu_probe()  # before JAX starts a backend: no libtpu probe lines on a CPU machine
    try:
        module = importlib.import_module(_REPORTS[argv[0]])
    except ModuleNotFoundError as e:
        if e.name != _REPORTS[argv[0]]:
            raise
        print(f"python -m parity {argv[0]}: this repository's own report, not part of the toolkit "
              "installed alone (python -m parity diff is)", file=sys.stderr)  # fmt: skip
        return 2
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())

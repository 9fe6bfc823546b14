"""`python -m parity {diff,mutate,gpt,trm} [options]`: per-module parity tables.

- `diff TORCH_FACTORY NNX_FACTORY`: any torch module against its NNX port (parity/diff.py);
- `mutate SPEC`: break a port on purpose, mutant by mutant, and check that the diff names each
  (parity/mutate.py);
- `gpt`, `trm`: this repository's two ports against their PyTorch references.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (its module, one line for `python -m parity --help`)
_COMMANDS = {
    "diff": (
        "parity.diff",
        "TORCH_FACTORY NNX_FACTORY: a torch module against its Flax NNX port, module by module",
    ),
    "mutate": (
        "parity.mutate",
        "SPEC: mutants of a port (output transposed, eps x10, ...): the diff must name each",
    ),
    "gpt": ("parity.report_gpt", "this repository's nanoGPT port against its torch reference"),
    "trm": ("parity.report_trm", "this repository's TRM port against its torch reference"),
}
_USAGE = f"usage: python -m parity {{{','.join(_COMMANDS)}}} [--help | options]"


def _help() -> str:
    width = max(map(len, _COMMANDS))
    lines = [_USAGE, "", "commands (python -m parity COMMAND --help for each one's options):"]
    lines += [f"  {name:<{width}}  {line}" for name, (_, line) in _COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(_help())
        return 0
    if not argv or argv[0] not in _COMMANDS:
        given = f"unknown command {argv[0]!r}, expected" if argv else "expected a command,"
        print(
            f"python -m parity: {given} one of {', '.join(_COMMANDS)} (--help: what each does)",
            file=sys.stderr,
        )
        return 2
    from parity.backend import quiet_tpu_probe

    quiet_tpu_probe()  # before JAX starts a backend: no libtpu probe lines on a CPU machine
    name = _COMMANDS[argv[0]][0]
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        print(f"python -m parity {argv[0]}: this repository's own report, not part of the toolkit "
              "installed alone (python -m parity diff is)", file=sys.stderr)  # fmt: skip
        return 2
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench [...]`: the step-time benchmark (bench/speed.py), and its subcommands:

- `ttq`: time to quality, JAX vs the PyTorch reference (bench/ttq.py);
- `curves`: whole runs of this trainer against upstream's own code, seeds (bench/curves.py);
- `ttsc`: a trained TRM's test-time scaling (bench/ttsc.py);
- `trainer`: the trainer's loop against its bare jitted step (bench/trainer_vs_bare.py);
- `demo`: `make demo` over seeds (bench/demo.py);
- `timings`: `make demo` and `make test` from a fresh clone (bench/timings.py);
- `gpu`: every GPU figure of docs/benchmarks.md in one command, time-boxed (bench/gpu.py);
- `tables`: the docs' tables of measured figures, from bench/results (bench/tables.py).
"""

import importlib
import sys

from train.errors import user_errors

COMMANDS = {"ttq": "ttq", "curves": "curves", "ttsc": "ttsc", "trainer": "trainer_vs_bare",
            "demo": "demo", "timings": "timings", "gpu": "gpu", "tables": "tables"}  # fmt: skip


def _main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] in COMMANDS:
        importlib.import_module(f"bench.{COMMANDS[argv[0]]}").main(argv[1:])
    else:
        importlib.import_module("bench.speed").main(argv)


if __name__ == "__main__":
    with user_errors():  # a ConfigError is one line
        _main()

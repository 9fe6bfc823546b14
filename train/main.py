"""Entry point: `python -m train.main +experiment=NAME [key=value ...]`.

Kept short on purpose (Flax examples/gemma style): distributed init, config, mesh, one call into the
trainer. Environment for multi-process runs: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
JAX_PROCESS_ID (local tests, train/launch.py); on Cloud TPU none are needed.
"""

from __future__ import annotations

import logging
import sys

from train.distributed import initialize


def main(argv: list[str] | None = None) -> dict:
    initialize()  # before anything touches devices
    from train.compose import load_config
    from train.config import ConfigError
    from train.mesh import make_mesh
    from train.trainer import train

    try:
        cfg = load_config(sys.argv[1:] if argv is None else argv)
        return train(cfg, make_mesh(cfg.mesh))  # raises ConfigError when it cannot resume
    except ConfigError as e:
        sys.exit(f"error: {e}")  # exit status 1, no traceback: it is the user's input


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every file it writes
    main()

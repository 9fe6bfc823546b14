"""Entry point: `python -m train.main +experiment=NAME [key=value ...]`.

Kept short on purpose (Flax examples/gemma style): distributed init, config, compilation cache,
mesh, one call into the trainer. Environment for multi-process runs: JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES and JAX_PROCESS_ID (local runs and tests, launch/local.py); on Cloud TPU none are needed.
"""

from __future__ import annotations

import logging
import sys

from train.compilation_cache import log_compilation_cache_stats, setup_compilation_cache
from train.compose import load_config
from train.config import ConfigError
from train.distributed import initialize
from train.mesh import make_mesh
from train.nonfinite import NonfiniteError
from train.trainer import train


def main(argv: list[str] | None = None) -> dict:
    initialize()  # before anything touches devices (importing the trainer does not)
    try:
        cfg = load_config(sys.argv[1:] if argv is None else argv)
        # Process-wide, so here and not in train(): before the first compile, once per process.
        setup_compilation_cache(
            cfg.run.compilation_cache_dir, cfg.run.compilation_cache_min_compile_secs
        )
        try:
            return train(cfg, make_mesh(cfg.mesh))  # raises ConfigError when it cannot resume
        finally:
            log_compilation_cache_stats()  # hits / misses of this process
    except ConfigError as e:
        sys.exit(f"error: {e}")  # exit status 1, no traceback: it is the user's input
    except NonfiniteError as e:  # trainer.on_nonfinite=stop: the message says where and what
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    # force: importing grain (above) already gave the root logger a handler, which would make
    # basicConfig a no-op and leave it at WARNING
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)
    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every file it writes
    main()

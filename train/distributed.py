"""`jax.distributed.initialize` for every environment this trainer runs in.

- Cloud TPU pod slice (e.g. v4-64, 8 hosts): no arguments; JAX reads the worker list and this
  worker's id from the GCE metadata server (set TRAIN_DISTRIBUTED=1 or run on a TPU VM with >1
  worker; `launch/` does this).
- Local multi-process tests: JAX_COORDINATOR_ADDRESS=127.0.0.1:PORT, JAX_NUM_PROCESSES,
  JAX_PROCESS_ID (launch/local.py sets them).
- Anything else: single process, nothing to do.
Orbax barriers and multihost_utils need the distributed client even where collectives do not.
"""

from __future__ import annotations

import os

import jax


def initialize() -> None:
    addr = os.environ.get("JAX_COORDINATOR_ADDRESS")
    if addr:
        jax.distributed.initialize(
            coordinator_address=addr,
            num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
            process_id=int(os.environ["JAX_PROCESS_ID"]),
        )
    elif os.environ.get("TRAIN_DISTRIBUTED") == "1":
        jax.distributed.initialize()  # Cloud TPU / SLURM / GKE auto-detection

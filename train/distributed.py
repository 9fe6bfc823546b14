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

import glob
import importlib.util
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


def quiet_tpu_probe(environ=os.environ) -> str | None:
    """JAX_PLATFORMS=cpu when libtpu is installed (`make test` installs it) but this machine has
    neither a TPU nor an NVIDIA GPU: otherwise every run starts with libtpu's probe errors. Left
    alone when JAX_PLATFORMS is set. Every command-line entry point calls it before JAX starts a
    backend (train.main, train.evaluate, train.sample, train.export). -> the value set, or None."""
    if "JAX_PLATFORMS" in environ or importlib.util.find_spec("libtpu") is None:
        return None
    accelerators = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*")
    if any(glob.glob(pattern) for pattern in accelerators):
        return None
    environ["JAX_PLATFORMS"] = "cpu"  # for child processes
    jax.config.update("jax_platforms", "cpu")  # jax read the variable when it was imported
    return "cpu"

"""Which JAX backend a command line starts: owned by the toolkit, since `python -m parity diff`
runs in projects of users' own (whose `train` package is not this one), and re-exported by
train/distributed.py for the trainer's entry points."""

from __future__ import annotations

import glob
import importlib.util
import os


def quiet_tpu_probe(environ=os.environ) -> str | None:
    """JAX_PLATFORMS=cpu when libtpu is installed (`make test` installs it) but this machine has
    neither a TPU nor an NVIDIA GPU: otherwise every run starts with libtpu's probe errors. Left
    alone when JAX_PLATFORMS is set. Every command-line entry point calls it before JAX starts a
    backend (train.main, train.evaluate, train.sample, train.export, python -m parity). -> the
    value set, or None."""
    if "JAX_PLATFORMS" in environ or importlib.util.find_spec("libtpu") is None:
        return None
    accelerators = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*")
    if any(glob.glob(pattern) for pattern in accelerators):
        return None
    import jax

    environ["JAX_PLATFORMS"] = "cpu"  # for child processes
    jax.config.update("jax_platforms", "cpu")  # jax read the variable when it was imported
    return "cpu"

"""Which JAX backend the toolkit's command line starts (`python -m parity`): its own, since
`python -m parity diff` runs in projects of users' own, without this repository's train/ (whose
entry points have theirs in train/runtime.py, with the trainer's other runtime settings)."""

from __future__ import annotations

import glob
import importlib.util
import os

# device files of a TPU (v4: /dev/accel*, v5e and later: /dev/vfio/<n>) or an NVIDIA GPU
ACCELERATOR_DEVICES = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*")


def quiet_tpu_probe(environ=os.environ) -> str | None:
    """JAX_PLATFORMS=cpu when libtpu is installed (`make test` installs it) but this machine has
    neither a TPU nor an NVIDIA GPU: otherwise every run starts with libtpu's probe errors. Left
    alone when JAX_PLATFORMS is set. `python -m parity` calls it before JAX starts a backend.
    -> the value set, or None."""
    if "JAX_PLATFORMS" in environ or importlib.util.find_spec("libtpu") is None:
        return None
    if any(glob.glob(pattern) for pattern in ACCELERATOR_DEVICES):
        return None
    import jax

    environ["JAX_PLATFORMS"] = "cpu"  # for child processes
    jax.config.update("jax_platforms", "cpu")  # jax read the variable when it was imported
    return "cpu"

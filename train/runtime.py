"""The trainer's runtime settings, made before JAX starts a backend: the CPU step's buffers kept
in the heap (`keep_cpu_step_buffers`, for `run.cpu_heap`) and no libtpu probe on a machine without
an accelerator (`quiet_tpu_probe`, every entry point: train.main, train.evaluate, train.sample,
train.export and the bench commands). The parity toolkit's command has its own probe
(parity/backend.py): the toolkit runs in projects without this train/ package.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import logging
import os
import platform
import sys

# device files of a TPU (v4: /dev/accel*, v5e and later: /dev/vfio/<n>) or an NVIDIA GPU
ACCELERATOR_DEVICES = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*")

# glibc's mallopt parameters, and the environment variables that set them at a process's start
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
CPU_HEAP = {  # name: (mallopt parameter, value)
    "MALLOC_ARENA_MAX": (_M_ARENA_MAX, 1),
    "MALLOC_MMAP_MAX_": (_M_MMAP_MAX, 0),
    "MALLOC_TRIM_THRESHOLD_": (_M_TRIM_THRESHOLD, 2**31 - 1),
}


def keep_cpu_step_buffers(environ=os.environ) -> bool:
    """Keeps the CPU backend's per-step buffers in the process's heap: glibc's malloc with one
    arena, no mmap and no trimming of the heap's top (up to 2 GiB).

    XLA:CPU allocates an execution's temporaries as one buffer (trm_sudoku_cpu's step: 119 MB)
    and frees it when the step ends. glibc serves an allocation that large with a fresh mmap (its
    mmap threshold is at most 32 MB, and a thread's own arena holds at most 64 MB) and unmaps it
    on free, so every step writes 119 MB of new pages: 30,000 page faults, half of the 62-66 ms
    step spent in the kernel on a 2-core VM; with these settings 33-43 ms. The cost: one arena
    for every thread makes compiling slower (a tiny TRM run's start ~2-3 s, XLA:TPU's compile of
    trm_sudoku 39 -> 52 s), and the process keeps the memory it freed. Numbers are unchanged: only
    where the buffers live. The trainer calls it for `run.cpu_heap=true` (the CPU experiments);
    docs/training.md, "The CPU step page-faults its buffers every step".

    Only where JAX will run on the CPU (JAX_PLATFORMS is `cpu`, or this machine has no TPU or
    NVIDIA device file), with glibc, and when the environment sets none of these variables (a
    user's own choice, or a parent process that set them: they applied at this process's start).
    Must run before JAX starts a backend: a thread that allocated before has an arena of its own.
    Also sets the variables for child processes. -> whether it set them."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(name in environ for name in CPU_HEAP) or "glibc.malloc" in environ.get(
        "GLIBC_TUNABLES", ""
    ):
        return False
    platforms = {p.strip() for p in environ.get("JAX_PLATFORMS", "").split(",") if p.strip()}
    if platforms != {"cpu"} and (platforms or any(glob.glob(p) for p in ACCELERATOR_DEVICES)):
        return False
    libc = ctypes.CDLL(None)
    for name, (param, value) in CPU_HEAP.items():
        if libc.mallopt(param, value) != 1:
            logging.getLogger(__name__).debug("mallopt(%s=%s) refused", name, value)
            return False
        environ[name] = str(value)
    return True


def quiet_tpu_probe(environ=os.environ) -> str | None:
    """JAX_PLATFORMS=cpu when libtpu is installed (`make test` installs it) but this machine has
    neither a TPU nor an NVIDIA GPU: otherwise every run starts with libtpu's probe errors. Left
    alone when JAX_PLATFORMS is set. Every entry point of the trainer calls it before JAX starts a
    backend (train.main, train.evaluate, train.sample, train.export, the bench commands). -> the
    value set, or None."""
    if "JAX_PLATFORMS" in environ or importlib.util.find_spec("libtpu") is None:
        return None
    if any(glob.glob(pattern) for pattern in ACCELERATOR_DEVICES):
        return None
    import jax

    environ["JAX_PLATFORMS"] = "cpu"  # for child processes
    jax.config.update("jax_platforms", "cpu")  # jax read the variable when it was imported
    return "cpu"

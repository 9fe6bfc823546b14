"""Whether a run's state fits its devices, decided before anything is compiled or allocated.

    check_state_fits(task)     # ConfigError naming the estimate and the limit when it cannot

The train state (parameters, optimizer moments, EMA copy, TRM's carry) stays on the devices for
the whole run, so its bytes per device are a lower bound of what the step needs (the step also
holds gradients and activations: `python -m train.aot` prints XLA's analysis of the compiled
program). A model whose state alone exceeds a device's memory would otherwise compile for minutes
and then end in XLA's out-of-memory traceback (`model.hidden_size=1048576`: 23 TB); an
out-of-memory error of XLA that does happen becomes one line too (`out_of_memory_line`).
"""

from __future__ import annotations

import math
import os

import jax

from train.errors import ConfigError


def state_bytes_per_device(abstract_state, shardings) -> int:
    """Bytes of the largest device's shards of the state (ShapeDtypeStructs + NamedShardings)."""
    per_device: dict = {}
    for leaf, sharding in zip(jax.tree.leaves(abstract_state), jax.tree.leaves(shardings)):
        shard = sharding.shard_shape(leaf.shape)
        nbytes = math.prod(shard) * leaf.dtype.itemsize
        for device in sharding.device_set:
            per_device[device] = per_device.get(device, 0) + nbytes
    return max(per_device.values(), default=0)


def memory_limit(device) -> tuple[int | None, str]:
    """(bytes one device may hold, what that figure is): an accelerator's own limit; on a CPU the
    machine's RAM shared by its local CPU devices; (None, ...) when unknown."""
    if device.platform == "cpu":
        try:
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None, "unknown"
        n = max(1, len(jax.local_devices(backend="cpu")))
        share = f", shared by {n} CPU devices" if n > 1 else ""
        return ram // n, f"{_gib(ram)} of RAM{share}"
    stats = device.memory_stats() or {}
    limit = stats.get("bytes_limit")
    return (int(limit), f"{_gib(limit)} per {device.device_kind}") if limit else (None, "unknown")


def check_state_fits(task) -> None:
    """ConfigError when the task's state alone is larger than a device can hold."""
    need = state_bytes_per_device(task.abstract_state, task.state_shardings)
    device = task.mesh.devices.flat[0]
    limit, what = memory_limit(device)
    if limit is not None and need > limit:
        raise ConfigError(
            f"the train state (parameters, optimizer state, EMA) alone needs {_gib(need)} per "
            f"device, more than {what}; the step needs more still (gradients, activations). "
            "Make the model smaller (model.*), or shard it over more devices (mesh)"
        )


def out_of_memory_line(e: BaseException, task=None) -> str | None:
    """One line for XLA's out-of-memory error (RESOURCE_EXHAUSTED, "Out of memory"), naming the
    state's share when the task is known; None for any other error."""
    text = str(e)
    if not ("RESOURCE_EXHAUSTED" in text or "Out of memory" in text):
        return None
    first = " ".join(text.split())[:300]
    state = ""
    if task is not None and task.abstract_state is not None:
        need = state_bytes_per_device(task.abstract_state, task.state_shardings)
        state = f" (the train state alone: {_gib(need)} per device)"
    return (
        f"the devices ran out of memory{state}: {first}. Lower trainer.global_batch_size, make "
        "the model smaller, or shard it over more devices; python -m train.aot prints the "
        "compiled step's memory"
    )


def _gib(n) -> str:
    return f"{n / 2**30:.1f} GiB" if n < 2**40 else f"{n / 2**40:.1f} TiB"

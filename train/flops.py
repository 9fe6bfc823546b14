"""The peak FLOP/s a model's FLOPs per step are divided by for MFU.

Each family counts its own FLOPs per step (models/<family>/flops.py, the analytic count every
reader takes: the task's `flops_per_step`, the AOT report, the benchmarks); the trainer's `mfu`
metric (train/trainer.py) divides it by the peak of its devices from here: a datasheet figure by
chip name, or on a CPU the measured matmul rate.
"""

from __future__ import annotations

import math
import time

# ----------------------------------------------------------------------------------------------
# Peak FLOP/s

# Dense bf16 peak FLOP/s per chip, without sparsity (vendor datasheets). Matched by `peak_flops_for`
# against a jax device_kind ("NVIDIA H100 80GB HBM3", "TPU v5 lite"), an nvidia-smi name
# ("NVIDIA A100-SXM4-40GB") or a short preset ("A100", "TPUv4"): case, spaces, '-' and '_' are
# ignored, and the longest name found in the given one wins ("H100 PCIe" before "H100").
PEAK_FLOPS = {
    "H100 PCIe": 756e12,
    "H100": 989e12,  # SXM
    "H200": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "RTX 4090": 165e12,
    "TPU v3": 123e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,  # v5e's device_kind
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,  # v6e's device_kind
    "TPU v6e": 918e12,
}


def _folded(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch not in " -_")


def peak_flops_for(name: str) -> float | None:
    """Datasheet peak FLOP/s of the chip called `name` (see PEAK_FLOPS), None when unknown."""
    folded = _folded(name)
    for key in sorted(PEAK_FLOPS, key=lambda k: -len(_folded(k))):
        if _folded(key) in folded:
            return PEAK_FLOPS[key]
    return None


def measure_matmul_flops(device=None, n: int = 1024, repeats: int = 8) -> float:
    """Best observed FLOP/s of an n x n x n float32 matmul through XLA on `device` (default: the
    first). An empirical ceiling for a chip without a datasheet number (a CPU): the fastest of
    `repeats` runs, so a busy neighbour lowers it as little as possible."""
    import jax  # lazy: bench's PyTorch workers import this module and never load jax
    import jax.numpy as jnp

    device = device or jax.devices()[0]
    a = jax.device_put(jnp.ones((n, n), jnp.float32), device)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


_measured: dict[str, float] = {}


def peak_flops(device=None) -> float:
    """Peak FLOP/s of one jax device: its datasheet figure by device_kind, else (a CPU) the
    measured `measure_matmul_flops` rate, measured once per process. CPU "MFU" then reads as the
    fraction of the best matmul throughput this machine showed, not of a datasheet peak."""
    import jax  # lazy, as above

    device = device or jax.devices()[0]
    peak = peak_flops_for(device.device_kind)
    if peak is None:
        if device.device_kind not in _measured:
            _measured[device.device_kind] = measure_matmul_flops(device)
        peak = _measured[device.device_kind]
    return peak

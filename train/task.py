"""What the trainer needs from a model family, and the parts every family shares.

A task builds its model + optimizer inside `init_state(key)` and exposes a pure
`train_step(state, batch) -> (state, metrics)`. `Task.__init__` (subclasses call `_setup()` at the
end of theirs) traces `init_state` once with `jax.eval_shape` to get the abstract state and the
NNX graphdef, derives the shardings, and from then on the state is a plain pytree of jax.Arrays:
jit-able, donatable, checkpointable.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from train import mesh as mesh_lib

# Dense peak FLOP/s per device by jax device_kind (bf16 on accelerators). CPUs have no spec-sheet
# number we can rely on: `peak_flops` measures an fp32 matmul instead (see there).
PEAK_FLOPS = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H200": 989e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
}

_cpu_peak = None


def peak_flops(device=None) -> float:
    """Peak FLOP/s of one device: the table above, else (CPU) a measured fp32 matmul rate.

    The CPU figure is what XLA's own best kernel reaches on a 1024^2 matmul, so CPU "MFU" reads as
    "fraction of the best matmul throughput this machine showed", not of a datasheet peak.
    """
    global _cpu_peak
    device = device or jax.devices()[0]
    for kind, flops in PEAK_FLOPS.items():
        if device.device_kind.startswith(kind):
            return flops
    if _cpu_peak is None:
        n = 1024
        a = jax.device_put(jnp.ones((n, n), jnp.float32), device)
        f = jax.jit(lambda x: x @ x)
        f(a).block_until_ready()
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.3:
            f(a).block_until_ready()
            reps += 1
        _cpu_peak = 2 * n**3 * reps / (time.perf_counter() - t0)
    return _cpu_peak


class Task:
    """Base class. Subclasses set `self.cfg`, `self.mesh` and implement the abstract methods."""

    cfg = None
    mesh = None
    graphdef = None  # NNX graphdef of the training objects (set while tracing init_state)
    items_name = "examples"  # or "tokens": what `items_per_step` counts

    # --- to implement ---------------------------------------------------------------------
    def init_state(self, key):  # -> state pytree (built from scratch; traced under jit)
        raise NotImplementedError

    def train_step(self, state, batch):  # -> (state, metrics dict of scalars)
        raise NotImplementedError

    def local_batch_shapes(self) -> dict:  # key -> (global shape, dtype, batch axis)
        raise NotImplementedError

    def train_iterator(self):  # -> iterator of process-local numpy batches (get/set_state)
        raise NotImplementedError

    def evaluate(self, state, step: int) -> dict:  # -> host metrics
        return {}

    total_steps: int = 0
    flops_per_step: float = 0.0
    items_per_step: int = 0

    # --- shared -----------------------------------------------------------------------------
    def _setup(self):
        key = jax.random.key(self.cfg.run.seed)
        self.abstract_state = jax.eval_shape(self.init_state, key)
        mode = self.cfg.mesh.param_sharding
        self.state_shardings = self.shardings_for(self.abstract_state, mode)

    def shardings_for(self, abstract_state, mode):
        """Default: every leaf by the param rule (replicate / fsdp). TRM overrides for its carry."""
        return mesh_lib.tree_shardings(abstract_state, self.mesh, mode)

    def create_state(self):
        """The initial state, every array created directly in its shard (jit + out_shardings)."""
        key = jax.random.key(self.cfg.run.seed)
        with jax.set_mesh(self.mesh):
            return jax.jit(self.init_state, out_shardings=self.state_shardings)(key)

    def batch_sharding(self, ndim: int, batch_axis: int = 0) -> NamedSharding:
        spec = [None] * ndim
        spec[batch_axis] = mesh_lib.logical_to_mesh(self.cfg.mesh.rules, "batch")
        return NamedSharding(self.mesh, PartitionSpec(*spec))

    def abstract_batch(self) -> dict:
        return {
            k: jax.ShapeDtypeStruct(shape, dtype, sharding=self.batch_sharding(len(shape), axis))
            for k, (shape, dtype, axis) in self.local_batch_shapes().items()
        }

    def to_global(self, local_batch: dict) -> dict:
        """Process-local numpy rows -> global sharded arrays (make_array_from_process_local_data)."""
        shapes = self.local_batch_shapes()
        out = {}
        for k, (shape, dtype, axis) in shapes.items():
            v = np.asarray(local_batch[k], dtype=dtype)
            out[k] = jax.make_array_from_process_local_data(
                self.batch_sharding(len(shape), axis), v, shape
            )
        return out

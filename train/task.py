"""What the trainer needs from a model family, and the parts every family shares.

A task builds its model + optimizer inside `init_state(key)` and exposes a pure
`train_step(state, batch) -> (state, metrics)`. `Task.__init__` (subclasses call `_setup()` at the
end of theirs) traces `init_state` once with `jax.eval_shape` to get the abstract state and the
NNX graphdef, derives the shardings, and from then on the state is a plain pytree of jax.Arrays:
jit-able, donatable, checkpointable.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from train import mesh as mesh_lib


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

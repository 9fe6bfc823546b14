"""The seam between the generic trainer and a model family: every hook the trainer calls.

A family (train/gpt_task.py, train/trm_task.py) implements the hooks below in ONE file, a thin
adapter over its model package: its config schema and validation, its data, its train and eval
steps, its evaluation loop, and weight import / export. The trainer (train/trainer.py,
train/jit.py, train/source.py, train/aot.py) calls nothing else:

    cls = task_class(cfg.task)                 # train/families.py, by name
    cls.validate_config(cfg)                   # at compose time (train/compose.py)
    cls.needs_x64(cfg)                         # before anything is traced (process-wide switch)
    task = cls(cfg, mesh)                      # graphdef, abstract_state, state_shardings
    state = task.create_state()                # or restored onto task.state_shardings
    state, metrics = task.train_step(state, task.to_global(next(data)))    # jitted
    sums = task.eval_step(state, batch)        # jitted; summed over batches, then
    task.eval_metrics(sums)                    # -> {"loss": ...} / {"exact_accuracy": ...}
    task.evaluate(state, step)                 # the trainer's evaluation: {"eval/...": ...}

Both steps are pure functions of (state, batch) with the task's static attributes (graphdef,
config) closed over, and both take the FULL state the trainer holds.

`init(key) -> (graphdef, state)` builds the model and optimizer and splits them (nnx.split); the
graphdef is static (a pytree without leaves), so `jax.eval_shape(task.init, key)` gives both the
graphdef and the abstract state without allocating, and `jax.jit(task.init, out_shardings=...)`
creates every array directly in its shard. From then on the state is a plain pytree of
jax.Arrays (jit-able, donatable, checkpointable) and `step` is a pure function of it.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec
from omegaconf import OmegaConf, open_dict

from train import mesh as mesh_lib


def sync_processes(name: str) -> None:
    """A barrier over all processes (nothing with one): e.g. after process 0 built a data set."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def build_once(name: str, build) -> None:
    """Runs `build()` on process 0 while the others wait at the barrier `name` (a data set that
    every process then reads)."""
    if jax.process_index() == 0:
        build()
    sync_processes(name)


def record_in_config(cfg, values: dict) -> None:
    """Writes dotted-key values into `cfg` (struct mode or not). A task records the sizes it read
    from the data set, so the run's config.yaml describes its model without the data."""
    with open_dict(cfg):
        for key, value in values.items():
            OmegaConf.update(cfg, key, value, force_add=True)


# A batch spec: key -> (global shape, numpy dtype, batch axis). The batch axis is sharded over the
# mesh axes of the `batch` logical rule; every other axis is replicated.
BatchShapes = dict[str, tuple[tuple[int, ...], Any, int]]


class Task:
    """Base class of a model family. A subclass sets `cfg`, `mesh` and the attributes below in its
    `__init__`, implements the hooks, and calls `self._setup()` last."""

    cfg: Any = None
    mesh: Any = None
    model_cfg: Any = None  # the model's own config dataclass (GPTConfig / TRMConfig)
    items_name: str = "examples"  # or "tokens": what `items_per_step` counts
    console_metrics: tuple[str, ...] = ()  # the metrics the console line shows, besides speed
    total_steps: int = 0  # optimiser steps of the schedule
    items_per_step: int = 0  # examples or tokens one step consumes (throughput)
    flops_per_step: float = 0.0  # model FLOPs of one step (MFU)
    # What a checkpoint depends on (train/trainer.py `resume_settings`): every model.* key but
    # `resume_free_keys` (implementation choices that compute the same function), the batch
    # settings, and `resume_keys` (an optimizer switch that adds state, the data layout).
    resume_keys: tuple[str, ...] = ()
    resume_free_keys: tuple[str, ...] = ()
    # Set by _setup from `init`: the static NNX graphdef, the state's ShapeDtypeStructs and the
    # NamedShardings of every state leaf.
    graphdef: Any = None
    abstract_state: Any = None
    state_shardings: Any = None

    # --- from the config alone, before a task exists --------------------------------------------
    @classmethod
    def validate_config(cls, cfg) -> None:
        """Checks the family's sections (model / data / optim, and the trainer keys it reads);
        raises train.config.ConfigError naming the key. Called at compose time, before compute."""
        raise NotImplementedError

    @classmethod
    def needs_x64(cls, cfg) -> bool:
        """Whether this run computes in float64 somewhere, so jax x64 must be on before the first
        trace (train.families.enable_x64_if_needed switches it, process-wide)."""
        return False

    # --- the model and its step ---------------------------------------------------------------
    def init(self, key) -> tuple[Any, Any]:
        """-> (graphdef, state): model + optimizer built from `key` and split (traced under jit)."""
        raise NotImplementedError

    def train_step(self, state, batch) -> tuple[Any, dict]:
        """One optimiser step, pure: -> (state, metrics: dict of float32 scalars on device)."""
        raise NotImplementedError

    def state_shardings_for(self, abstract_state):
        """Shardings of the state. Default: every leaf by the param rule (replicate / fsdp)."""
        return mesh_lib.tree_shardings(abstract_state, self.mesh, self.cfg.mesh.param_sharding)

    # --- data ---------------------------------------------------------------------------------
    def batch_shapes(self, batch_size: int | None = None) -> BatchShapes:
        """The train batch: key -> (global shape, dtype, batch axis); with `batch_size`, an
        evaluation batch of that many rows in the layout `eval_step` takes."""
        raise NotImplementedError

    def local_batch(self, rows: dict) -> dict:
        """This process's numpy rows of a train batch in the layout `step` takes (default:
        unchanged). The iterator applies it; bench feeds its own batches through it."""
        return rows

    def train_iterator(self):
        """-> iterator of this process's rows of each global batch (numpy), with Grain's
        get_state / set_state (checkpointed with the state)."""
        raise NotImplementedError

    def validate_data(self) -> None:
        """Checks everything the run will read, before the first step: every split's files open
        and have the expected shapes / dtypes, and the data's vocabulary fits the model. Raises
        train.config.ConfigError (one line naming the file or key, the value and what was
        expected). Called by the trainer after the task is built. Default: nothing checked."""

    # --- evaluation ---------------------------------------------------------------------------
    def eval_due(self, step: int, data_iter) -> bool:
        """Whether to evaluate (and checkpoint) after `step`. Default: every trainer.eval_interval
        steps (0: only at the end, which the trainer always does)."""
        every = self.cfg.trainer.eval_interval
        return bool(every) and step % every == 0

    def eval_step(self, state, batch) -> dict:
        """One evaluation batch, pure and jittable: the full state and a batch in the layout of
        `batch_shapes` -> sums (float32 scalars, `count` among them) that add over batches.
        bench.ttq jits it, so a time-to-quality run is judged by the trainer's own evaluation."""
        raise NotImplementedError

    def eval_metrics(self, sums: dict) -> dict:
        """Summed `eval_step` outputs -> the metrics (host floats, no prefix)."""
        raise NotImplementedError

    def evaluate(self, state, step: int) -> dict:
        """The trainer's evaluation: -> host metrics (`eval/...` floats, or strings such as a
        GPT sample), every batch of the family's evaluation data through `eval_step`."""
        raise NotImplementedError

    def check_eval_data(self, data_dir: str, trained_on: str | None = None) -> None:
        """ConfigError (one line naming `--data`, the file and what was expected) unless
        `data_dir` is a data set this model can be evaluated on (`python -m train.evaluate`)."""
        raise NotImplementedError

    # --- weights in the original code base's format -------------------------------------------
    def import_weights(self, state, path: str):
        """`state` with the model weights of a checkpoint of the original code base (init_from)."""
        raise NotImplementedError

    def torch_checkpoint(self, state, meta: dict):
        """What `torch.save` writes for `python -m train.export` (the original's format)."""
        raise NotImplementedError

    # --- shared ---------------------------------------------------------------------------------
    def _setup(self):
        """graphdef, abstract state and state shardings, by tracing `init` (nothing allocated)."""
        key = jax.random.key(self.cfg.run.seed)
        self.graphdef, self.abstract_state = jax.eval_shape(self.init, key)
        self.state_shardings = self.state_shardings_for(self.abstract_state)

    def create_state(self):
        """The initial state, every array created directly in its shard (jit + out_shardings)."""
        key = jax.random.key(self.cfg.run.seed)
        with jax.set_mesh(self.mesh):
            _, state = jax.jit(self.init, out_shardings=(None, self.state_shardings))(key)
        return state

    def batch_sharding(self, ndim: int, batch_axis: int = 0) -> NamedSharding:
        spec = [None] * ndim
        spec[batch_axis] = mesh_lib.logical_to_mesh(self.cfg.mesh.rules, "batch")
        return NamedSharding(self.mesh, PartitionSpec(*spec))

    def abstract_batch(self, shapes: BatchShapes | None = None) -> dict:
        """ShapeDtypeStructs with their shardings (jit arguments, AOT); default the train batch."""
        return {
            k: jax.ShapeDtypeStruct(shape, dtype, sharding=self.batch_sharding(len(shape), axis))
            for k, (shape, dtype, axis) in (shapes or self.batch_shapes()).items()
        }

    def to_global(self, local: dict, shapes: BatchShapes | None = None) -> dict:
        """This process's numpy rows -> global arrays sharded over the batch axes (no process
        ever holds the whole batch). `shapes` defaults to the train batch; evaluation passes its
        own: every batch of both families, train and eval, is placed here."""
        return {
            k: jax.make_array_from_process_local_data(
                self.batch_sharding(len(shape), axis), np.asarray(local[k], dtype), shape
            )
            for k, (shape, dtype, axis) in (shapes or self.batch_shapes()).items()
        }

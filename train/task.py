"""The seam between the generic trainer and a model family: every hook the commands call.

A family is two packages (docs/architecture.md, "Adding a model family"): its model in
models/<family>/ and its wiring to the trainer in a package whose `FAMILY` is a `Family` (below),
found by name in train/families/__init__.py. The trainer (train/trainer.py, train/jit.py,
train/aot.py) calls the hooks of its `Task` and nothing else:

    cls = family(cfg.family).task              # train/families/__init__.py, by name
    cls.validate_config(cfg)                   # at compose time (train/compose.py)
    cls.check_backend(cfg, platform)           # e.g. no float64 on a TPU
    cls.needs_x64(cfg)                         # before anything is traced (process-wide switch)
    task = cls(cfg, mesh)                      # graphdef, abstract_state, state_shardings
    state = task.create_state()                # or restored onto task.state_shardings
    state, metrics = task.train_step(state, task.to_global(next(data)))    # jitted
    sums = task.eval_step(state, batch)        # jitted; summed over batches, then
    task.eval_metrics(sums)                    # -> {"loss": ...} / {"exact_accuracy": ...}
    task.evaluate(state, step)                 # the trainer's evaluation: {"eval/...": ...}

Both steps are pure functions of (state, batch) with the task's static attributes (graphdef,
config) closed over, and both take the FULL state the trainer holds. Every family has one step,
`train_step(state, batch) -> (state, metrics)`, defined once, in its model package
(models/<family>/training.py `train_step(graphdef, state, batch, **static)`); the Task binds its
graphdef and static arguments (`bind_step`), so `task.train_step` IS that function.

`init(key) -> (graphdef, state)` builds the model and optimizer and splits them (nnx.split); the
graphdef is static (a pytree without leaves), so `jax.eval_shape(task.init, key)` gives both the
graphdef and the abstract state without allocating, and `jax.jit(task.init, out_shardings=...)`
creates every array directly in its shard. From then on the state is a plain pytree of
jax.Arrays (jit-able, donatable, checkpointable) and `step` is a pure function of it.

The other commands take the rest from the Family: `python -m train.evaluate` its `Evaluation`
(options, report, table), train/source.py its `WeightsFile`s (the original code base's
checkpoints, for train.evaluate / train.sample / train.export), `python -m train.sample` its
`Sampler`. Each has a default or is optional: a family is at least a Task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec
from omegaconf import OmegaConf, open_dict

from train import mesh as mesh_lib
from train.errors import ConfigError


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


class Unsupported(ConfigError):
    """A command asked a family for a part it does not have (an optional hook of Task); one line
    naming the family and the hook."""


def no_torch_checkpoint(family: str) -> Unsupported:
    """The line of a family without Task.torch_checkpoint (`family`: its cfg.family name)."""
    return Unsupported(
        f"{family}: the family writes no checkpoint in an original code base's format (Task.torch_checkpoint)"
    )


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
    # The family's config dataclasses by section ("model", "optim", "data"), each with the fields
    # the family fills itself (from the data set or the trainer section). Their defaults are
    # registered as the config `<section>/<family>_defaults` (train/compose.py), which the
    # family's configs/<section>/*.yaml compose on: a YAML file holds only what it changes.
    config_sections: dict[str, tuple[type, tuple[str, ...]]] = {}
    # Defaults that depend on the devices a mesh preset is for (`mesh.platform`): platform ->
    # {"<section>.<field>": value}, for fields of `config_sections`. On a mesh of that platform
    # the value replaces the dataclass default of the field; a config file or the command line
    # that sets the field still wins (train/compose.py). TRM: {"tpu": {"model.loss_dtype":
    # "float32"}}, so no experiment needs a file of its own for a TPU.
    platform_defaults: dict[str, dict[str, Any]] = {}
    # The family's knobs that an older version kept in the trainer section, by their old dotted
    # name -> their place in the family's own section (train.config.FORMER_TRAINER_KEYS): an old
    # key given now is one line naming the new one, and a run directory written with it opens.
    moved_keys: dict[str, str] = {}
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
    def planned_steps(cls, cfg) -> str:
        """The optimiser steps the run's schedule takes, in words, from the config alone (and a
        data set's metadata where it is on disk): `python -m train.main --info`. Default:
        trainer.total_steps."""
        n = cfg.trainer.total_steps
        return (
            f"{n} (trainer.total_steps)" if n else "the family's schedule (trainer.total_steps=0)"
        )

    @classmethod
    def needs_x64(cls, cfg) -> bool:
        """Whether this run computes in float64 somewhere, so jax x64 must be on before the first
        trace (train.families.make_task switches it, process-wide)."""
        return False

    @classmethod
    def check_backend(cls, cfg, platform: str) -> None:
        """ConfigError (one line: the key, the value, what to set) when the run cannot run as
        asked on devices of `platform` ("cpu", "gpu", "tpu"). Default: it can."""

    # --- the model and its step ---------------------------------------------------------------
    def init(self, key) -> tuple[Any, Any]:
        """-> (graphdef, state): model + optimizer built from `key` and split (traced under jit)."""
        raise NotImplementedError

    def bind_step(self, graphdef) -> Callable:
        """The family's one step with `graphdef` and the task's static arguments bound
        (functools.partial of its model package's `train_step`): a pure `(state, batch) ->
        (state, metrics: dict of float32 scalars on device)`. Metrics named `*loss` and
        `*grad_norm` feed the non-finite guard (train/nonfinite.py)."""
        raise NotImplementedError

    @property
    def train_step(self) -> Callable:
        """One optimiser step, pure: `bind_step` of the task's graphdef as it is now (a test may
        give the task another graphdef of the same state)."""
        return self.bind_step(self.graphdef)

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
        get_state (bytes, or a Grain DatasetIterator's own) / set_state / start_prefetch, which
        Grain's checkpoint handler calls: its position is checkpointed with the state."""
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

    # --- weights in the original code base's format (optional) -----------------------------------
    def import_weights(self, state, path: str):
        """`state` with the model weights of a checkpoint of the original code base
        (`trainer.init_from`, and train.source for a family's WeightsFile). Default: Unsupported."""
        raise Unsupported(
            f"{self.cfg.family}: the family reads no checkpoint of an original code base (Task.import_weights)"
        )

    def torch_checkpoint(self, state, meta: dict):
        """What `torch.save` writes for `python -m train.export` (the original's format).
        Default: Unsupported."""
        raise no_torch_checkpoint(self.cfg.family)

    def keys_upstream_lacks(self, checkpoint) -> list[str]:
        """The keys of `torch_checkpoint`'s result that the original code base's model lacks (a
        variant without an upstream twin: docs/architecture.md), sorted; `python -m train.export`
        writes them only with --allow-extra-keys. Default: none."""
        return []

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

    def output_shardings(self, fn, abstract_state, shapes: BatchShapes):
        """The shardings of `fn(state, batch)`'s outputs (an evaluation's dict of any shape),
        derived rather than listed: a leaf whose leading axis follows the batch's rows (a per-row
        prediction) is sharded like the batch, every other leaf (a sum over the batch, a curve)
        replicated. `fn` is traced, nothing computed, at the rows of `shapes` and at twice as
        many: the leaves that double are the per-row ones, whatever their sizes."""

        def traced(times: int):
            batch = {
                k: jax.ShapeDtypeStruct(
                    tuple(n * times if i == axis else n for i, n in enumerate(shape)), dtype
                )
                for k, (shape, dtype, axis) in shapes.items()
            }
            return jax.eval_shape(fn, abstract_state, batch)

        replicated = mesh_lib.replicated(self.mesh)

        def sharding(once, twice):
            per_row = once.ndim > 0 and twice.shape[0] == 2 * once.shape[0]
            return self.batch_sharding(once.ndim) if per_row else replicated

        return jax.tree.map(sharding, traced(1), traced(2))

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


# --- what the other commands take from a family ---------------------------------------------------
class Evaluation:
    """A family's part of `python -m train.evaluate` (train/evaluate.py). This default reports the
    trainer's own evaluation of the checkpoint (Task.evaluate) as a table of its metrics."""

    needs_data = False  # True: the report reads a data set (--data, default the run's data.path)

    def add_arguments(self, parser) -> None:
        """The family's own options (on an argparse group named after the family). A long
        option's dest must be its name (--extra-steps -> extra_steps): messages name it so."""

    def convert_data(self, path: str, tmp_dir: str) -> str | None:
        """`--data` given as a file this family turns into its data layout (written under
        `tmp_dir`): -> the data set to evaluate on; None when it is no such file."""
        return None

    def report(self, src, data, *, batch=None, save_dir=None, progress=False, **options) -> dict:
        """The report's family part (JSON-able, except what `finish` removes) for the
        train.source.Source `src` on `data` (None unless needs_data). `batch`: --batch;
        `save_dir`: where files may go (--json's directory); `options`: the family's own."""
        return {"metrics": src.task.evaluate(src.state, src.step or 0)}

    def table(self, report: dict) -> list[str]:
        """The lines the command prints under its source and data lines."""
        return [f"{k:<32} {v}" for k, v in report.get("metrics", {}).items()]

    def finish(self, report: dict, options: dict) -> None:
        """What the command prints or writes after the table and before --json (TRM: --show's
        boards, --plot's figures); removes from `report` what JSON cannot hold."""


@dataclasses.dataclass
class Opened:
    """A weights file made into what train.source builds its Source from."""

    cfg: Any  # the composed and validated config of the task the weights go into
    need_data: bool = False  # the task reads its data set's sizes from cfg.data.path
    step: int | None = None  # Source.step (nanoGPT: iter_num)
    meta: dict = dataclasses.field(default_factory=dict)  # Source.meta
    trained_on: str | None = None  # the data set the weights were trained on, where known


class WeightsFile:
    """A checkpoint file of the family's original code base (train/source.py opens it for
    train.evaluate, train.sample and train.export): its config, then its weights go into a fresh
    state through Task.import_weights. Subclasses set `kind` and `description`."""

    kind = ""  # Source.kind, e.g. "nanogpt"
    description = ""  # in messages, e.g. "a nanoGPT ckpt.pt"

    def detect(self, path: str, loaded) -> bool:
        """Whether the file at `path` (`loaded`: parity.files.load_file's result) is one."""
        raise NotImplementedError

    def open(self, path: str, loaded, data: str | None, overrides: list[str]) -> Opened:
        """The config of the run it describes (its own architecture; `data`: --data; `overrides`:
        Hydra overrides). Raises train.source.SourceError naming the file or option."""
        raise NotImplementedError

    def check(self, path: str, loaded, task, data: str | None) -> None:
        """After the task is built, before the weights go in: SourceError when they cannot fit
        (default: nothing to check)."""

    def kind_of(self, loaded, task) -> str:
        """Source.kind of the file once the task is built: `kind`, or what the file is where
        its format says less (TRM: upstream's format holding keys upstream lacks)."""
        return self.kind


class Sampler:
    """A family's part of `python -m train.sample` (train/sample.py): generation from a
    checkpoint (a run directory, or one of the `kinds` of its weights files)."""

    kinds: tuple[str, ...] = ()

    def add_arguments(self, parser) -> None:
        """The command's options for this family."""

    def prepare(self, args) -> None:
        """Before any checkpoint is opened (process-wide settings, such as jax x64)."""

    def sample(self, src, args) -> list[str]:
        """The generated texts of the train.source.Source `src`."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Family:
    """A model family as the registry knows it: the `FAMILY` of its package."""

    task: type[Task]
    evaluation: Evaluation = dataclasses.field(default_factory=Evaluation)
    weights_files: tuple[WeightsFile, ...] = ()
    sampler: Sampler | None = None

"""The toy family's trainer adapter (what train/families/<family>/ holds): the Task hooks over
model.py, and its data: random inputs labelled by a fixed random projection, drawn per step from
the run's seed, so a resumed run sees the batches an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import numpy as np
from flax import nnx

from tests.toy_family.model import (
    ToyConfig,
    ToyModel,
    ToyOptimConfig,
    eval_step,
    flops_per_step,
    init_train_state,
    train_step,
)
from train.config import build_dataclass, check_fields
from train.errors import ConfigError
from train.task import Task


@dataclasses.dataclass(frozen=True)
class ToyDataConfig:
    """The `data` section: no files, only how many evaluation examples to draw."""

    eval_examples: int = 64


def toy_batch(seed: int, index: int, rows: int, config: ToyConfig) -> dict:
    """Batch `index` of the stream `seed`: x ~ N(0, 1), y = argmax of a fixed projection of x."""
    x = np.random.default_rng([seed, index]).standard_normal((rows, config.features))
    w = np.random.default_rng([12345]).standard_normal((config.features, config.classes))
    return {"x": x.astype(np.float32), "y": np.argmax(x @ w, axis=-1).astype(np.int32)}


def local_rows(batch: dict) -> dict:
    """This process's rows of a global batch (Task.to_global assembles them)."""
    n, i, p = len(batch["y"]), jax.process_index(), jax.process_count()
    return {k: v[i * n // p : (i + 1) * n // p] for k, v in batch.items()}


class RandomBatches:
    """This process's rows of each global batch, with what the trainer's checkpoint needs of an
    iterator (Grain's protocol: get_state as bytes, set_state, start_prefetch)."""

    def __init__(self, seed: int, rows: int, config: ToyConfig):
        self.seed, self.rows, self.config, self.index = seed, rows, config, 0

    def __iter__(self):
        return self

    def __next__(self):
        batch = toy_batch(self.seed, self.index, self.rows, self.config)
        self.index += 1
        return local_rows(batch)

    def get_state(self) -> bytes:
        return json.dumps({"index": self.index}).encode()

    def set_state(self, state) -> None:
        self.index = json.loads(state)["index"]

    def start_prefetch(self) -> None:  # Grain's checkpoint handler calls it after set_state
        pass


class ToyTask(Task):
    items_name = "examples"
    console_metrics = ("train/loss", "eval/accuracy")

    @classmethod
    def validate_config(cls, cfg) -> None:
        check_fields(ToyConfig, cfg.model, "model")
        check_fields(ToyOptimConfig, cfg.optim, "optim")
        check_fields(ToyDataConfig, cfg.data, "data")
        if cfg.trainer.total_steps <= 0:
            raise ConfigError("trainer.total_steps: the toy family needs it > 0")

    def __init__(self, cfg, mesh, *, need_data: bool = True):
        self.cfg, self.mesh = cfg, mesh
        self.model_cfg = build_dataclass(ToyConfig, cfg.model, "model")
        self.optim = build_dataclass(ToyOptimConfig, cfg.optim, "optim")
        self.data_cfg = build_dataclass(ToyDataConfig, cfg.data, "data")
        self.batch = int(cfg.trainer.global_batch_size)
        self.total_steps = int(cfg.trainer.total_steps)
        self.items_per_step = self.batch
        self.flops_per_step = flops_per_step(self.model_cfg, self.batch)
        self._setup()

    def batch_shapes(self, batch_size: int | None = None):
        b, f = batch_size or self.batch, self.model_cfg.features
        return {"x": ((b, f), np.float32, 0), "y": ((b,), np.int32, 0)}

    def train_iterator(self):
        return RandomBatches(self.cfg.run.seed, self.batch, self.model_cfg)

    def init(self, key):
        model = ToyModel(self.model_cfg, rngs=nnx.Rngs(params=key))
        return init_train_state(model, self.optim)

    def model(self, state):
        """(model, optimizer) of `state`: the modules, for the sampler."""
        return nnx.merge(self.graphdef, state)

    def bind_step(self, graphdef):
        """model.py's train_step: (state, batch) -> (state, {"loss", "grad_norm"})."""
        return functools.partial(train_step, graphdef)

    def eval_step(self, state, batch):
        return eval_step(self.graphdef, state, batch)

    def eval_metrics(self, sums: dict) -> dict:
        n = float(sums["count"])
        return {"loss": float(sums["loss"]) / n, "accuracy": float(sums["correct"]) / n}

    def evaluate(self, state, step: int) -> dict:
        """One batch of data.eval_examples held-out examples (stream seed + 1)."""
        n = self.data_cfg.eval_examples
        shapes = self.batch_shapes(n)
        batch = local_rows(toy_batch(self.cfg.run.seed + 1, 0, n, self.model_cfg))
        sums = jax.jit(self.eval_step)(state, self.to_global(batch, shapes))
        return {f"eval/{k}": v for k, v in self.eval_metrics(jax.device_get(sums)).items()}

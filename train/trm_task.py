"""TRM on the trainer: its config sections (`optim` = TRMOptimConfig), the puzzle data
(data.puzzle_source), the model and its step (models.trm, models/trm/train_step.py), upstream's
evaluation (+ the ARC evaluator), upstream checkpoints in and out.

Upstream pretrain.py semantics, all inside the pure `step` which the trainer jits:
one optimizer step per ACT step on a carry that persists across batches (it is part of the
trainer state, sharded with the batch over (data, fsdp), donated and checkpointed), halted slots
refilled from the new batch, SignSGD on the puzzle table then AdamATan2 on the params with
upstream's warmup/cosine schedule, EMA after every step, loss scaled by 1/global_batch_size.

Schedule: total_steps = int(epochs * total_groups * mean_puzzle_examples / global_batch)
(`models.trm.optim.total_steps`). The data runs for epochs / eval_interval_epochs ITERATIONS of
eval_interval_epochs epochs each, each dropping its last partial batch
(data.puzzle_source.PuzzleTrainDataset), and evaluation runs at the end of every iteration, as
upstream.

Eval (upstream `evaluate`): for every test batch a FRESH carry, halt_max_steps ACT steps of the EMA
model in eval mode, metrics from the last step; per-set sums divided by count.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from data.arc_eval import ARCEvaluator
from data.puzzle_format import load_metadata, load_split
from data.puzzle_source import PuzzleTestDataset, PuzzleTrainDataset
from models.state_dict import load_file
from models.trm import TRM, TRMConfig
from models.trm.losses import act_loss, normalize_metrics
from models.trm.optim import total_steps as schedule_steps
from models.trm.params import from_torch, to_torch
from models.trm.train_step import (
    TRMOptimConfig,
    ema_model,
    init_train_state,
    train_step,
)
from train import mesh as mesh_lib
from train.config import ConfigError, build_dataclass, check_fields, check_ranges
from train.flops import trm_flops_per_step
from train.task import Task, sync_processes

log = logging.getLogger(__name__)

# Trainer-owned fields of TRMOptimConfig (filled from trainer.*, not from optim.*).
_TRAINER_FIELDS = ("global_batch_size", "total_steps")


def _optim_config(cfg, total_steps: int = 1) -> TRMOptimConfig:
    """TRMOptimConfig from cfg.optim (+ batch size and schedule length from the trainer)."""
    kw = dict(cfg.optim or {})
    bad = sorted(set(kw) & set(_TRAINER_FIELDS))
    if bad:
        raise ConfigError(
            f"optim: {bad} are set by the trainer (trainer.global_batch_size, epochs)"
        )
    kw.update(global_batch_size=int(cfg.trainer.global_batch_size), total_steps=int(total_steps))
    return build_dataclass(TRMOptimConfig, kw, "optim")


@dataclasses.dataclass
class TRMDataConfig:
    """The `data` section of a puzzle data set (configs/data/sudoku.yaml, maze, arc1, arc2)."""

    path: str = ""  # upstream's layout: train/ and test/ with dataset.json and .npy arrays
    build: str | None = None  # a data module (data.sudoku_easy, ...) run when `path` is empty
    build_args: list = dataclasses.field(default_factory=list)  # its command-line arguments
    eval_interval_epochs: int = 0  # upstream eval_interval: epochs per iteration (0: epochs)
    eval_batch_size: int = 0  # 0: trainer.global_batch_size
    evaluator: str = ""  # "" or arc (data.arc_eval)
    # Sizes used only when the data set is not on disk (AOT); dataset.json wins.
    seq_len: int = 81
    vocab_size: int = 11
    num_puzzle_identifiers: int = 1
    total_groups: int = 1000
    mean_puzzle_examples: float = 1.0


# Values that make no sense (train.config.check_ranges).
_DATA_RANGES = {
    "eval_interval_epochs": ">=0",
    "eval_batch_size": ">=0",
    "seq_len": ">0",
    "vocab_size": ">0",
    "num_puzzle_identifiers": ">0",
    "total_groups": ">0",
    "mean_puzzle_examples": ">0",
}
_MODEL_RANGES = {
    k: ">0"
    for k in ("hidden_size", "num_heads", "expansion", "H_cycles", "L_cycles", "halt_max_steps")
} | {"L_layers": ">=0", "H_layers": ">=0", "puzzle_emb_ndim": ">=0", "puzzle_emb_len": ">=0"}
_OPTIM_RANGES = {
    "lr": ">0",
    "lr_min_ratio": "[0,1]",
    "lr_warmup_steps": ">=0",
    "weight_decay": ">=0",
    "beta1": "[0,1)",
    "beta2": "[0,1)",
    "puzzle_emb_lr": ">=0",
    "puzzle_emb_weight_decay": ">=0",
    "ema_rate": "[0,1]",
}


class TRMTask(Task):
    items_name = "examples"

    @classmethod
    def validate_config(cls, cfg) -> None:
        check_fields(TRMDataConfig, cfg.data, "data")
        check_ranges(cfg.data, "data", _DATA_RANGES)
        check_fields(TRMConfig, cfg.model, "model")
        check_ranges(cfg.model, "model", _MODEL_RANGES)
        check_ranges(cfg.optim, "optim", _OPTIM_RANGES)
        if cfg.data.get("evaluator", "") not in ("", "arc"):
            raise ConfigError(f"data.evaluator={cfg.data.evaluator!r}: expected '' or 'arc'")
        _optim_config(cfg)
        if cfg.trainer.total_steps == 0 and cfg.trainer.epochs == 0:
            raise ConfigError("trainer: TRM needs trainer.epochs (or trainer.total_steps) > 0")

    @classmethod
    def needs_x64(cls, cfg) -> bool:
        """Upstream's float64 stablemax loss (optim.loss_dtype, default float64) needs jax x64;
        every other TRM dtype is set explicitly."""
        return cfg.optim.get("loss_dtype", "float64") == "float64"

    def __init__(self, cfg, mesh, *, need_data: bool = True):
        self.cfg, self.mesh = cfg, mesh
        d = dict(cfg.data)
        self.data_dir = d.get("path", "")
        t = cfg.trainer
        self.batch = int(t.global_batch_size)
        meta = self._prepare_data(d) if need_data else None
        if meta is None:  # AOT / config checks without data: sizes from the config
            meta = _Meta(
                seq_len=int(d.get("seq_len", 81)),
                vocab_size=int(d.get("vocab_size", 11)),
                num_puzzle_identifiers=int(d.get("num_puzzle_identifiers", 1)),
                total_groups=int(d.get("total_groups", 1000)),
                mean_puzzle_examples=float(d.get("mean_puzzle_examples", 1.0)),
            )
        self.meta = meta
        model_kw = dict(cfg.model)
        model_kw.update(
            batch_size=self.batch,
            seq_len=meta.seq_len,
            vocab_size=meta.vocab_size,
            num_puzzle_identifiers=meta.num_puzzle_identifiers,
        )
        self.model_cfg = build_dataclass(TRMConfig, model_kw, "model")
        self.epochs = int(t.epochs)
        self.eval_epochs = int(d.get("eval_interval_epochs", 0)) or self.epochs
        if self.epochs and self.epochs % self.eval_epochs:
            raise ConfigError(
                f"data.eval_interval_epochs={self.eval_epochs} must divide trainer.epochs={self.epochs} (as upstream)"
            )
        self.total_steps = int(t.total_steps) or schedule_steps(
            self.epochs, meta.total_groups, meta.mean_puzzle_examples, self.batch
        )
        self._check_batch_fits(meta)
        self.optim = _optim_config(cfg, self.total_steps)
        if self.optim.loss_dtype == "float64" and not jax.config.jax_enable_x64:
            raise ValueError(
                "optim.loss_dtype=float64 (upstream's stablemax dtype) needs jax x64; the trainer "
                "enables it (train.step.enable_x64_if_needed), or set optim.loss_dtype=float32"
            )
        self.items_per_step = self.batch
        self.flops_per_step = trm_flops_per_step(self.model_cfg, self.batch)
        self._train_ds = None  # the PuzzleTrainDataset of train_iterator (eval_due reads it)
        self._eval_fn = None
        self._arc = None  # one ARCEvaluator per run: its votes accumulate over evaluations
        self._setup()

    # --- data -------------------------------------------------------------------------------
    def _check_batch_fits(self, meta) -> None:
        """ConfigError when the batch is larger than the data: upstream's step count rounds down
        to 0, or an iteration (eval_interval_epochs epochs) holds less than one batch, so the
        run would end without a step."""
        per_epoch = meta.total_groups * meta.mean_puzzle_examples  # one example drawn per group
        where = (
            f"data.path={self.data_dir!r}: {per_epoch:g} examples per epoch "
            f"({meta.total_groups} groups x {meta.mean_puzzle_examples:g})"
        )
        if self.total_steps <= 0:
            raise ConfigError(
                f"trainer.global_batch_size={self.batch} is larger than the data set: "
                f"trainer.epochs={self.epochs} x {where} gives 0 steps; lower the batch or "
                "raise trainer.epochs"
            )
        if self.epochs and self.eval_epochs * per_epoch < self.batch:
            raise ConfigError(
                f"trainer.global_batch_size={self.batch} is larger than one iteration of the "
                f"data set: data.eval_interval_epochs={self.eval_epochs} x {where} holds no "
                "full batch; lower the batch or raise data.eval_interval_epochs"
            )

    def _prepare_data(self, d: dict):
        path = self.data_dir
        if not path:
            raise ConfigError(
                "data.path: a puzzle data set directory (upstream layout) is required"
            )
        if not os.path.exists(os.path.join(path, "train", "dataset.json")):
            builder, args = d.get("build"), list(d.get("build_args") or [])
            if not builder:
                raise ConfigError(
                    f"data.path={path!r} has no train/dataset.json; build it first "
                    "(python -m data.sudoku / data.maze / data.arc, see configs/data/)"
                )
            if jax.process_index() == 0:
                log.info("building %s into %s: %s", builder, path, args)
                module = builder if "." in builder else f"data.{builder}"
                importlib.import_module(module).main(args + ["--output-dir", path])
            sync_processes("trm_data_built")
        return load_metadata(path, "train")

    def validate_data(self) -> None:
        """Both splits (train, and test when a test/ directory exists) load through
        data.puzzle_format.load_split (metadata, every array file, shapes, dtypes, token range);
        the test split's seq_len, vocab and puzzle identifiers must fit the model (built from
        the train metadata); data.eval_batch_size must divide over the batch devices, like the
        train batch (else the first evaluation fails with JAX's sharding error)."""
        eval_batch = {"data.eval_batch_size": int(self.cfg.data.get("eval_batch_size", 0) or 0)}
        mesh_lib.check_batch_divisible(self.mesh, self.cfg.mesh.rules, eval_batch)
        for split in ("train", "test"):
            if split == "test" and not os.path.isdir(os.path.join(self.data_dir, split)):
                continue  # no test split: evaluation is skipped (as before)
            try:
                meta = load_split(self.data_dir, split, mmap=True).metadata
            except (OSError, ValueError) as e:  # PuzzleFormatError is a ValueError
                raise ConfigError(f"data.path: {split} split: {e}") from e
            m, where = self.model_cfg, os.path.join(self.data_dir, split, "dataset.json")
            for key, have, limit in (
                ("seq_len", meta.seq_len, m.seq_len),
                ("vocab_size", meta.vocab_size, m.vocab_size),
                ("num_puzzle_identifiers", meta.num_puzzle_identifiers, m.num_puzzle_identifiers),
            ):
                bad = have != limit if key == "seq_len" else have > limit
                if bad:
                    raise ConfigError(
                        f"data.path: {where}: {key}={have}, but the model (from the train split) "
                        f"has {key}={limit}"
                    )

    def batch_shapes(self):
        L = self.meta.seq_len
        return {
            "inputs": ((self.batch, L), np.int32, 0),
            "labels": ((self.batch, L), np.int32, 0),
            "puzzle_identifiers": ((self.batch,), np.int32, 0),
        }

    def train_iterator(self):
        self._train_ds = PuzzleTrainDataset(
            self.data_dir,
            global_batch_size=self.batch,
            seed=self.cfg.run.seed,
            epochs_per_iter=self.eval_epochs,
            num_iterations=self.epochs // self.eval_epochs if self.epochs else None,
        )
        return iter(self._train_ds)

    def eval_due(self, step: int, data_iter) -> bool:
        """True when the batch just consumed was the last of an upstream iteration."""
        state = data_iter.get_state()
        return state["batch"] >= self._train_ds.num_batches(state["iteration"])

    # --- model + step -----------------------------------------------------------------------
    def init(self, key):
        k_params, k_explore = jax.random.split(key)
        model = TRM(self.model_cfg, rngs=nnx.Rngs(params=k_params, exploration=k_explore))
        model.train()
        graphdef, train_state = init_train_state(model, self.optim)
        zeros = {k: jnp.zeros(s, dt) for k, (s, dt, _) in self.batch_shapes().items()}
        # Raw uint32 key data (not a typed key): plain to shard, donate and checkpoint.
        rng = jax.random.key_data(jax.random.fold_in(key, 1))
        return graphdef, {"train": train_state, "carry": model.initial_carry(zeros), "rng": rng}

    def state_shardings_for(self, abstract_state):
        """Params / optimizer / EMA / table by the param rule; the carry like the batch."""
        mode = self.cfg.mesh.param_sharding
        return {
            "train": mesh_lib.tree_shardings(abstract_state["train"], self.mesh, mode),
            "carry": mesh_lib.carry_shardings(
                abstract_state["carry"], self.mesh, self.cfg.mesh.rules, self.batch
            ),
            "rng": mesh_lib.replicated(self.mesh),
        }

    def step(self, graphdef, state, batch):
        # Halting-exploration draws (upstream: torch rand_like / randint_like per row) come from
        # the trainer's key, passed explicitly: one global [B] draw per step, so the run does not
        # depend on the device count, and the key is checkpointed with the state.
        key, k_u, k_min = jax.random.split(jax.random.wrap_key_data(state["rng"]), 3)
        b, n = self.batch, self.model_cfg.halt_max_steps
        exploration = (
            jax.random.uniform(k_u, (b,), jnp.float32),
            jax.random.randint(k_min, (b,), 2, n + 1, jnp.int32),
        )
        train_state, carry, sums = train_step(
            graphdef,
            state["train"],
            state["carry"],
            batch,
            config=self.optim,
            exploration=exploration,
        )
        metrics = _float32(normalize_metrics(sums, mode="train", global_batch_size=self.batch))
        new_state = {"train": train_state, "carry": carry, "rng": jax.random.key_data(key)}
        return new_state, metrics

    # --- eval -------------------------------------------------------------------------------
    def eval_step(self, train_state, batch):
        """Fresh carry, halt_max_steps ACT steps of the EMA model, metrics of the last step."""
        model = ema_model(self.graphdef, train_state)
        carry = model.initial_carry(batch)
        n = self.model_cfg.halt_max_steps
        carry = jax.lax.fori_loop(0, n - 1, lambda i, c: model(c, batch)[0], carry)
        carry, outputs = model(carry, batch)
        _, sums = act_loss(
            carry, outputs, loss_type=self.optim.loss_type, loss_dtype=self.optim.loss_dtype
        )
        preds = jnp.argmax(outputs["logits"], axis=-1).astype(jnp.int32)
        return _float32(sums), preds, outputs["q_halt_logits"].astype(jnp.float32)

    def _eval_dataset(self):
        if not os.path.exists(os.path.join(self.data_dir, "test", "dataset.json")):
            return None
        eval_batch = int(self.cfg.data.get("eval_batch_size", 0) or self.batch)
        return PuzzleTestDataset(self.data_dir, global_batch_size=eval_batch)

    def evaluate(self, state, step: int) -> dict:
        ds = self._eval_dataset()
        if ds is None:
            log.warning("NO EVAL DATA FOUND in %s/test", self.data_dir)
            return {}
        g, L = ds.global_batch_size, self.meta.seq_len
        shapes = {
            "inputs": ((g, L), np.int32, 0),
            "labels": ((g, L), np.int32, 0),
            "puzzle_identifiers": ((g,), np.int32, 0),
        }
        if self._eval_fn is None:
            batch_sh = {k: v.sharding for k, v in self.abstract_batch(shapes).items()}
            out_sh = (mesh_lib.replicated(self.mesh), batch_sh["inputs"], self.batch_sharding(1))
            self._eval_fn = jax.jit(
                self.eval_step,
                in_shardings=(self.state_shardings["train"], batch_sh),
                out_shardings=out_sh,
            )
        total, evaluator = None, self._evaluator()
        for local in ds:
            sums, preds, q_halt = self._eval_fn(state["train"], self.to_global(local, shapes))
            total = sums if total is None else jax.tree.map(jnp.add, total, sums)
            if evaluator is not None:
                rows = {"preds": _local_rows(preds), "q_halt_logits": _local_rows(q_halt)}
                evaluator.update_batch(local, rows)
        sums = {k: float(v) for k, v in jax.device_get(total).items()}  # host float64 from here
        out = {f"eval/all/{k}": v for k, v in normalize_metrics(sums, mode="eval").items()}
        if evaluator is not None:
            out.update(self._arc_result(evaluator, step))
        return out

    def _evaluator(self):
        """data.arc_eval.ARCEvaluator when configured (data.evaluator: arc). One instance per
        run: with upstream's aggregated voting its votes accumulate over every evaluation."""
        name = self.cfg.data.get("evaluator", "")
        if not name:
            return None
        if name != "arc":
            raise ValueError(f"data.evaluator={name!r}: only 'arc' is known")
        if self._arc is None:
            self._arc = ARCEvaluator(self.data_dir)
        self._arc.begin_eval()
        return self._arc

    def _arc_result(self, evaluator, step: int) -> dict:
        """The ARC evaluator's pass@k (collective: every process calls it; {} off process 0)."""
        save = os.path.join(self.cfg.run.out_dir, self.cfg.run.name, f"arc_step_{step}")
        if "://" in save:  # data.arc_eval writes with plain file calls: keep it local
            home = os.path.expanduser("~")
            save = os.path.join(
                home, ".cache", "trm-jax-arc", self.cfg.run.name, f"arc_step_{step}"
            )
            log.info("ARC submission for a %s run dir goes to %s", self.cfg.run.out_dir, save)
        arc = evaluator.result(save)  # None off process 0
        return {f"eval/{k}": float(v) for k, v in (arc or {}).items()}

    # --- import / export --------------------------------------------------------------------
    def import_weights(self, state, path: str):
        """An upstream TRM checkpoint (torch state_dict, `_orig_mod.` keys ok) -> params/table/
        buffers; optimizer and EMA restart from the imported params (upstream's load_checkpoint)."""
        src = from_torch(load_file(path), self.model_cfg)
        src.train()
        _, train_state = init_train_state(src, self.optim)
        new = {**jax.device_get(state), "train": train_state}
        return jax.device_put(new, self.state_shardings)

    def torch_checkpoint(self, state, meta: dict) -> dict:
        """The state_dict upstream saves: the evaluated model (EMA params when enabled)."""
        return to_torch(ema_model(self.graphdef, jax.device_get(state["train"])))


@dataclasses.dataclass
class _Meta:
    seq_len: int
    vocab_size: int
    num_puzzle_identifiers: int
    total_groups: int
    mean_puzzle_examples: float


def _float32(metrics: dict) -> dict:
    # float32 scalars whatever the loss dtype (float64 with upstream's stablemax)
    return {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}


def _local_rows(x):
    """This process's rows of a batch-sharded global array, in order (for host-side evaluators)."""
    shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
    seen, rows = set(), []
    for s in shards:
        start = s.index[0].start or 0
        if start not in seen:
            seen.add(start)
            rows.append(np.asarray(s.data))
    return np.concatenate(rows)

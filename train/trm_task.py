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
import functools
import importlib
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from data.arc_eval import ARCEvaluator
from data.puzzle_format import load_metadata, load_split
from data.puzzle_source import PuzzleTestDataset, PuzzleTrainDataset
from models.state_dict import load_file
from models.trm import TRM, TRMConfig
from models.trm.losses import IGNORE_LABEL_ID, act_loss, normalize_metrics
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
                "enables it (train.families.enable_x64_if_needed), or set optim.loss_dtype=float32"
            )
        self.items_per_step = self.batch
        self.flops_per_step = trm_flops_per_step(self.model_cfg, self.batch)
        self._train_ds = None  # the PuzzleTrainDataset of train_iterator (eval_due reads it)
        self._eval_fns = {}  # (eval batch, extra steps, halt) -> jitted eval_rollout
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
        out = self.eval_rollout(train_state, batch)
        return out["sums"], out["preds"], out["q_halt_logits"]

    def eval_rollout(self, train_state, batch, *, extra_steps: int = 0, halt: bool = False,
                     trace: bool = False):  # fmt: skip
        """One evaluation batch, pure and jittable: a FRESH carry, then halt_max_steps +
        `extra_steps` ACT steps of the EMA model in eval mode (upstream: halt_max_steps, no
        halting), metrics (`act_loss` sums) of the last step. Also returns `per_step` sums
        (`exact_accuracy`, `accuracy` of every labelled row after each ACT step; the last entry
        is the reported one), and with `trace` the predictions of every step ([S, B, L]).

        `halt`: the Q head halts a row at its first step where `halting_rule` fires (as in
        training, without exploration), or at the last step; the row's logits and q from that
        step are the ones scored, and `steps` counts its steps (upstream never halts in eval)."""
        model = ema_model(self.graphdef, train_state)
        total = self.model_cfg.halt_max_steps + int(extra_steps)
        if extra_steps:  # the wrapper halts every row at halt_max_steps: move that point
            model.config = dataclasses.replace(model.config, halt_max_steps=total)
        labels_bl = batch["labels"]
        mask_bl = labels_bl != IGNORE_LABEL_ID
        counts_b = jnp.sum(mask_bl, axis=-1)

        def step_sums(outputs):
            return _step_sums(outputs["logits"], labels_bl, mask_bl, counts_b)

        def freeze(frozen, outputs, steps_b, last):
            return _freeze(model, frozen, outputs, steps_b, last)

        carry = model.initial_carry(batch)
        frozen = None
        if halt:
            shapes = jax.eval_shape(lambda c: model(c, batch)[1], carry)
            frozen = {k: jnp.zeros(shapes[k].shape, shapes[k].dtype) for k in _HALT_KEYS}
            frozen.update(steps=carry.steps, done=jnp.zeros_like(carry.halted))

        def body(state, _):
            carry, frozen = state
            carry, outputs = model(carry, batch)
            if halt:
                frozen = freeze(frozen, outputs, carry.steps, False)
            sums, preds_bl = step_sums(outputs)
            return (carry, frozen), (sums, _trace(model, outputs, preds_bl) if trace else None)

        (carry, frozen), (early, early_trace) = jax.lax.scan(
            body, (carry, frozen), None, length=total - 1
        )
        carry, outputs = model(carry, batch)
        outputs_last = outputs
        last_sums, preds_bl = step_sums(outputs)
        if halt:
            frozen = freeze(frozen, outputs, carry.steps, True)
            carry = carry.replace(steps=frozen["steps"])
            outputs = {**outputs, **{k: frozen[k] for k in _HALT_KEYS}}
        _, sums = act_loss(
            carry, outputs, loss_type=self.optim.loss_type, loss_dtype=self.optim.loss_dtype
        )
        if not halt:  # the last step's entry IS the reported metric (same sums, by construction)
            last_sums = {k: sums[k] for k in last_sums}
        per_step = {
            k: jnp.concatenate(
                [early[k].astype(jnp.float32), last_sums[k][None].astype(jnp.float32)]
            )
            for k in last_sums
        }
        result = {
            "sums": _float32(sums),
            "per_step": per_step,
            "preds": jnp.argmax(outputs["logits"], axis=-1).astype(jnp.int32),
            "q_halt_logits": outputs["q_halt_logits"].astype(jnp.float32),
        }
        if trace:  # [S, B, ...]: the predictions and the Q head's halting decision of every step
            last = _trace(model, outputs_last, preds_bl)
            for k, v in last.items():
                result[k] = jnp.concatenate([early_trace[k], v[None]])
        return result

    def _eval_dataset(self, data_dir: str | None = None, batch_size: int | None = None):
        data_dir = data_dir or self.data_dir
        if not os.path.exists(os.path.join(data_dir, "test", "dataset.json")):
            return None
        eval_batch = batch_size or int(self.cfg.data.get("eval_batch_size", 0) or self.batch)
        return PuzzleTestDataset(data_dir, global_batch_size=eval_batch)

    def evaluate(self, state, step: int) -> dict:
        res = self.run_eval(state, evaluator=self._evaluator())
        if res is None:
            log.warning("NO EVAL DATA FOUND in %s/test", self.data_dir)
            return {}
        out = {f"eval/all/{k}": v for k, v in res["metrics"].items()}
        if res["evaluator"] is not None:
            out.update(self._arc_result(res["evaluator"], step))
        return out

    def run_eval(self, state, *, data_dir: str | None = None, batch_size: int | None = None,
                 extra_steps: int = 0, halt: bool = False, evaluator=None,
                 progress: bool = False) -> dict | None:  # fmt: skip
        """The evaluation loop the trainer runs (`evaluate`) and `python -m train.evaluate`
        runs: every test batch of `data_dir` (default data.path) through the jitted, sharded
        `eval_rollout`, summed on device, normalised as upstream (`normalize_metrics`, eval).
        -> {"metrics", "per_step": {"exact_accuracy": [...], "accuracy": [...]}, "count",
        "evaluator"} (None without a test split). `evaluator` (ARCEvaluator) gets every batch's
        predictions and q_halt logits."""
        ds = self._eval_dataset(data_dir, batch_size)
        if ds is None:
            return None
        g, L = ds.global_batch_size, self.meta.seq_len
        shapes = {
            "inputs": ((g, L), np.int32, 0),
            "labels": ((g, L), np.int32, 0),
            "puzzle_identifiers": ((g,), np.int32, 0),
        }
        fn = self._eval_fn_for(shapes, int(extra_steps), bool(halt))
        total, per_step = None, None
        for local in tqdm(ds, desc="evaluate", unit="batch", disable=not progress):
            out = fn(state["train"], self.to_global(local, shapes))
            total = out["sums"] if total is None else jax.tree.map(jnp.add, total, out["sums"])
            steps = out["per_step"]
            per_step = steps if per_step is None else jax.tree.map(jnp.add, per_step, steps)
            if evaluator is not None:
                rows = {
                    "preds": _local_rows(out["preds"]),
                    "q_halt_logits": _local_rows(out["q_halt_logits"]),
                }
                evaluator.update_batch(local, rows)
        sums = {k: float(v) for k, v in jax.device_get(total).items()}  # host float64 from here
        count = sums["count"]
        per_step = {k: [float(x) / count for x in v] for k, v in jax.device_get(per_step).items()}
        metrics = normalize_metrics(sums, mode="eval")
        return {"metrics": metrics, "per_step": per_step, "count": count, "evaluator": evaluator}

    def _eval_fn_for(self, shapes, extra_steps: int, halt: bool):
        """The jitted eval_rollout for these batch shapes and options (one compile each)."""
        key = (shapes["inputs"][0], extra_steps, halt)
        if key not in self._eval_fns:
            batch_sh = {k: v.sharding for k, v in self.abstract_batch(shapes).items()}
            rows = batch_sh["inputs"]
            out_sh = {
                "sums": mesh_lib.replicated(self.mesh),
                "per_step": mesh_lib.replicated(self.mesh),
                "preds": rows,
                "q_halt_logits": self.batch_sharding(1),
            }
            fn = functools.partial(self.eval_rollout, extra_steps=extra_steps, halt=halt)
            self._eval_fns[key] = jax.jit(
                fn, in_shardings=(self.state_shardings["train"], batch_sh), out_shardings=out_sh
            )
        return self._eval_fns[key]

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


# What --halt freezes per row at its halting step (eval_rollout)
_HALT_KEYS = ("logits", "q_halt_logits", "q_continue_logits")


@dataclasses.dataclass
class _Meta:
    seq_len: int
    vocab_size: int
    num_puzzle_identifiers: int
    total_groups: int
    mean_puzzle_examples: float


def _step_sums(logits_blv, labels_bl, mask_bl, counts_b):
    """Sums over the labelled rows of one ACT step's predictions (exact, token accuracy)."""
    preds_bl = jnp.argmax(logits_blv, axis=-1).astype(jnp.int32)
    correct_bl = mask_bl & (preds_bl == labels_bl)
    valid_b = counts_b > 0
    frac_b = jnp.sum(correct_bl.astype(jnp.float32) / jnp.maximum(counts_b, 1)[:, None], -1)
    sums = {
        "exact_accuracy": jnp.sum(valid_b & (jnp.sum(correct_bl, -1) == counts_b)),
        "accuracy": jnp.sum(jnp.where(valid_b, frac_b, 0)),
    }
    return sums, preds_bl


def _freeze(model, frozen: dict, outputs: dict, steps_b, last: bool) -> dict:
    """--halt: rows whose Q head halts now (or every row still running at the last step) keep
    this step's logits, q and step count."""
    rule_b = model.halting_rule(outputs["q_halt_logits"], outputs["q_continue_logits"])
    now_b = ~frozen["done"] & (rule_b | last)

    def pick(new, old):
        return jnp.where(now_b.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)

    kept = {k: pick(outputs[k], frozen[k]) for k in _HALT_KEYS}
    return {**kept, "steps": pick(steps_b, frozen["steps"]), "done": frozen["done"] | now_b}


def _trace(model, outputs, preds_bl) -> dict:
    halts_b = model.halting_rule(outputs["q_halt_logits"], outputs["q_continue_logits"])
    return {"step_preds": preds_bl, "step_halts": halts_b}


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

"""TRM on the trainer: the model (models.trm), its step (models/trm/train_step.py), the puzzle
data (data.puzzle_source).

Upstream pretrain.py semantics, all inside the pure `train_step` which this task jits:
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
from jax.sharding import NamedSharding, PartitionSpec

from train import mesh as mesh_lib
from train.config import build_dataclass
from train.task import Task

log = logging.getLogger(__name__)

# Trainer-owned fields of TRMOptimConfig (filled from trainer.*, not from optim.*).
_TRAINER_FIELDS = ("global_batch_size", "total_steps")


def needs_x64(cfg) -> bool:
    """True for a TRM run with upstream's float64 stablemax loss (optim.loss_dtype, default
    float64): that needs jax x64; every other TRM dtype is set explicitly."""
    return cfg.task == "trm" and cfg.optim.get("loss_dtype", "float64") == "float64"


def enable_x64_if_needed(cfg) -> bool:
    """Turns jax x64 on when `needs_x64(cfg)`. Process-wide, so call it before building the task
    (train.trainer.train, train.aot and train.export do). Returns whether it did."""
    if needs_x64(cfg):
        jax.config.update("jax_enable_x64", True)
        return True
    return False


def optim_config(cfg, total_steps: int = 1):
    """models.trm.train_step.TRMOptimConfig from cfg.optim (+ batch size and schedule length from the trainer)."""
    from models.trm.train_step import TRMOptimConfig

    kw = dict(cfg.optim or {})
    bad = sorted(set(kw) & set(_TRAINER_FIELDS))
    if bad:
        raise ValueError(f"optim: {bad} are set by the trainer (trainer.global_batch_size, epochs)")
    kw.update(global_batch_size=int(cfg.trainer.global_batch_size), total_steps=int(total_steps))
    return build_dataclass(TRMOptimConfig, kw, "optim")


class TRMTask(Task):
    items_name = "examples"

    def __init__(self, cfg, mesh, *, need_data: bool = True):
        from models.trm import TRMConfig
        from models.trm.optim import total_steps

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
            raise ValueError(
                f"data.eval_interval_epochs={self.eval_epochs} must divide trainer.epochs={self.epochs} (as upstream)"
            )
        self.total_steps = int(t.total_steps) or total_steps(
            self.epochs, meta.total_groups, meta.mean_puzzle_examples, self.batch
        )
        self.optim = optim_config(cfg, self.total_steps)
        if self.optim.loss_dtype == "float64" and not jax.config.jax_enable_x64:
            raise ValueError(
                "optim.loss_dtype=float64 (upstream's stablemax dtype) needs jax x64; the trainer "
                "enables it for TRM runs (train.trm_task.enable_x64_if_needed), or set optim.loss_dtype=float32"
            )
        self.items_per_step = self.batch
        from train.flops import trm_flops_per_step

        self.flops_per_step = trm_flops_per_step(self.model_cfg, self.batch)
        self._eval_fn = None
        self._setup()

    # --- data -------------------------------------------------------------------------------
    def _prepare_data(self, d: dict):
        from data.puzzle_format import load_metadata

        path = self.data_dir
        if not path:
            raise ValueError("data.path: a puzzle data set directory (upstream layout) is required")
        if not os.path.exists(os.path.join(path, "train", "dataset.json")):
            builder, args = d.get("build"), list(d.get("build_args") or [])
            if not builder:
                raise FileNotFoundError(
                    f"data.path={path!r} has no train/dataset.json; build it first "
                    "(python -m data.sudoku / data.maze / data.arc, see configs/data/)"
                )
            if jax.process_index() == 0:
                log.info("building %s into %s: %s", builder, path, args)
                module = builder if "." in builder else f"data.{builder}"
                importlib.import_module(module).main(args + ["--output-dir", path])
            _barrier("trm_data_built")
        return load_metadata(path, "train")

    def local_batch_shapes(self):
        L = self.meta.seq_len
        return {
            "inputs": ((self.batch, L), np.int32, 0),
            "labels": ((self.batch, L), np.int32, 0),
            "puzzle_identifiers": ((self.batch,), np.int32, 0),
        }

    def train_iterator(self):
        from data.puzzle_source import PuzzleTrainDataset

        ds = PuzzleTrainDataset(
            self.data_dir,
            global_batch_size=self.batch,
            seed=self.cfg.run.seed,
            epochs_per_iter=self.eval_epochs,
            num_iterations=self.epochs // self.eval_epochs if self.epochs else None,
        )
        self._train_ds = ds
        return iter(ds)

    def eval_due(self, data_iter) -> bool:
        """True when the batch just consumed was the last of an upstream iteration."""
        state = data_iter.get_state()
        return state["batch"] >= self._train_ds.num_batches(state["iteration"])

    # --- model + step -----------------------------------------------------------------------
    def build_model(self, key):
        from flax import nnx

        from models.trm import TRM

        k_params, k_explore = jax.random.split(key)
        return TRM(self.model_cfg, rngs=nnx.Rngs(params=k_params, exploration=k_explore))

    def init_state(self, key):
        from models.trm.train_step import init_train_state

        model = self.build_model(key)
        model.train()
        self.graphdef, train_state = init_train_state(model, self.optim)
        zeros = {k: jnp.zeros(s, dt) for k, (s, dt, _) in self.local_batch_shapes().items()}
        # Raw uint32 key data (not a typed key): plain to shard, donate and checkpoint.
        rng = jax.random.key_data(jax.random.fold_in(key, 1))
        return {"train": train_state, "carry": model.initial_carry(zeros), "rng": rng}

    def shardings_for(self, abstract_state, mode):
        """Params / optimizer / EMA / table by the param rule; the carry like the batch."""
        return {
            "train": mesh_lib.tree_shardings(abstract_state["train"], self.mesh, mode),
            "carry": mesh_lib.carry_shardings(
                abstract_state["carry"], self.mesh, self.cfg.mesh.rules, self.batch
            ),
            "rng": mesh_lib.replicated(self.mesh),
        }

    def train_step(self, state, batch):
        from models.trm.train_step import normalize_train_metrics, train_step

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
            self.graphdef,
            state["train"],
            state["carry"],
            batch,
            config=self.optim,
            exploration=exploration,
        )
        metrics = normalize_train_metrics(sums, self.batch)
        metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
        new_state = {"train": train_state, "carry": carry, "rng": jax.random.key_data(key)}
        return new_state, metrics

    # --- eval -------------------------------------------------------------------------------
    def _eval_batch(self, train_state, batch):
        """Fresh carry, halt_max_steps ACT steps of the EMA model, metrics of the last step."""
        from models.trm import act_loss
        from models.trm.train_step import ema_model

        model = ema_model(self.graphdef, train_state)
        data = {k: batch[k] for k in ("inputs", "labels", "puzzle_identifiers")}
        carry = model.initial_carry(data)
        n = self.model_cfg.halt_max_steps
        carry = jax.lax.fori_loop(0, n - 1, lambda i, c: model(c, data)[0], carry)
        carry, outputs = model(carry, data)
        _, sums = act_loss(
            carry, outputs, loss_type=self.optim.loss_type, loss_dtype=self.optim.loss_dtype
        )
        preds = jnp.argmax(outputs["logits"], axis=-1).astype(jnp.int32)
        return (
            {k: jnp.asarray(v, jnp.float32) for k, v in sums.items()},
            preds,
            outputs["q_halt_logits"].astype(jnp.float32),
        )

    def eval_dataset(self):
        from data.puzzle_source import PuzzleTestDataset

        if not os.path.exists(os.path.join(self.data_dir, "test", "dataset.json")):
            return None
        eval_batch = int(self.cfg.data.get("eval_batch_size", 0) or self.batch)
        return PuzzleTestDataset(self.data_dir, global_batch_size=eval_batch)

    def evaluate(self, state, step: int) -> dict:
        ds = self.eval_dataset()
        if ds is None:
            log.warning("NO EVAL DATA FOUND in %s/test", self.data_dir)
            return {}
        if self._eval_fn is None:
            row = NamedSharding(self.mesh, mesh_lib.batch_spec(self.cfg.mesh.rules, 1))
            grid = NamedSharding(self.mesh, mesh_lib.batch_spec(self.cfg.mesh.rules, 2))
            batch_sh = {"inputs": grid, "labels": grid, "puzzle_identifiers": row, "mask": row}
            self._eval_fn = jax.jit(
                self._eval_batch,
                in_shardings=(self.state_shardings["train"], batch_sh),
                out_shardings=(NamedSharding(self.mesh, PartitionSpec()), grid, row),
            )
        total, evaluator = None, self._evaluator()
        g = ds.global_batch_size
        for local in ds:
            batch = {
                k: jax.make_array_from_process_local_data(
                    NamedSharding(self.mesh, mesh_lib.batch_spec(self.cfg.mesh.rules, v.ndim)),
                    np.asarray(v, np.int32),
                    (g,) + v.shape[1:],
                )
                for k, v in local.items()
            }
            sums, preds, q_halt = self._eval_fn(state["train"], batch)
            total = sums if total is None else jax.tree.map(jnp.add, total, sums)
            if evaluator is not None:
                rows = {"preds": _local_rows(preds), "q_halt_logits": _local_rows(q_halt)}
                evaluator.update_batch(local, rows)
        total = jax.device_get(total)
        count = max(float(total["count"]), 1.0)
        out = {f"eval/all/{k}": float(v) / count for k, v in total.items() if k != "count"}
        out["eval/all/count"] = float(total["count"])
        if evaluator is not None:
            save = os.path.join(self.cfg.run.out_dir, self.cfg.run.name, f"arc_step_{step}")
            if "://" in save:  # data.arc_eval writes with plain file calls: keep it local
                home = os.path.expanduser("~")
                save = os.path.join(
                    home, ".cache", "trm-jax-arc", self.cfg.run.name, f"arc_step_{step}"
                )
                log.info("ARC submission for a %s run dir goes to %s", self.cfg.run.out_dir, save)
            arc = evaluator.result(save)  # collective: every process calls it; None off process 0
            out.update({f"eval/{k}": float(v) for k, v in (arc or {}).items()})
        return out

    def _evaluator(self):
        """data.arc_eval.ARCEvaluator when configured (data.evaluator: arc). One instance per
        run: with upstream's aggregated voting its votes accumulate over every evaluation."""
        name = self.cfg.data.get("evaluator", "")
        if not name:
            return None
        if name != "arc":
            raise ValueError(f"data.evaluator={name!r}: only 'arc' is known")
        if getattr(self, "_arc", None) is None:
            from data.arc_eval import ARCEvaluator

            self._arc = ARCEvaluator(self.data_dir)
        self._arc.begin_eval()
        return self._arc

    # --- import / export --------------------------------------------------------------------
    def import_weights(self, state, init_from: str):
        """An upstream TRM checkpoint (torch state_dict, `_orig_mod.` keys ok) -> params/table/
        buffers; optimizer and EMA restart from the imported params (upstream's load_checkpoint)."""
        from models.state_dict import load_file
        from models.trm import from_torch
        from models.trm.train_step import init_train_state

        src = from_torch(load_file(init_from), self.model_cfg)
        src.train()
        _, train_state = init_train_state(src, self.optim)
        new = {**jax.device_get(state), "train": train_state}
        return jax.device_put(new, self.state_shardings)

    def export_torch(self, state, ema: bool = True) -> dict:
        """The evaluated model (EMA params when enabled, as upstream saves) as a torch state_dict."""
        from models.trm import to_torch
        from models.trm.train_step import ema_model, merge_model

        host = jax.device_get(state["train"])
        model = ema_model(self.graphdef, host) if ema else merge_model(self.graphdef, host)
        return to_torch(model)


@dataclasses.dataclass
class _Meta:
    seq_len: int
    vocab_size: int
    num_puzzle_identifiers: int
    total_groups: int
    mean_puzzle_examples: float


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


def _barrier(name: str):
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)

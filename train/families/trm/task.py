"""TRM on the trainer: the adapter between train/task.py's hooks and models.trm.

    config sections  models.trm.TRMConfig (model), TRMOptimConfig (optim), data.TRMDataConfig (data)
    data             data.py: data.puzzle_source (upstream's layout), built on first use when
                     data.build names a builder
    train step       models/trm/training.py: one ACT step on the persistent carry
    eval step        models/trm/evaluation.py: a fresh carry, halt_max_steps ACT steps, EMA weights
    weights          upstream TRM state_dicts in and out (parity/trm_params.py)

Upstream pretrain.py's semantics: one optimizer step per ACT step on a carry that persists across
batches (part of the trainer state, sharded like the batch, donated and checkpointed), halted slots
refilled from the new batch. total_steps = int(data.epochs * total_groups * mean_puzzle_examples /
global_batch) (`models.trm.optim.total_steps`); the data runs epochs / eval_interval_epochs
ITERATIONS of eval_interval_epochs epochs each, each dropping its last partial batch, and
evaluation runs at the end of every iteration. Evaluation sums every test batch's metrics and
divides by the count (upstream `evaluate`), plus the ARC evaluator when data.evaluator=arc.
"""

from __future__ import annotations

import functools
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from data.arc_eval import ARCEvaluator
from data.puzzle_source import PuzzleTestDataset, PuzzleTrainDataset
from models.trm import TRM, TRMConfig
from models.trm.config import SAME_FUNCTION_FIELDS
from models.trm.evaluation import eval_step
from models.trm.flops import trm_flops_per_step
from models.trm.losses import normalize_metrics
from models.trm.optim import total_steps as schedule_steps
from models.trm.training import (
    TRMOptimConfig,
    ema_model,
    init_state,
    init_train_state,
    train_step,
)
from parity.files import COMPILE_PREFIX, load_file
from parity.trm_params import from_torch, to_torch, upstream_keys
from train import mesh as mesh_lib
from train.config import build_dataclass, check_fields, check_ranges
from train.errors import ConfigError, first_few
from train.families.trm.data import (
    SIZES,
    TRMDataConfig,
    check_batch_fits,
    check_identifiers,
    check_sizes_known,
    check_split,
    data_sizes,
    prepare_data,
    test_metadata,
)
from train.families.trm.evaluate import TRMEvalOptions
from train.task import Task, record_in_config

log = logging.getLogger(__name__)


class TRMTask(Task):
    items_name = "examples"
    console_metrics = ("train/lm_loss", "train/exact_accuracy", "eval/all/exact_accuracy")
    # optim.ema adds the EMA to the state; the data keys fix what a data position means
    resume_keys = ("optim.ema", *(f"data.{k}" for k in ("eval_interval_epochs", *SIZES)))
    # upstream's epochs live with the data they count, beside data.eval_interval_epochs
    moved_keys = {"trainer.epochs": "data.epochs"}
    resume_free_keys = tuple(f"model.{k}" for k in SAME_FUNCTION_FIELDS)
    config_sections = {
        "model": (TRMConfig, ("batch_size", "seq_len", "vocab_size", "num_puzzle_identifiers")),
        "optim": (TRMOptimConfig, ()),
        "data": (TRMDataConfig, ()),
    }
    # A TPU has no float64 (`check_backend`): on a TPU mesh (mesh.platform=tpu) the stablemax
    # loss is float32 unless a config file or the command line says otherwise.
    platform_defaults = {"tpu": {"model.loss_dtype": "float32"}}

    @classmethod
    def validate_config(cls, cfg) -> None:
        check_fields(TRMDataConfig, cfg.data, "data")
        check_ranges(cfg.data, "data", TRMDataConfig)
        check_fields(TRMConfig, cfg.model, "model")
        check_ranges(cfg.model, "model", TRMConfig)
        check_ranges(cfg.optim, "optim", TRMOptimConfig)
        if cfg.data.get("evaluator", "") not in ("", "arc"):
            raise ConfigError(f"data.evaluator={cfg.data.evaluator!r}: expected '' or 'arc'")
        moved = [k for k in ("loss_type", "loss_dtype") if k in (cfg.optim or {})]
        if moved:  # upstream keeps the loss in arch.loss; so does TRMConfig
            raise ConfigError(
                f"optim.{moved[0]}: the loss's settings are model.loss_type and model.loss_dtype "
                "(upstream's arch.loss): move them under model"
            )
        check_fields(TRMOptimConfig, cfg.optim, "optim")
        if cfg.trainer.total_steps == 0 and cfg.data.get("epochs", 0) == 0:
            raise ConfigError("data: TRM needs data.epochs (or trainer.total_steps) > 0")

    @classmethod
    def planned_steps(cls, cfg) -> str:
        t = cfg.trainer
        if t.total_steps:
            return super().planned_steps(cfg)
        path, n_epochs = cfg.data.get("path", ""), cfg.data.get("epochs", 0)
        epochs = f"data.epochs={n_epochs} over the data set at batch {t.global_batch_size}"
        if os.path.isfile(os.path.join(path, "train", "dataset.json")):
            s, where = data_sizes(path), "as upstream"
        else:  # a data set built elsewhere: the sizes its config states, if it states them
            s = {k: cfg.data.get(k) for k in ("total_groups", "mean_puzzle_examples")}
            if cfg.data.get("build") or None in s.values():
                return f"{epochs}: counted once the data set is built"
            where = "by the data config's sizes until the data set is built"
        n = schedule_steps(n_epochs, s["total_groups"], s["mean_puzzle_examples"],
                           t.global_batch_size)  # fmt: skip
        return f"{n} ({epochs}: {s['total_groups']} puzzle groups, {where})"

    @classmethod
    def needs_x64(cls, cfg) -> bool:
        """Upstream's float64 stablemax loss (model.loss_dtype, float64 by default) needs jax
        x64; every other TRM dtype is set explicitly."""
        return cfg.model.get("loss_dtype", TRMConfig.loss_dtype) == "float64"

    @classmethod
    def check_backend(cls, cfg, platform: str) -> None:
        """The float64 stablemax loss on a TPU: TPUs have no float64. XLA:TPU compiles it by
        rewriting every 64-bit value into a pair of 32-bit ones (the compiled v4-64 program holds
        no f64, s64 or u64 at all; docs/sharding.md, "float64 on a TPU"), which keeps float32's
        exponent range and is not the float64 upstream computes; the run would also turn on jax
        x64 and with it 64-bit integers, emulated the same way. A TPU mesh preset gives float32
        (`platform_defaults`), so this fires when float64 is asked for on a TPU explicitly or
        through a mesh preset for any devices (mesh=cpu on a TPU VM)."""
        if platform == "tpu" and cls.needs_x64(cfg):
            raise ConfigError(
                "model.loss_dtype=float64 is not float64 on a TPU: TPUs have no float64 and "
                "XLA:TPU emulates it with pairs of float32; set model.loss_dtype=float32 "
                '(docs/sharding.md, "float64 on a TPU")'
            )

    def __init__(self, cfg, mesh, *, need_data: bool = True):
        self.cfg, self.mesh = cfg, mesh
        self.batch = int(cfg.trainer.global_batch_size)
        if need_data:  # the data set's sizes, recorded in config.yaml before anything reads them
            prepare_data(cfg.data)
            record_in_config(cfg, {f"data.{k}": v for k, v in data_sizes(cfg.data.path).items()})
        self.data_cfg = d = build_dataclass(TRMDataConfig, cfg.data, "data")
        check_sizes_known(d)
        self.data_dir = d.path
        self.model_cfg = build_dataclass(
            TRMConfig,
            dict(cfg.model, batch_size=self.batch, seq_len=d.seq_len, vocab_size=d.vocab_size,
                 num_puzzle_identifiers=d.num_puzzle_identifiers),
            "model",
        )  # fmt: skip
        self.epochs = d.epochs
        self.eval_epochs = d.eval_interval_epochs or self.epochs
        if self.epochs and self.epochs % self.eval_epochs:
            raise ConfigError(
                f"data.eval_interval_epochs={self.eval_epochs} must divide data.epochs={self.epochs} (as upstream)"
            )
        self.total_steps = int(cfg.trainer.total_steps) or schedule_steps(
            self.epochs, d.total_groups, d.mean_puzzle_examples, self.batch
        )
        check_batch_fits(d, self.batch, self.epochs, self.eval_epochs, self.total_steps)
        self.optim = build_dataclass(TRMOptimConfig, cfg.optim, "optim")
        self.items_per_step = self.batch
        self.flops_per_step = trm_flops_per_step(self.model_cfg, self.batch)
        self._eval_fns = {}  # (eval batch, extra steps, halt) -> jitted eval_step
        self._arc = None  # one ARCEvaluator per run: its votes accumulate over evaluations
        self._setup()

    # --- data -------------------------------------------------------------------------------
    def validate_data(self) -> None:
        """Both splits (train, and test when a test/ directory exists) load through
        data.puzzle_format.load_split (metadata, every array file, shapes, dtypes, token range)
        and fit the model (`check_split`); data.eval_batch_size divides over the batch devices,
        like the train batch (else the first evaluation fails with JAX's sharding error)."""
        eval_batch = {"data.eval_batch_size": self.data_cfg.eval_batch_size}
        mesh_lib.check_batch_divisible(self.mesh, self.cfg.mesh.rules, eval_batch)
        for split in ("train", "test"):
            if split == "train" or os.path.isdir(os.path.join(self.data_dir, split)):
                check_split(self.data_dir, split, self.model_cfg, "data.path")  # no test/: no eval

    def check_eval_data(self, data_dir: str, trained_on: str | None) -> None:
        """`data_dir`'s test split fits the model, and an ARC set's identifiers.json is the one
        the weights were trained with (puzzle identifiers index the trained embedding table)."""
        test_metadata(data_dir)
        check_split(data_dir, "test", self.model_cfg, "--data")
        check_identifiers(data_dir, trained_on, self.model_cfg)

    def batch_shapes(self, batch_size: int | None = None):
        """A train batch, or with `batch_size` an evaluation batch of that many rows."""
        B, L = batch_size or self.batch, self.data_cfg.seq_len
        return {
            "inputs": ((B, L), np.int32, 0),
            "labels": ((B, L), np.int32, 0),
            "puzzle_identifiers": ((B,), np.int32, 0),
        }

    def train_iterator(self):
        ds = PuzzleTrainDataset(
            self.data_dir,
            global_batch_size=self.batch,
            seed=self.cfg.run.seed,
            epochs_per_iter=self.eval_epochs,
            num_iterations=self.epochs // self.eval_epochs if self.epochs else None,
        )
        return iter(ds)

    def eval_due(self, step: int, data_iter) -> bool:
        """True when the batch just consumed was the last of an upstream iteration."""
        return data_iter.at_iteration_end()

    # --- model + step -----------------------------------------------------------------------
    def init(self, key):
        k_params, k_explore = jax.random.split(key)
        # the halting exploration draws (upstream: torch.rand_like / randint_like per row) come
        # from the model's own `exploration` stream, part of the state and checkpointed with it
        model = TRM(self.model_cfg, rngs=nnx.Rngs(params=k_params, exploration=k_explore))
        model.train()
        zeros = {k: jnp.zeros(s, dt) for k, (s, dt, _) in self.batch_shapes().items()}
        return init_state(model, self.optim, zeros)

    def state_shardings_for(self, abstract_state):
        """Params / optimizer / EMA / table by the param rule; the carry like the batch."""
        mode = self.cfg.mesh.param_sharding
        return {
            "train": mesh_lib.tree_shardings(abstract_state["train"], self.mesh, mode),
            "carry": mesh_lib.carry_shardings(
                abstract_state["carry"], self.mesh, self.cfg.mesh.rules, self.batch
            ),
        }

    def bind_step(self, graphdef):
        """models/trm/training.py's train_step over the schedule of `total_steps`."""
        return functools.partial(
            train_step, graphdef, config=self.optim, total_steps=self.total_steps
        )

    # --- eval -------------------------------------------------------------------------------
    def eval_step(self, state, batch):
        return eval_step(self.graphdef, state["train"], batch)["sums"]

    def eval_metrics(self, sums: dict) -> dict:
        return normalize_metrics(sums, mode="eval")

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
                 options: TRMEvalOptions | None = None, evaluator=None,
                 progress: bool = False) -> dict | None:  # fmt: skip
        """The evaluation loop the trainer runs (`evaluate`) and `python -m train.evaluate`
        runs: every test batch of `data_dir` (default data.path) through the jitted, sharded
        eval step (`options.step`: models/trm/evaluation.py; default options: upstream's
        evaluation), summed on device, normalised as upstream.
        -> {"metrics", "per_step": {"exact_accuracy": [...], "accuracy": [...]}, "count",
        "evaluator"} (None without a test split). `evaluator` (ARCEvaluator) gets every batch's
        predictions (the chosen ones with `scaling`) and q_halt logits.

        With `options.scaling` (test-time scaling, models/trm/scaling.py): `trajectories` noisy
        copies of every test puzzle, one answer chosen per puzzle, as batches of `batch_size` rows
        (rows // trajectories puzzles, a multiple of the data-parallel shards, at least one per
        shard); the result adds "trajectory_count", "chosen" (the chosen answers' metrics) and
        "by_k" (k -> their metrics had only the first k trajectories been drawn, and the oracle);
        `metrics` and `per_step` are then over every trajectory and `count` counts puzzles."""
        data_dir = data_dir or self.data_dir
        if not os.path.exists(os.path.join(data_dir, "test", "dataset.json")):
            return None
        options = options or TRMEvalOptions()
        scaling = options.scaling
        batch = batch_size or self.data_cfg.eval_batch_size or self.batch
        if scaling is not None:  # puzzles per batch
            shards = mesh_lib.batch_shards(self.mesh, self.cfg.mesh.rules)
            batch = max(batch // scaling.trajectories // shards, 1) * shards
        ds = PuzzleTestDataset(data_dir, global_batch_size=batch)
        fn, shapes, summed = self._eval_fn_for(batch, options)
        total = None
        for i, local in enumerate(tqdm(ds, desc="evaluate", unit="batch", disable=not progress)):
            if scaling is not None:  # each puzzle's own noise, whatever the batching
                first = i * ds.global_batch_size + ds.row_start
                local = {**local, "example": np.arange(first, first + ds.local_batch_size)}
            out = fn(state["train"], self.to_global(local, shapes))
            sums = {k: out[k] for k in summed}
            total = sums if total is None else jax.tree.map(jnp.add, total, sums)
            if evaluator is not None:
                rows = {k: _local_rows(out[k]) for k in ("preds", "q_halt_logits")}
                evaluator.update_batch(local, rows)
        # host float64 from here
        total = jax.tree.map(lambda x: np.asarray(x, np.float64).tolist(), jax.device_get(total))
        count = total["sums"]["count"]
        result = {
            "metrics": self.eval_metrics(total["sums"]),
            "per_step": {k: [x / count for x in v] for k, v in total["per_step"].items()},
            "count": count,
            "evaluator": evaluator,
        }
        if scaling is not None:
            puzzles = total["chosen"]["count"]
            result.update(
                count=puzzles,
                trajectory_count=count,
                chosen={k: v / puzzles for k, v in total["chosen"].items() if k != "count"},
                by_k={k: {m: v / puzzles for m, v in d.items()} for k, d in total["by_k"].items()},
            )
        return result

    def _eval_fn_for(self, batch: int, options: TRMEvalOptions):
        """(the jitted `options.step` for this batch, its batch shapes, the outputs that add over
        batches): one compile each, its outputs' shardings derived (Task.output_shardings); every
        output but the per-row ones is summed. With test-time scaling `batch` counts puzzles,
        each with its "example" index."""
        shapes = self.batch_shapes(batch)
        if options.scaling is not None:
            shapes = {**shapes, "example": ((batch,), np.int32, 0)}
        key = (batch, options.step_key())
        if key not in self._eval_fns:
            batch_sh = {k: v.sharding for k, v in self.abstract_batch(shapes).items()}
            fn = options.step(self.graphdef)
            out_sh = self.output_shardings(fn, self.abstract_state["train"], shapes)
            replicated = mesh_lib.replicated(self.mesh)
            summed = tuple(
                k for k, sh in out_sh.items() if all(x == replicated for x in jax.tree.leaves(sh))
            )
            jitted = jax.jit(
                fn, in_shardings=(self.state_shardings["train"], batch_sh), out_shardings=out_sh
            )
            self._eval_fns[key] = (jitted, summed)
        jitted, summed = self._eval_fns[key]
        return jitted, shapes, summed

    def _evaluator(self):
        """data.arc_eval.ARCEvaluator when configured (data.evaluator: arc). One instance per
        run: with upstream's aggregated voting its votes accumulate over every evaluation."""
        if self.data_cfg.evaluator != "arc":
            return None
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
        state_dict = load_file(path)
        extra = self.keys_upstream_lacks(state_dict)
        if extra:
            log.info("%s: %s", path, variant_description(extra))
        src = from_torch(state_dict, self.model_cfg)
        src.train()
        _, train_state = init_train_state(src, self.optim)
        new = {**jax.device_get(state), "train": train_state}
        return jax.device_put(new, self.state_shardings)

    def torch_checkpoint(self, state, meta: dict) -> dict:
        """The state_dict upstream saves: the evaluated model (EMA params when enabled)."""
        return to_torch(ema_model(self.graphdef, jax.device_get(state["train"])))

    def keys_upstream_lacks(self, checkpoint) -> list[str]:
        """The keys of an upstream-format state_dict (`_orig_mod.` ok) that upstream's model of
        this config lacks (parity.trm_params.upstream_keys: the PyTorch reference's)."""
        upstream = upstream_keys(self.model_cfg)
        return sorted(k for k in checkpoint if k.removeprefix(COMPILE_PREFIX) not in upstream)


def variant_description(extra: list[str]) -> str:
    """What an upstream-format file holding `extra` keys is (train.source's kind, the import's
    log line)."""
    return f"upstream_trm with keys upstream lacks: {first_few(extra)}"


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

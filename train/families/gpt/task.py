"""nanoGPT on the trainer: the adapter between train/task.py's hooks and models.gpt.

    config sections  GPTDataConfig (data), models.gpt.GPTConfig (model), GPTOptimConfig (optim)
    data             data.text_source token windows (shakespeare_char built on first use)
    train step       models/gpt/train_step.py: AdamW groups, get_lr, clipping, accumulation
    eval step        the loss with dropout off; estimate_loss over eval_iters batches + a sample
    weights          nanoGPT ckpt.pt / HF GPT-2 in, nanoGPT ckpt.pt out (models/gpt/params.py)

Semantics of nanoGPT's train.py: AdamW with decay on ndim >= 2, warmup + cosine `get_lr` read from
the optimizer's update count, global-norm clipping with torch's 1e-6, `gradient_accumulation_steps`
sequential micro-batches (leading axis of the batch), periodic `estimate_loss` on train and val
with dropout off, best-val checkpoint (checkpoint.best_metric = eval/val_loss), samples at each eval.
The loop runs iterations 0..max_iters inclusive (max_iters + 1 updates) as nanoGPT.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from omegaconf import OmegaConf

from data.shakespeare_char import build as build_shakespeare_char
from data.text_source import eval_dataset, read_meta, read_token_bin, train_dataset
from models.gpt import GPT, GPTConfig, from_torch_file, generate, to_torch
from models.gpt.flops import gpt_flops_per_step
from models.gpt.train_step import configure_optimizers, lr_schedule, train_step
from train.config import build_dataclass, check_fields, check_ranges
from train.errors import ConfigError
from train.task import Task, build_once, record_in_config

log = logging.getLogger(__name__)


@dataclasses.dataclass
class GPTOptimConfig:
    """nanoGPT train.py's optimiser keys (names and defaults of train.py): the `optim` section."""

    learning_rate: float = 6e-4
    max_iters: int = 600000
    weight_decay: float = 1e-1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    decay_lr: bool = True
    warmup_iters: int = 2000
    lr_decay_iters: int = 600000
    min_lr: float = 6e-5


@dataclasses.dataclass
class GPTDataConfig:
    """The `data` section of a text data set (configs/data/shakespeare_char.yaml, openwebtext)."""

    path: str = ""  # a directory with train.bin / val.bin / meta.json (data.text_source)
    build: str | None = None  # shakespeare_char: built into `path` when it has no train.bin
    input: str = ""  # the builder's input.txt (empty: downloaded); read only when building
    sample_tokens: int = 0  # characters generated at each eval (0: none)


# Values that make no sense (train.config.check_ranges).
_OPTIM_RANGES = {
    "learning_rate": ">0",
    "min_lr": ">=0",
    "weight_decay": ">=0",
    "beta1": "[0,1)",
    "beta2": "[0,1)",
    "grad_clip": ">=0",
    "max_iters": ">=0",
    "warmup_iters": ">=0",
    "lr_decay_iters": ">=0",
}
_MODEL_RANGES = {
    "block_size": ">0",
    "vocab_size": ">0",
    "n_layer": ">0",
    "n_head": ">0",
    "n_embd": ">0",
    "dropout": "[0,1)",
}


class GPTTask(Task):
    items_name = "tokens"
    console_metrics = ("train/loss", "eval/val_loss")

    @classmethod
    def validate_config(cls, cfg) -> None:
        check_fields(GPTDataConfig, cfg.data, "data")
        check_ranges(cfg.data, "data", {"sample_tokens": ">=0"})
        check_fields(GPTConfig, cfg.model, "model")
        check_ranges(cfg.model, "model", _MODEL_RANGES)
        check_ranges(cfg.optim, "optim", _OPTIM_RANGES)
        o = build_dataclass(GPTOptimConfig, cfg.optim, "optim")
        if o.decay_lr and o.lr_decay_iters < o.warmup_iters:
            raise ConfigError("optim.lr_decay_iters must be >= optim.warmup_iters")
        if cfg.trainer.eval_interval and cfg.trainer.eval_iters == 0:
            raise ConfigError("trainer.eval_iters must be > 0 when trainer.eval_interval > 0")

    def __init__(self, cfg, mesh, *, need_data: bool = True):
        self.cfg, self.mesh = cfg, mesh
        d = dict(cfg.data)
        self.data_dir = d.get("path", "")
        self.meta = self._prepare_data(d) if need_data else {}
        if "vocab_size" in self.meta:  # the data set's vocabulary, recorded in config.yaml
            record_in_config(cfg, {"model.vocab_size": int(self.meta["vocab_size"])})
        self.model_cfg = build_dataclass(GPTConfig, cfg.model, "model")
        self.optim = build_dataclass(GPTOptimConfig, cfg.optim, "optim")
        o = self.optim
        # nanoGPT's get_lr as an optax schedule of the update count (also logged by `step`)
        self.lr_fn = lr_schedule(
            learning_rate=o.learning_rate,
            warmup_iters=o.warmup_iters,
            lr_decay_iters=o.lr_decay_iters,
            min_lr=o.min_lr,
            decay_lr=o.decay_lr,
        )
        t = cfg.trainer
        self.accum = int(t.gradient_accumulation_steps)
        self.batch = int(t.global_batch_size)
        self.block = self.model_cfg.block_size
        self.total_steps = int(t.total_steps) or self.optim.max_iters + 1
        self.items_per_step = self.accum * self.batch * self.block
        self.flops_per_step = gpt_flops_per_step(self.model_cfg, self.batch, self.accum)
        self._eval_fn = None
        self._setup()
        model, optimizer = nnx.merge(self.graphdef, self.abstract_state)  # shapes only
        model.eval()  # dropout off: a different (static) graphdef over the same state
        self.eval_graphdef = nnx.graphdef((model, optimizer))

    # --- data -------------------------------------------------------------------------------
    def _prepare_data(self, d: dict) -> dict:
        path = self.data_dir
        if not path:
            raise ConfigError(
                "data.path: directory with train.bin / val.bin / meta.json is required"
            )
        if os.path.exists(os.path.join(path, "train.bin")):
            if d.get("input"):
                log.warning(
                    "data.input=%r was not read: data.path=%r already holds built data "
                    "(train.bin); delete that directory (or set another data.path) to rebuild "
                    "from data.input",
                    d["input"],
                    path,
                )
        else:
            builder = d.get("build")
            if builder != "shakespeare_char":
                raise ConfigError(
                    f"data.path={path!r} has no train.bin; build it first (python -m data.<name>)"
                )
            log.info("building %s into %s", builder, path)
            build_once(
                "gpt_data_built",
                lambda: build_shakespeare_char(path, input_path=d.get("input") or None),
            )
        try:
            return read_meta(path)
        except FileNotFoundError:
            return {}

    def validate_data(self) -> None:
        self.check_eval_data(self.data_dir, option="data.path")

    def check_eval_data(self, data_dir: str, trained_on=None, option: str = "--data") -> None:
        """train.bin and val.bin open as uint16 tokens, hold more than one window, and their
        tokens (val: all; train: the first 2**20) are below the model's vocab_size."""
        vocab, need = self.model_cfg.vocab_size, self.model_cfg.block_size + 2
        for split in ("train", "val"):
            path = os.path.join(data_dir, f"{split}.bin")
            try:
                tokens = read_token_bin(path)
            except (OSError, ValueError) as e:
                raise ConfigError(f"{option}: {e}") from e
            if len(tokens) < need:
                raise ConfigError(
                    f"{option}: {path} has {len(tokens)} tokens; model.block_size="
                    f"{self.model_cfg.block_size} needs at least {need}"
                )
            top = int(np.max(tokens[: 1 << 20] if split == "train" else tokens))
            if top >= vocab:
                raise ConfigError(
                    f"{option}: {path} has token id {top}, not below the model's vocab_size="
                    f"{vocab} (meta.json vocab_size or model.vocab_size)"
                )

    def batch_shapes(self, batch_size: int | None = None):
        """[accum, batch, block] micro-batches; an evaluation batch is [batch_size, block]."""
        if batch_size is not None:
            return {k: ((batch_size, self.block), np.int32, 0) for k in ("x", "y")}
        shape = (self.accum, self.batch, self.block)
        return {"x": (shape, np.int32, 1), "y": (shape, np.int32, 1)}

    def local_batch(self, b):
        # data.text_source's rows for this process: [accum * local, T] -> [accum, local, T]; micro-step m takes
        # rows m*local..(m+1)*local of this process's slice of the global draw.
        return {k: np.asarray(v).reshape(self.accum, -1, self.block) for k, v in b.items()}

    def train_iterator(self):
        ds = train_dataset(
            os.path.join(self.data_dir, "train.bin"),
            block_size=self.block,
            global_batch_size=self.batch * self.accum,
            seed=self.cfg.run.seed,
        )
        return _Mapped(iter(ds), self.local_batch)

    # --- model + step -----------------------------------------------------------------------
    def init(self, key):
        k_params, k_dropout = jax.random.split(key)
        model = GPT(self.model_cfg, rngs=nnx.Rngs(params=k_params, dropout=k_dropout))
        model.train()
        tx = configure_optimizers(
            weight_decay=self.optim.weight_decay,
            learning_rate=self.lr_fn,
            betas=(self.optim.beta1, self.optim.beta2),
        )
        return nnx.split((model, nnx.Optimizer(model, tx, wrt=nnx.Param)))

    def train_step(self, state, batch):
        return train_step(
            self.graphdef, state, batch, grad_clip=self.optim.grad_clip, lr=self.lr_fn
        )

    # --- eval -------------------------------------------------------------------------------
    def eval_step(self, state, batch):
        """The batch's mean loss with dropout off, as a sum over one batch (nanoGPT's
        estimate_loss averages these over eval_iters batches)."""
        model, _ = nnx.merge(self.eval_graphdef, state)
        return {"loss": model(batch["x"], batch["y"])[1], "count": jnp.float32(1)}

    def eval_metrics(self, sums: dict) -> dict:
        return {"loss": float(sums["loss"]) / float(sums["count"])}

    def evaluate(self, state, step: int) -> dict:
        """nanoGPT's estimate_loss (eval_iters batches per split, dropout off) + a sample."""
        out = self.run_eval(state)
        n = int(self.cfg.data.get("sample_tokens", 0) or 0)
        if n > 0 and "itos" in self.meta:
            out["eval/sample"] = self.sample(state, n)
        return out

    def run_eval(self, state, data_dir: str | None = None) -> dict:
        """estimate_loss on `data_dir` (default data.path): -> {"eval/train_loss",
        "eval/val_loss"}; the batches depend on run.seed only, so every evaluation of a run,
        and `python -m train.evaluate` on its checkpoints, sees the same windows."""
        shapes = self.batch_shapes(self.batch)
        if self._eval_fn is None:
            batch_sh = {k: v.sharding for k, v in self.abstract_batch(shapes).items()}
            self._eval_fn = jax.jit(self.eval_step, in_shardings=(self.state_shardings, batch_sh))
        out = {}
        for split in ("train", "val"):
            ds = eval_dataset(
                os.path.join(data_dir or self.data_dir, f"{split}.bin"),
                block_size=self.block,
                global_batch_size=self.batch,
                num_batches=int(self.cfg.trainer.eval_iters),
                seed=self.cfg.run.seed,
            )
            sums = [self._eval_fn(state, self.to_global(b, shapes)) for b in ds]
            total = {k: sum(float(s[k]) for s in jax.device_get(sums)) for k in ("loss", "count")}
            # nanoGPT logs these as train/loss and val/loss; here train/* is the per-step stream
            out[f"eval/{split}_loss"] = self.eval_metrics(total)["loss"]
        return out

    def sample(self, state, max_new_tokens: int, temperature: float = 0.8, top_k: int = 200):
        """nanoGPT's sample.py defaults; starts from a newline, decodes with the dataset's itos."""
        model, _ = nnx.merge(self.eval_graphdef, state)
        itos = self.meta["itos"]
        decode = (
            (lambda ids: "".join(itos[i] for i in ids))
            if isinstance(itos, list)
            else (lambda ids: "".join(itos[str(i)] if str(i) in itos else itos[i] for i in ids))
        )
        stoi = self.meta.get("stoi", {})
        start = np.array([[stoi.get("\n", 0)]], np.int32)
        out = generate(
            model,
            start,
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            rngs=jax.random.key(self.cfg.run.seed + 1337),
        )
        return decode(np.asarray(jax.device_get(out))[0].tolist())

    # --- import / export --------------------------------------------------------------------
    def import_weights(self, state, path: str):
        """A nanoGPT ckpt.pt, a raw state_dict, or an HF GPT-2 weights file (config must match)."""
        model, optimizer = nnx.merge(self.graphdef, jax.device_get(state))
        src = from_torch_file(path, self.model_cfg)
        nnx.update(model, nnx.state(src, nnx.Param))
        return jax.device_put(nnx.state((model, optimizer)), self.state_shardings)

    def torch_checkpoint(self, state, meta: dict) -> dict:
        """nanoGPT's ckpt.pt dict, readable by its sample.py / train.py init_from='resume'
        (optimizer state is not converted: `optimizer` is None)."""
        model, _ = nnx.merge(self.graphdef, jax.device_get(state))
        m = self.model_cfg
        return {
            "model": to_torch(model),
            "optimizer": None,
            "model_args": dict(
                n_layer=m.n_layer,
                n_head=m.n_head,
                n_embd=m.n_embd,
                block_size=m.block_size,
                bias=m.bias,
                vocab_size=m.vocab_size,
                dropout=m.dropout,
            ),
            "iter_num": int(meta["step"]),
            "best_val_loss": meta.get("best"),
            "config": OmegaConf.to_container(self.cfg, resolve=True),
        }


class _Mapped:
    """An iterator with Grain's get_state/set_state that maps each element (state passes through)."""

    def __init__(self, it, fn):
        self.it, self.fn = it, fn

    def __iter__(self):
        return self

    def __next__(self):
        return self.fn(next(self.it))

    # Grain's Orbax handler JSON-encodes DatasetIterator states itself but expects bytes from
    # any other iterator; we are "any other", so encode the wrapped iterator's dict here.
    def get_state(self) -> bytes:
        return json.dumps(self.it.get_state()).encode()

    def set_state(self, state):
        self.it.set_state(json.loads(state) if isinstance(state, str | bytes) else state)

    def start_prefetch(self):  # called by Grain's restore
        getattr(self.it, "start_prefetch", lambda: None)()

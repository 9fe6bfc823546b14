"""nanoGPT on the trainer: the model and optimisation math (models.gpt), token windows from
data.text_source.

Semantics of nanoGPT's train.py: AdamW with decay on ndim >= 2, warmup + cosine `get_lr` read from
the optimizer's update count, global-norm clipping with torch's 1e-6, `gradient_accumulation_steps`
sequential micro-batches (leading axis of the batch), periodic `estimate_loss` on train and val
with dropout off, best-val checkpoint (checkpoint.best_metric = eval/val_loss), samples at each eval.
The loop runs iterations 0..max_iters inclusive (max_iters + 1 updates) as nanoGPT.
"""

from __future__ import annotations

import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from train.config import GPTOptimConfig, build_dataclass
from train.task import Task

log = logging.getLogger(__name__)


class GPTTask(Task):
    items_name = "tokens"

    def __init__(self, cfg, mesh, *, need_data: bool = True):
        from models.gpt import GPTConfig

        self.cfg, self.mesh = cfg, mesh
        d = dict(cfg.data)
        self.data_dir = d.get("path", "")
        self.meta = self._prepare_data(d) if need_data else {}
        model_kw = dict(cfg.model)
        if "vocab_size" in self.meta:
            model_kw["vocab_size"] = int(self.meta["vocab_size"])
        self.model_cfg = build_dataclass(GPTConfig, model_kw, "model")
        self.optim = build_dataclass(GPTOptimConfig, cfg.optim, "optim")
        t = cfg.trainer
        self.accum = int(t.gradient_accumulation_steps)
        self.batch = int(t.global_batch_size)
        self.block = self.model_cfg.block_size
        self.total_steps = int(t.total_steps) or self.optim.max_iters + 1
        from train.flops import gpt_flops_per_step

        self.items_per_step = self.accum * self.batch * self.block
        self.flops_per_step = gpt_flops_per_step(self.model_cfg, self.batch, self.accum)
        self._eval_fn = None
        self._setup()

    # --- data -------------------------------------------------------------------------------
    def _prepare_data(self, d: dict) -> dict:
        from data.text_source import read_meta

        path = self.data_dir
        if not path:
            raise ValueError(
                "data.path: directory with train.bin / val.bin / meta.json is required"
            )
        if not os.path.exists(os.path.join(path, "train.bin")):
            builder = d.get("build")
            if builder != "shakespeare_char":
                raise FileNotFoundError(
                    f"data.path={path!r} has no train.bin; build it first (python -m data.<name>)"
                )
            from data.shakespeare_char import build

            if jax.process_index() == 0:
                log.info("building %s into %s", builder, path)
                build(path, input_path=d.get("input") or None)
            _barrier("gpt_data_built")
        try:
            return read_meta(path)
        except FileNotFoundError:
            return {}

    def local_batch_shapes(self):
        shape = (self.accum, self.batch, self.block)
        return {"x": (shape, np.int32, 1), "y": (shape, np.int32, 1)}

    def _reshape_local(self, b):
        # data.text_source's rows for this process: [accum * local, T] -> [accum, local, T]; micro-step m takes
        # rows m*local..(m+1)*local of this process's slice of the global draw.
        return {k: np.asarray(v).reshape(self.accum, -1, self.block) for k, v in b.items()}

    def train_iterator(self):
        from data.text_source import train_dataset

        ds = train_dataset(
            os.path.join(self.data_dir, "train.bin"),
            block_size=self.block,
            global_batch_size=self.batch * self.accum,
            seed=self.cfg.run.seed,
        )
        return _Mapped(iter(ds), self._reshape_local)

    # --- model + step -----------------------------------------------------------------------
    def _optimizer_tx(self):
        from models.gpt import configure_optimizers
        from models.gpt.train_step import lr_schedule

        o = self.optim
        self.lr_fn = lr_schedule(
            learning_rate=o.learning_rate,
            warmup_iters=o.warmup_iters,
            lr_decay_iters=o.lr_decay_iters,
            min_lr=o.min_lr,
            decay_lr=o.decay_lr,
        )
        return configure_optimizers(
            weight_decay=o.weight_decay, learning_rate=self.lr_fn, betas=(o.beta1, o.beta2)
        )

    def build_objects(self, key):
        from models.gpt import GPT

        k_params, k_dropout = jax.random.split(key)
        model = GPT(self.model_cfg, rngs=nnx.Rngs(params=k_params, dropout=k_dropout))
        optimizer = nnx.Optimizer(model, self._optimizer_tx(), wrt=nnx.Param)
        return model, optimizer

    def init_state(self, key):
        model, optimizer = self.build_objects(key)
        model.eval()  # dropout off: a different (static) graphdef, same state
        self.eval_graphdef = nnx.split((model, optimizer))[0]
        model.train()
        self.graphdef, state = nnx.split((model, optimizer))
        return state

    def train_step(self, state, batch):
        from models.gpt import train_step

        model, optimizer = nnx.merge(self.graphdef, state)
        it = optimizer.step[...]  # nanoGPT's iter_num: updates done before this one
        metrics = train_step(
            model, optimizer, batch["x"], batch["y"], grad_clip=self.optim.grad_clip
        )
        metrics["lr"] = jnp.asarray(self.lr_fn(it), jnp.float32)
        return nnx.state((model, optimizer)), metrics

    # --- eval -------------------------------------------------------------------------------
    def _eval_loss(self, state, x, y):
        model, _ = nnx.merge(self.eval_graphdef, state)
        return model(x, y)[1]

    def evaluate(self, state, step: int) -> dict:
        """nanoGPT's estimate_loss (eval_iters batches per split, dropout off) + a sample."""
        from data.text_source import eval_dataset

        t = self.cfg.trainer
        if self._eval_fn is None:
            xs = self.batch_sharding(2)
            self._eval_fn = jax.jit(self._eval_loss, in_shardings=(self.state_shardings, xs, xs))
        out = {}
        for split in ("train", "val"):
            ds = eval_dataset(
                os.path.join(self.data_dir, f"{split}.bin"),
                block_size=self.block,
                global_batch_size=self.batch,
                num_batches=int(t.eval_iters),
                seed=self.cfg.run.seed,
            )
            losses = []
            for b in ds:
                g = {
                    k: jax.make_array_from_process_local_data(
                        self.batch_sharding(2), np.asarray(v, np.int32), (self.batch, self.block)
                    )
                    for k, v in b.items()
                }
                losses.append(self._eval_fn(state, g["x"], g["y"]))
            # nanoGPT logs these as train/loss and val/loss; here train/* is the per-step stream
            out[f"eval/{split}_loss"] = float(np.mean(jax.device_get(losses)))
        n = int(self.cfg.data.get("sample_tokens", 0) or 0)
        if n > 0 and "itos" in self.meta:
            out["eval/sample"] = self.sample(state, n)
        return out

    def sample(self, state, max_new_tokens: int, temperature: float = 0.8, top_k: int = 200):
        """nanoGPT's sample.py defaults; starts from a newline, decodes with the dataset's itos."""
        from models.gpt import generate

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
    def import_weights(self, state, init_from: str):
        """A nanoGPT ckpt.pt, a raw state_dict, or an HF GPT-2 weights file (config must match)."""
        from models.gpt import from_torch_file

        model, optimizer = nnx.merge(self.graphdef, jax.device_get(state))
        src = from_torch_file(init_from, self.model_cfg)
        nnx.update(model, nnx.state(src, nnx.Param))
        return jax.device_put(nnx.state((model, optimizer)), self.state_shardings)

    def export_torch(self, state) -> dict:
        from models.gpt import to_torch

        model, _ = nnx.merge(self.graphdef, jax.device_get(state))
        return to_torch(model)


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


def _barrier(name: str):
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)

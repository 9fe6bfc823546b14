"""nanoGPT on the trainer: the adapter between train/task.py's hooks and models.gpt.

    config sections  models.gpt.GPTConfig (model), GPTOptimConfig (optim), data.GPTDataConfig (data)
    data             data.py: data.text_source token windows (shakespeare_char built on first use)
    train step       models/gpt/training.py: AdamW groups, get_lr, clipping, accumulation
    eval step        models/gpt/evaluation.py: the loss with dropout off; estimate_loss over
                     data.eval_iters batches + a sample
    weights          nanoGPT ckpt.pt / HF GPT-2 in, nanoGPT ckpt.pt out (parity/gpt_params.py)

Semantics of nanoGPT's train.py: AdamW with decay on ndim >= 2, warmup + cosine `get_lr` read from
the optimizer's update count, global-norm clipping with torch's 1e-6, data.gradient_accumulation_steps
sequential micro-batches (leading axis of the batch), periodic `estimate_loss` on train and val
with dropout off, best-val checkpoint (checkpoint.best_metric = eval/val_loss), samples at each eval.
The loop runs iterations 0..max_iters inclusive (max_iters + 1 updates) as nanoGPT.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import numpy as np
from flax import nnx
from omegaconf import OmegaConf

from data.text_source import eval_dataset
from models.gpt import GPT, GPTConfig, generate
from models.gpt.evaluation import eval_graphdef, eval_step
from models.gpt.flops import gpt_flops_per_step
from models.gpt.training import GPTOptimConfig, init_train_state, train_step
from parity.gpt_params import from_torch_file, to_torch
from train.config import build_dataclass, check_fields, check_ranges
from train.errors import ConfigError
from train.families.gpt.data import (
    GPTDataConfig,
    check_text_data,
    prepare_data,
    train_iterator,
)
from train.task import Task, record_in_config


class GPTTask(Task):
    items_name = "tokens"
    console_metrics = ("train/loss", "eval/val_loss", "eval/sample")
    # optim.adamw_flat lays Adam's moments out as one vector: a checkpoint holds one layout
    # the batch's layout too: [accumulation, batch, block]
    resume_keys = ("optim.adamw_flat", "data.gradient_accumulation_steps")
    # nanoGPT's data knobs, in the data section they shape
    moved_keys = {
        "trainer.eval_iters": "data.eval_iters",
        "trainer.gradient_accumulation_steps": "data.gradient_accumulation_steps",
    }
    resume_free_keys = ("model.dropout", "model.attention_impl", "model.cross_entropy_impl")
    config_sections = {
        "model": (GPTConfig, ()),
        "optim": (GPTOptimConfig, ()),
        "data": (GPTDataConfig, ()),
    }

    @classmethod
    def validate_config(cls, cfg) -> None:
        check_fields(GPTDataConfig, cfg.data, "data")
        check_ranges(cfg.data, "data", GPTDataConfig)
        check_fields(GPTConfig, cfg.model, "model")
        check_ranges(cfg.model, "model", GPTConfig)
        check_fields(GPTOptimConfig, cfg.optim, "optim")
        check_ranges(cfg.optim, "optim", GPTOptimConfig)
        o = {**dataclasses.asdict(GPTOptimConfig()), **cfg.optim}
        if o["decay_lr"] and o["lr_decay_iters"] < o["warmup_iters"]:
            raise ConfigError("optim.lr_decay_iters must be >= optim.warmup_iters")
        if cfg.trainer.eval_interval and cfg.data.get("eval_iters", 0) == 0:
            raise ConfigError("data.eval_iters must be > 0 when trainer.eval_interval > 0")

    @classmethod
    def planned_steps(cls, cfg) -> str:
        if cfg.trainer.total_steps:
            return super().planned_steps(cfg)
        iters = {**dataclasses.asdict(GPTOptimConfig()), **cfg.optim}["max_iters"]
        return f"{iters + 1} (optim.max_iters={iters} + 1, as nanoGPT's loop)"

    def __init__(self, cfg, mesh, *, need_data: bool = True):
        self.cfg, self.mesh = cfg, mesh
        self.data_dir = cfg.data.get("path", "")
        self.meta = prepare_data(dict(cfg.data)) if need_data else {}
        if "vocab_size" in self.meta:  # the data set's vocabulary, recorded in config.yaml
            record_in_config(cfg, {"model.vocab_size": int(self.meta["vocab_size"])})
        self.model_cfg = build_dataclass(GPTConfig, cfg.model, "model")
        self.optim = build_dataclass(GPTOptimConfig, cfg.optim, "optim")
        self.data_cfg = build_dataclass(GPTDataConfig, cfg.data, "data")
        self.lr_fn = self.optim.schedule()  # nanoGPT's get_lr (also logged by the step)
        t = cfg.trainer
        self.accum = self.data_cfg.gradient_accumulation_steps
        self.batch = int(t.global_batch_size)
        self.block = self.model_cfg.block_size
        self.total_steps = int(t.total_steps) or self.optim.max_iters + 1
        self.items_per_step = self.accum * self.batch * self.block
        self.flops_per_step = gpt_flops_per_step(self.model_cfg, self.batch, self.accum)
        self._eval_fn = None
        self._setup()
        self.eval_graphdef = eval_graphdef(self.graphdef, self.abstract_state)

    # --- data -------------------------------------------------------------------------------
    def validate_data(self) -> None:
        check_text_data(self.data_dir, self.model_cfg, "data.path")

    def check_eval_data(self, data_dir: str) -> None:
        """`data_dir` (`python -m train.evaluate --data`) fits the model (`check_text_data`)."""
        check_text_data(data_dir, self.model_cfg, "--data")

    def batch_shapes(self, batch_size: int | None = None):
        """[accum, batch, block] micro-batches; an evaluation batch is [batch_size, block]."""
        if batch_size is not None:
            return {k: ((batch_size, self.block), np.int32, 0) for k in ("x", "y")}
        shape = (self.accum, self.batch, self.block)
        return {"x": (shape, np.int32, 1), "y": (shape, np.int32, 1)}

    def local_batch(self, b):
        # data.text_source's rows for this process: [accum * local, T] -> [accum, local, T];
        # micro-step m takes rows m*local..(m+1)*local of this process's slice of the global draw.
        return {k: np.asarray(v).reshape(self.accum, -1, self.block) for k, v in b.items()}

    def train_iterator(self):
        return train_iterator(
            self.data_dir,
            block_size=self.block,
            global_batch_size=self.batch * self.accum,
            seed=self.cfg.run.seed,
            local_batch=self.local_batch,
        )

    # --- model + step -----------------------------------------------------------------------
    def init(self, key):
        k_params, k_dropout = jax.random.split(key)
        model = GPT(self.model_cfg, rngs=nnx.Rngs(params=k_params, dropout=k_dropout))
        model.train()
        return init_train_state(model, self.optim)

    def bind_step(self, graphdef):
        """models/gpt/training.py's train_step with nanoGPT's clipping and get_lr (logged)."""
        return functools.partial(
            train_step, graphdef, grad_clip=self.optim.grad_clip, lr=self.lr_fn
        )

    # --- eval -------------------------------------------------------------------------------
    def eval_step(self, state, batch):
        return eval_step(self.eval_graphdef, state, batch)

    def eval_metrics(self, sums: dict) -> dict:
        return {"loss": float(sums["loss"]) / float(sums["count"])}

    def evaluate(self, state, step: int) -> dict:
        """nanoGPT's estimate_loss (data.eval_iters batches per split, dropout off) + a sample."""
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
                num_batches=self.data_cfg.eval_iters,
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

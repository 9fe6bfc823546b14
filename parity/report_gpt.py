"""`python -m parity gpt [--dtype float32|float64|bfloat16]`: nanoGPT module-by-module parity.

Builds a small nanoGPT in PyTorch (parity/gpt_torch.py), copies its weights into the NNX port with
`models.gpt.from_torch`, runs one batch through both and prints, for every module output
(embeddings, each block's ln_1 / attn / ln_2 / mlp, ln_f, logits, loss), the largest absolute and
relative difference against the tolerance for that dtype. Exit status 1 if any row fails.

The capture helpers are shared with tests/test_gpt_forward.py.
"""

from __future__ import annotations

import argparse
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from models.gpt import GPTConfig, from_torch
from parity import gpt_torch
from parity.compare import BFLOAT16, FLOAT32, FLOAT64, compare, format_table

TOLERANCES = {"float64": FLOAT64, "float32": FLOAT32, "bfloat16": BFLOAT16}
SMALL = dict(block_size=32, vocab_size=65, n_layer=2, n_head=4, n_embd=64, dropout=0.0, bias=True)


def torch_activations(model: gpt_torch.GPT, idx, targets, *, autocast_bf16=False) -> dict:
    """Run the torch model once, recording every module output named as in `jax_activations`."""
    acts, hooks = {}, []

    def keep(name):
        def hook(_module, _inputs, output):
            acts[name] = output.detach()

        return hook

    tr = model.transformer
    hooks.append(tr.drop.register_forward_hook(keep("embeddings")))
    for i, block in enumerate(tr.h):
        for part in ("ln_1", "attn", "ln_2", "mlp"):
            hooks.append(getattr(block, part).register_forward_hook(keep(f"h.{i}.{part}")))
    hooks.append(tr.ln_f.register_forward_hook(keep("ln_f")))
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast_bf16 else contextlib.nullcontext()
    try:
        with torch.no_grad(), ctx:
            logits, loss = model(idx, targets)
    finally:
        for h in hooks:
            h.remove()
    acts["logits"], acts["loss"] = logits.detach(), loss.detach()
    return acts


def jax_activations(model, idx, targets) -> dict:
    """The same outputs from the NNX port: each submodule called in the order GPT.hidden uses;
    logits and loss come from the model's own __call__ (so the composition is checked too)."""
    acts = {}
    T = idx.shape[1]
    x = model.drop(model.wte(idx) + model.wpe(jnp.arange(T))[None])
    acts["embeddings"] = x
    for i, block in enumerate(model.h):
        acts[f"h.{i}.ln_1"] = block.ln_1(x)
        acts[f"h.{i}.attn"] = block.attn(acts[f"h.{i}.ln_1"])
        x = x + acts[f"h.{i}.attn"]
        acts[f"h.{i}.ln_2"] = block.ln_2(x)
        acts[f"h.{i}.mlp"] = block.mlp(acts[f"h.{i}.ln_2"])
        x = x + acts[f"h.{i}.mlp"]
    acts["ln_f"] = model.ln_f(x)
    acts["logits"], acts["loss"] = model(idx, targets)
    return acts


def build_pair(cfg_kwargs: dict, dtype: str, *, seed: int = 0, flash: bool = True):
    """A torch nanoGPT with seeded random weights and the NNX port holding the same weights."""
    torch.manual_seed(seed)
    tmodel = gpt_torch.GPT(gpt_torch.GPTConfig(**cfg_kwargs, flash=flash))
    if dtype == "float64":
        tmodel = tmodel.double()
    tmodel.eval()
    jmodel = from_torch(tmodel.state_dict(), GPTConfig(**cfg_kwargs, dtype=dtype))
    jmodel.eval()
    return tmodel, jmodel


def batch(cfg_kwargs: dict, *, batch_size=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (batch_size, cfg_kwargs["block_size"])
    idx = torch.randint(0, cfg_kwargs["vocab_size"], shape, generator=g)
    targets = torch.randint(0, cfg_kwargs["vocab_size"], shape, generator=g)
    return idx, targets


def run(dtype: str, cfg_kwargs: dict | None = None, seed: int = 0, flash: bool = True):
    """-> list of Comparisons, one per module output (torch flash or manual attention path)."""
    cfg_kwargs = dict(SMALL if cfg_kwargs is None else cfg_kwargs)
    tol = TOLERANCES[dtype]
    tmodel, jmodel = build_pair(cfg_kwargs, dtype, seed=seed, flash=flash)
    idx, targets = batch(cfg_kwargs, seed=seed)
    t_acts = torch_activations(tmodel, idx, targets, autocast_bf16=dtype == "bfloat16")
    # one compiled program rather than op-by-op dispatch (each eager op compiles on first use)
    j_acts = nnx.jit(jax_activations)(
        jmodel, jnp.asarray(idx.numpy()), jnp.asarray(targets.numpy())
    )
    return [
        compare(name, np.asarray(j_acts[name], np.float64), t_acts[name], tol) for name in t_acts
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity gpt", description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=sorted(TOLERANCES), default="float32")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    jax.config.update("jax_default_matmul_precision", "highest")  # torch CPU fp32 matmuls are exact
    ctx = jax.enable_x64(True) if args.dtype == "float64" else contextlib.nullcontext()
    with ctx:
        rows = run(args.dtype, seed=args.seed)
    print(f"nanoGPT parity, dtype={args.dtype}, config={SMALL}")
    print(format_table(rows))
    return int(any(not r.passed for r in rows))

"""`python -m parity gpt [--dtype float32|float64|bfloat16] [--device cpu|cuda]`: nanoGPT
module-by-module parity.

Builds a small nanoGPT in PyTorch (parity/gpt_torch.py), copies its weights into the NNX port with
`parity.gpt_params.from_torch`, runs one batch through both and prints, for every module output
(embeddings, each block's ln_1 / attn / ln_2 / mlp, ln_f, logits, loss), the largest absolute and
relative difference against the tolerance for that dtype. Exit status 1 if any row fails.

The captures are parity.capture's (torch forward hooks; the port's module calls intercepted from
the outside), shared with tests/test_gpt_forward.py. The generic command compares every module
and the gradients: `python -m parity diff parity.report_gpt:torch_factory
parity.report_gpt:nnx_factory --rename =transformer --grads` (docs/porting_your_model.md).

`--device cuda` runs the torch side on the GPU (its flash SDPA and cuBLAS kernels, autocast on
CUDA) while the port runs on JAX's default backend (with a GPU, `attention_impl="auto"` is cuDNN
in bfloat16): the same table, GPU kernels on both sides. The tolerances are the CPU's.
"""

from __future__ import annotations

import argparse
import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import torch

from models.gpt import GPTConfig
from parity import gpt_torch
from parity.capture import capture_nnx, capture_torch, prefix_rename
from parity.compare import BFLOAT16, FLOAT32, FLOAT64, compare, format_table
from parity.gpt_params import from_torch
from parity.keymap import param_dtype

TOLERANCES = {"float64": FLOAT64, "float32": FLOAT32, "bfloat16": BFLOAT16}
SMALL = dict(block_size=32, vocab_size=65, n_layer=2, n_head=4, n_embd=64, dropout=0.0, bias=True)


# torch's `transformer` ModuleDict is flattened in the port: these port paths gain its prefix
RENAME = prefix_rename({k: f"transformer.{k}" for k in ("wte", "wpe", "drop", "h", "ln_f")})
_ROW = re.compile(r"transformer\.(drop|ln_f|h\.\d+\.(ln_1|attn|ln_2|mlp))")


def _select(path: str) -> bool:
    """The report's rows: the embeddings (the dropout after them), each block's four parts,
    ln_f, and the model itself (logits and loss)."""
    return path == "" or _ROW.fullmatch(path) is not None


def _named(calls) -> dict:
    """A capture (parity.capture) as the report's rows, in call order."""
    acts = {}
    for c in calls:
        if c.path == "":
            acts["logits"], acts["loss"] = c.outputs
        else:
            name = c.path.removeprefix("transformer.")
            acts["embeddings" if name == "drop" else name] = c.outputs[0]
    return acts


def torch_activations(model: gpt_torch.GPT, idx, targets, *, autocast_bf16=False) -> dict:
    """Run the torch model once, recording every module output named as in `jax_activations`
    (parity.capture: forward hooks), on the device the model and the batch are on."""
    ctx = torch.autocast(idx.device.type, dtype=torch.bfloat16) if autocast_bf16 else None
    cap = capture_torch(model, (idx, targets), select=_select, context=ctx)
    return _named(cap.calls)


def jax_activations(model, idx, targets, *, jit: bool = False) -> dict:
    """The same outputs from the NNX port, intercepted from outside the model while its own
    __call__ runs (parity.capture), so the composition is checked too."""
    cap = capture_nnx(model, (idx, targets), select=_select, rename=RENAME, jit=jit)
    return _named(cap.calls)


def torch_factory():
    """TORCH_FACTORY for `python -m parity diff`: the SMALL nanoGPT, seeded, and one batch."""
    torch.manual_seed(0)
    return gpt_torch.GPT(gpt_torch.GPTConfig(**SMALL)), batch(SMALL)


def nnx_factory(torch_module):
    """NNX_FACTORY: the port through its own converter (parity/gpt_params.py), in torch's dtype."""
    cfg = GPTConfig(**SMALL, dtype=param_dtype(torch_module))
    return from_torch(torch_module.state_dict(), cfg)


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


def run(
    dtype: str, cfg_kwargs: dict | None = None, seed: int = 0, flash: bool = True, device="cpu"
):
    """-> list of Comparisons, one per module output (torch flash or manual attention path);
    `device`: where the torch side runs."""
    cfg_kwargs = dict(SMALL if cfg_kwargs is None else cfg_kwargs)
    tol = TOLERANCES[dtype]
    tmodel, jmodel = build_pair(cfg_kwargs, dtype, seed=seed, flash=flash)
    idx, targets = batch(cfg_kwargs, seed=seed)
    t_acts = torch_activations(
        tmodel.to(device), idx.to(device), targets.to(device), autocast_bf16=dtype == "bfloat16"
    )
    # one compiled program rather than op-by-op dispatch (each eager op compiles on first use)
    j_acts = jax_activations(
        jmodel, jnp.asarray(idx.numpy()), jnp.asarray(targets.numpy()), jit=True
    )
    return [
        compare(name, np.asarray(j_acts[name], np.float64), t_acts[name], tol) for name in t_acts
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity gpt", description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=sorted(TOLERANCES), default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="the torch side's")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here")
    jax.config.update("jax_default_matmul_precision", "highest")  # torch CPU fp32 matmuls are exact
    ctx = jax.enable_x64(True) if args.dtype == "float64" else contextlib.nullcontext()
    with ctx:
        rows = run(args.dtype, seed=args.seed, device=args.device)
    dev = jax.devices()[0]
    print(f"nanoGPT parity, dtype={args.dtype}, torch on {args.device}, JAX on "
          f"{dev.platform} ({dev.device_kind}), config={SMALL}")  # fmt: skip
    print(format_table(rows))
    return int(any(not r.passed for r in rows))

"""Analytic FLOP counts per training step, and the peak FLOP/s they are divided by for MFU.

Only matrix multiplies are counted (2·m·n·k each); norms, activations, the optimiser and the
embedding gathers are left out, as in nanoGPT's `estimate_mfu` and the PaLM appendix B convention.
A backward pass costs twice its forward (grad w.r.t. the input and w.r.t. the weight), so a
matmul that is differentiated costs 3x its forward and one run under no_grad costs 1x.

GPT uses nanoGPT's own cost model (its `estimate_mfu`) so that our MFU is comparable with the
published anchors: 6·N + 12·L·H·Q·T per token with T = block_size (non-causal attention factor and
all).

TRM has no published formula; ours follows the recursion (docs/porting_trm.md): one train step is
ONE ACT step of the whole batch, in which the L_level blocks run H_cycles·(L_cycles + 1)·L_layers
times (42 for Sudoku), the first H_cycles - 1 cycles without gradient and the last one with it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Mapping

# Dense bf16 peak FLOP/s per chip without sparsity (vendor figures).
# Keys are matched as lower-case substrings of the device name that torch/jax report.
PEAK_BF16_FLOPS = {
    "h200": 989e12,
    "h100": 989e12,  # SXM; the PCIe card is 756e12: pass --peak-flops for it
    "a100": 312e12,
    "l40s": 362e12,
    "a10g": 125e12,
    "rtx 4090": 165e12,
    "tpu v4": 275e12,
    "tpu v5 lite": 197e12,
    "tpu v5e": 197e12,
    "tpu v6": 918e12,
}


def _as_dict(cfg) -> dict:
    if isinstance(cfg, Mapping):
        return dict(cfg)
    if dataclasses.is_dataclass(cfg):
        return dataclasses.asdict(cfg)
    return dict(vars(cfg))


# ----------------------------------------------------------------------------------------------
# nanoGPT


def gpt_num_params(cfg, *, non_embedding: bool = True) -> int:
    """Parameter count of nanoGPT's GPT (tied wte/lm_head counted once); without wpe by default,
    which is what `get_num_params()` returns and what the 6N term uses."""
    c = _as_dict(cfg)
    C, L, V, T = c["n_embd"], c["n_layer"], c["vocab_size"], c["block_size"]
    bias = c.get("bias", True)
    per_layer = 12 * C * C + 2 * C  # attn 4C², mlp 8C², two LayerNorm weights
    if bias:
        per_layer += 3 * C + C + 4 * C + C + 2 * C  # c_attn, attn c_proj, c_fc, mlp c_proj, 2 LN
    n = V * C + L * per_layer + C + (C if bias else 0)  # wte + blocks + ln_f
    if not non_embedding:
        n += T * C
    return n


def gpt_flops_per_token(cfg) -> int:
    """nanoGPT `estimate_mfu`: 6·N + 12·L·H·Q·T with T = block_size."""
    c = _as_dict(cfg)
    L, H, T = c["n_layer"], c["n_head"], c["block_size"]
    Q = c["n_embd"] // H
    return 6 * gpt_num_params(c) + 12 * L * H * Q * T


def gpt_flops_per_step(cfg, batch_size: int, grad_accum: int = 1) -> int:
    """FLOPs of one optimiser step of `batch_size · grad_accum` sequences of block_size tokens."""
    c = _as_dict(cfg)
    return gpt_flops_per_token(c) * c["block_size"] * batch_size * grad_accum


# ----------------------------------------------------------------------------------------------
# TRM


def _swiglu_inter(width: int, expansion: float) -> int:
    # upstream: round(expansion * width * 2/3) with Python's round, then up to a multiple of 256
    inter = round(expansion * width * 2 / 3)
    return -(inter // -256) * 256


def trm_block_flops(cfg) -> int:
    """Forward FLOPs of one L_level block on ONE sequence of total_len positions."""
    c = _as_dict(cfg)
    D = c["hidden_size"]
    S = trm_total_len(c)
    e = c.get("expansion", 4)
    channel_mlp = 6 * S * D * _swiglu_inter(D, e)  # gate_up (D -> 2I) + down (I -> D)
    # the transformers_baseline's blocks are attention blocks whatever mlp_t says
    if c.get("mlp_t", False) and c.get("arch", "trm") != "transformers_baseline":
        token_mlp = 6 * D * S * _swiglu_inter(S, e)  # same SwiGLU along the token axis
        return token_mlp + channel_mlp
    H = c["num_heads"]
    inner = H * (D // H)
    qkv = 2 * S * D * 3 * inner
    scores_and_values = 2 * 2 * H * S * S * (D // H)  # QK^T and PV
    o_proj = 2 * S * inner * D
    return qkv + scores_and_values + o_proj + channel_mlp


def trm_total_len(cfg) -> int:
    c = _as_dict(cfg)
    ndim, hidden = c.get("puzzle_emb_ndim", 0), c["hidden_size"]
    if ndim <= 0:
        prefix = 0
    elif c.get("puzzle_emb_len", 16) == 0:
        prefix = -(ndim // -hidden)
    else:
        prefix = c.get("puzzle_emb_len", 16)
    return c["seq_len"] + prefix


def trm_flops_per_step(cfg, batch_size: int) -> dict:
    """FLOPs of one TRM train step (one ACT step of `batch_size` slots), split by where they go.

    Returns a dict with `blocks_no_grad` (first H_cycles-1 cycles, forward only), `blocks_grad`
    (last cycle, forward + backward = 3x), `heads` (lm_head on seq_len positions and q_head on the
    first prefix position, 3x) and `total`.
    """
    c = _as_dict(cfg)
    D, V = c["hidden_size"], c["vocab_size"]
    per_cycle = (c["L_cycles"] + 1) * c["L_layers"]
    block = trm_block_flops(c)
    blocks_no_grad = (c["H_cycles"] - 1) * per_cycle * block
    blocks_grad = 3 * per_cycle * block
    heads = 3 * (2 * c["seq_len"] * D * V + 2 * D * 2)
    out = {
        "block_applications": c["H_cycles"] * per_cycle,
        "blocks_no_grad": blocks_no_grad * batch_size,
        "blocks_grad": blocks_grad * batch_size,
        "heads": heads * batch_size,
    }
    out["total"] = out["blocks_no_grad"] + out["blocks_grad"] + out["heads"]
    return out


# ----------------------------------------------------------------------------------------------
# Peak FLOP/s


def peak_flops_for_device_name(name: str) -> float | None:
    low = name.lower()
    for key, value in PEAK_BF16_FLOPS.items():
        if key in low:
            return value
    return None


def measure_cpu_peak_flops(n: int = 1024, repeats: int = 8, dtype: str = "float32") -> float:
    """Best observed FLOP/s of an n x n x n matmul through XLA on this host's CPU.

    This is an empirical ceiling (what XLA's own best kernel reaches on every core), not a vendor
    figure; we take the max over `repeats` runs so that a busy neighbour lowers it as little as
    possible. Runs in the calling process: call it from a worker that owns jax.
    """
    import jax
    import jax.numpy as jnp

    a = jnp.ones((n, n), dtype=dtype)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1

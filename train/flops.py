"""Analytic FLOPs of one training step, and the peak FLOP/s they are divided by for MFU.

The one FLOP counter of the project: the trainer's `mfu` metric (train/task.py, train/trainer.py),
the AOT report (train/aot.py) and the benchmarks (bench/) all read it.

Only matrix multiplies are counted (2 FLOPs per multiply-add); norms, activations, softmax, the
optimiser and embedding gathers are left out, as in nanoGPT's `estimate_mfu` and PaLM's appendix B.
XLA's cost_analysis counts a scan/while body once, so the counts are worked out by hand (as
MaxText does). A backward pass costs twice its forward (gradients w.r.t. inputs and weights): a
matmul that is differentiated costs 3x its forward, one under stop_gradient (upstream's
torch.no_grad) 1x.

GPT: nanoGPT's own cost model, 6·N + 12·L·H·Q·T per token with T = block_size (its non-causal
attention term included), so our MFU compares with nanoGPT's published numbers.

TRM family (one train step = ONE ACT step of the whole batch; docs/porting_trm.md):
  trm, trm_singlez, trm_hier6: H_cycles x (L_cycles + 1) calls of the L network (L_layers blocks);
      the first H_cycles - 1 cycles forward only, the last one forward + backward.
  hrm: per cycle L_cycles L-calls (L_layers blocks) + 1 H-call (H_layers blocks); only the final
      L-call and H-call get gradients.
  transformers_baseline: its H_layers attention blocks once, with gradient (mlp_t ignored).
  Heads: lm_head on the seq_len answer positions, q_head (2 outputs) on the first position, x3.
  Target Q (hrm, and the trm variants with no_ACT_continue=False): a second forward of the whole
      recursion on the new carry, whose q_head output is the Q-learning target (its logits are
      unused and XLA drops that lm_head).
Widths come from TRMConfig itself (total_len, head_dim, block_mlp_t) and the SwiGLU rule from
models/trm/config.py, so the count follows the model's own definitions.
"""

from __future__ import annotations

import math
import time

from models.gpt.modeling import abstract_gpt
from models.trm.config import TRMConfig, swiglu_intermediate

# ----------------------------------------------------------------------------------------------
# Peak FLOP/s

# Dense bf16 peak FLOP/s per chip, without sparsity (vendor datasheets). Matched by `peak_flops_for`
# against a jax device_kind ("NVIDIA H100 80GB HBM3", "TPU v5 lite"), an nvidia-smi name
# ("NVIDIA A100-SXM4-40GB") or a short preset ("A100", "TPUv4"): case, spaces, '-' and '_' are
# ignored, and the longest name found in the given one wins ("H100 PCIe" before "H100").
PEAK_FLOPS = {
    "H100 PCIe": 756e12,
    "H100": 989e12,  # SXM
    "H200": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "RTX 4090": 165e12,
    "TPU v3": 123e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,  # v5e's device_kind
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,  # v6e's device_kind
    "TPU v6e": 918e12,
}


def _folded(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch not in " -_")


def peak_flops_for(name: str) -> float | None:
    """Datasheet peak FLOP/s of the chip called `name` (see PEAK_FLOPS), None when unknown."""
    folded = _folded(name)
    for key in sorted(PEAK_FLOPS, key=lambda k: -len(_folded(k))):
        if _folded(key) in folded:
            return PEAK_FLOPS[key]
    return None


def measure_matmul_flops(device=None, n: int = 1024, repeats: int = 8) -> float:
    """Best observed FLOP/s of an n x n x n float32 matmul through XLA on `device` (default: the
    first). An empirical ceiling for a chip without a datasheet number (a CPU): the fastest of
    `repeats` runs, so a busy neighbour lowers it as little as possible."""
    import jax  # lazy: bench's PyTorch workers import this module and never load jax
    import jax.numpy as jnp

    device = device or jax.devices()[0]
    a = jax.device_put(jnp.ones((n, n), jnp.float32), device)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


_measured: dict[str, float] = {}


def peak_flops(device=None) -> float:
    """Peak FLOP/s of one jax device: its datasheet figure by device_kind, else (a CPU) the
    measured `measure_matmul_flops` rate, measured once per process. CPU "MFU" then reads as the
    fraction of the best matmul throughput this machine showed, not of a datasheet peak."""
    import jax  # lazy, as above

    device = device or jax.devices()[0]
    peak = peak_flops_for(device.device_kind)
    if peak is None:
        if device.device_kind not in _measured:
            _measured[device.device_kind] = measure_matmul_flops(device)
        peak = _measured[device.device_kind]
    return peak


# ----------------------------------------------------------------------------------------------
# nanoGPT


def gpt_flops_per_token(config) -> int:
    """nanoGPT's `estimate_mfu` cost: 6·N + 12·L·H·Q·T, N = GPT.get_num_params() (without wpe),
    T = block_size. `config`: a GPTConfig or a GPT."""
    model = config if hasattr(config, "get_num_params") else abstract_gpt(config)
    config = model.config
    L, H, T = config.n_layer, config.n_head, config.block_size
    Q = config.n_embd // H
    return 6 * model.get_num_params() + 12 * L * H * Q * T


def gpt_flops_per_step(config, batch_size: int, grad_accum: int = 1) -> int:
    """One optimiser step over `grad_accum` micro-batches of `batch_size` block_size sequences."""
    config = getattr(config, "config", config)
    return gpt_flops_per_token(config) * config.block_size * batch_size * grad_accum


def estimate_mfu(config, fwdbwd_per_iter: int, dt: float, peak_flops=312e12) -> float:
    """nanoGPT's `GPT.estimate_mfu`: (flops_per_token · T · fwdbwd_per_iter / dt) / peak.

    `peak_flops` is FLOP/s per device or a chip name for `peak_flops_for` ('A100', 'H100',
    'TPUv4', ...). nanoGPT fixes it at the A100's 312e12 (hence its MFU > 100% on an H100).
    """
    config = getattr(config, "config", config)
    if isinstance(peak_flops, str):
        peak = peak_flops_for(peak_flops)
        if peak is None:
            raise KeyError(f"unknown peak_flops preset {peak_flops!r}; known: {sorted(PEAK_FLOPS)}")
    else:
        peak = float(peak_flops)
    return gpt_flops_per_step(config, fwdbwd_per_iter) / dt / peak


# ----------------------------------------------------------------------------------------------
# TRM family


def trm_block_flops(config: TRMConfig) -> int:
    """Forward FLOPs of one block on ONE example (all total_len positions)."""
    S, D, e = config.total_len, config.hidden_size, config.expansion
    channel_mlp = 6 * S * D * swiglu_intermediate(D, e)  # gate_up (D -> 2I) + down (I -> D)
    if config.block_mlp_t:
        return 6 * D * S * swiglu_intermediate(S, e) + channel_mlp  # the same along the tokens
    inner = config.num_heads * config.head_dim  # 504 for the baseline's 12 heads at 512
    qkv = 2 * S * D * 3 * inner
    scores_and_values = 2 * 2 * S * S * inner  # QK^T and PV
    o_proj = 2 * S * inner * D
    return qkv + scores_and_values + o_proj + channel_mlp


def trm_flops_breakdown(config: TRMConfig, batch_size: int) -> dict:
    """FLOPs of one train step (one ACT step of `batch_size` slots), split by where they go:
    `block_applications` (blocks run by one recursion), `blocks_no_grad` (forward only),
    `blocks_grad` (forward + backward, 3x), `heads` (lm_head + q_head, 3x), `target_q` (the
    second forward for the Q target, 0 when the arch has none) and `total`."""
    c = config
    if c.arch == "hrm":
        L_call, H_call = c.L_layers, c.H_layers
        applications = c.H_cycles * (c.L_cycles * L_call + H_call)
        with_grad = L_call + H_call
    elif c.arch == "transformers_baseline":
        applications = with_grad = c.H_layers
    else:  # trm, trm_singlez, trm_hier6
        applications = c.H_cycles * (c.L_cycles + 1) * c.L_layers
        with_grad = (c.L_cycles + 1) * c.L_layers
    block = trm_block_flops(c)
    lm_head = 2 * c.seq_len * c.hidden_size * c.vocab_size
    q_head = 2 * c.hidden_size * 2
    # TRM's own rule for the second inner call (models/trm/models.py); the baseline computes it only
    # when asked (compute_target_q), which the train step does not
    target = c.arch == "hrm" or (c.arch != "transformers_baseline" and not c.no_ACT_continue)
    out = {
        "block_applications": applications,
        "blocks_no_grad": (applications - with_grad) * block * batch_size,
        "blocks_grad": 3 * with_grad * block * batch_size,
        "heads": 3 * (lm_head + q_head) * batch_size,
        "target_q": (applications * block + q_head) * batch_size if target else 0,
    }
    out["total"] = out["blocks_no_grad"] + out["blocks_grad"] + out["heads"] + out["target_q"]
    return out


def trm_flops_per_step(config: TRMConfig, batch_size: int) -> int:
    """Total FLOPs of one TRM-family train step (`trm_flops_breakdown`'s total)."""
    return trm_flops_breakdown(config, batch_size)["total"]

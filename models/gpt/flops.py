"""nanoGPT's FLOP count of one training step: its own cost model, 6·N + 12·L·H·Q·T per token
with T = block_size (the non-causal attention term included), so our MFU compares with nanoGPT's
published numbers (its `estimate_mfu`).

Only matrix multiplies are counted (2 FLOPs per multiply-add), backward = 2x forward, as in
nanoGPT's `estimate_mfu` and PaLM's appendix B. The trainer divides the count by a chip's peak
(train/flops.py) for its `mfu` metric; the AOT report and the benchmarks read the same count.
"""

from __future__ import annotations

from models.gpt.modeling import abstract_gpt


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

"""Analytic FLOP count of one TRM/HRM training step (one ACT step), for MFU.

XLA's cost_analysis counts a scan/while body once, so MFU comes from counting matmuls by hand
(as MaxText does). Counted: every matmul (2 FLOPs per multiply-add) of the blocks, attention
scores/values, and lm_head; elementwise ops, norms and softmax are ignored (standard practice).
Backward = 2x forward, and only where gradients flow:
  TRM: H_cycles x (L_cycles + 1) calls of the L_level network per ACT step; the first
       H_cycles - 1 cycles run without gradient (upstream torch.no_grad -> forward only), the last
       cycle and the heads run forward + backward (x3).
  HRM: per cycle L_cycles L-calls + 1 H-call; only the final L-call and H-call get gradients.
"""

from __future__ import annotations


def _find_multiple(a: int, b: int) -> int:
    return -(a // -b) * b


def _swiglu(width: int, expansion: float) -> tuple[int, int]:
    return width, _find_multiple(round(expansion * width * 2 / 3), 256)


def block_flops(cfg) -> float:
    """Forward FLOPs of one block on ONE example (all positions)."""
    S, D = cfg.total_len, cfg.hidden_size
    w, inter = _swiglu(D, cfg.expansion)
    mlp = 2 * S * w * 2 * inter + 2 * S * inter * w  # gate_up + down over S tokens
    if cfg.block_mlp_t:  # the transformers_baseline ignores mlp_t
        wt, inter_t = _swiglu(S, cfg.expansion)
        mix = D * (2 * wt * 2 * inter_t + 2 * inter_t * wt)  # token mixing, for each channel
    else:
        hd, nh = cfg.head_dim, cfg.num_heads
        mix = 2 * S * D * 3 * nh * hd + 2 * S * nh * hd * D + 2 * 2 * S * S * nh * hd
    return float(mlp + mix)


def trm_flops_per_step(cfg, batch_size: int) -> float:
    """Training FLOPs of one ACT step on `batch_size` examples (see module docstring)."""
    blk = block_flops(cfg)
    heads = 2.0 * cfg.seq_len * cfg.hidden_size * cfg.vocab_size
    if cfg.arch == "hrm":
        L_call, H_call = blk * cfg.L_layers, blk * cfg.H_layers
        total = cfg.H_cycles * (cfg.L_cycles * L_call + H_call)
        grad = L_call + H_call
        no_grad = total - grad
    else:
        call = blk * cfg.L_layers
        per_cycle = (cfg.L_cycles + 1) * call
        no_grad = (cfg.H_cycles - 1) * per_cycle
        grad = per_cycle
    return float(batch_size) * (no_grad + 3.0 * grad + 3.0 * heads)


def trm_eval_flops_per_step(cfg, batch_size: int) -> float:
    """Forward-only FLOPs of one ACT step (evaluation)."""
    blk = block_flops(cfg)
    heads = 2.0 * cfg.seq_len * cfg.hidden_size * cfg.vocab_size
    if cfg.arch == "hrm":
        per = cfg.H_cycles * (cfg.L_cycles * cfg.L_layers + cfg.H_layers) * blk
    else:
        per = cfg.H_cycles * (cfg.L_cycles + 1) * cfg.L_layers * blk
    return float(batch_size) * (per + heads)

"""FLOPs of one TRM-family training step (one train step = ONE ACT step of the whole batch;
docs/porting_trm.md), worked out by hand as MaxText does: XLA's cost_analysis counts a scan/while
body once.

Only matrix multiplies are counted (2 FLOPs per multiply-add); norms, activations, softmax, the
optimiser and embedding gathers are left out. A backward pass costs twice its forward (gradients
w.r.t. inputs and weights): a matmul that is differentiated costs 3x its forward, one under
stop_gradient (upstream's torch.no_grad) 1x.

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
models/trm/config.py, so the count follows the model's own definitions. The trainer divides the
count by a chip's peak (train/flops.py) for its `mfu` metric; the AOT report and the benchmarks
read the same count.
"""

from __future__ import annotations

from models.trm.config import TRMConfig, swiglu_intermediate


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
    # TRM's own rule for the second inner call (models/trm/modeling.py); the baseline computes it only
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

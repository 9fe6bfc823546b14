"""The FLOP counts (models/gpt/flops.py, models/trm/flops.py: trainer MFU, AOT report, benchmarks)
pinned to nanoGPT's published per-token cost and to hand-worked TRM, HRM and baseline steps; the
peak presets (train/flops.py)."""

from __future__ import annotations

import pytest

from models.gpt import GPTConfig
from models.gpt import flops as gpt_flops
from models.trm import TRMConfig
from models.trm import flops as trm_flops
from train import flops
from train.families.gpt.mfu import estimate_mfu

# --------------------------------------------------------------------------------------------
# GPT: nanoGPT's 6N + 12LHQT per token, T = block_size


def test_gpt_flops_match_nanogpt_published_counts():
    # N and FLOPs per token of nanoGPT's train config, the HF shape and shakespeare_char, worked
    # out by hand from nanoGPT's get_num_params and estimate_mfu (6N + 12LHQT, T = block_size).
    gpt2 = dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50304, block_size=1024, bias=False)
    assert gpt_flops.gpt_flops_per_token(GPTConfig(**gpt2)) == 854_770_176
    hf = dict(gpt2, vocab_size=50257, bias=True)
    assert gpt_flops.gpt_flops_per_token(GPTConfig(**hf)) == 855_166_464
    char = dict(n_embd=384, n_layer=6, n_head=6, vocab_size=65, block_size=256, bias=False)
    assert gpt_flops.gpt_flops_per_token(GPTConfig(**char)) == 70_958_592
    # per step: tokens x per-token cost (x accumulation micro-steps)
    assert gpt_flops.gpt_flops_per_step(GPTConfig(**char), batch_size=64) == 70_958_592 * 256 * 64
    assert gpt_flops.gpt_flops_per_step(GPTConfig(**char), 8, 5) == 70_958_592 * 256 * 40


# --------------------------------------------------------------------------------------------
# TRM family: one train step = one ACT step

# D=8, S = seq 4 + prefix: TRM's puzzle_emb_len 2, HRM and the baseline ceil(8 / 8) = 1.
_SMALL = dict(hidden_size=8, seq_len=4, puzzle_emb_ndim=8, puzzle_emb_len=2, vocab_size=5,
              num_heads=2, expansion=4, H_cycles=2, L_cycles=3, L_layers=1)  # fmt: skip
# lm_head on the 4 answer positions + q_head (2 outputs) on the first position
_HEADS_FWD = 2 * 4 * 8 * 5 + 2 * 8 * 2


def _channel_mlp(S):
    # channel inter = roundup256(round(4*8*2/3)=21) = 256: gate_up (8 -> 512) + down (256 -> 8)
    return 2 * S * 8 * 512 + 2 * S * 256 * 8


def _attention(S):
    # qkv 8 -> 24, QK^T and PV over SxS per head (2 heads of 4), o 8 -> 8
    return 2 * S * 8 * 24 + 2 * (2 * 2 * S * S * 4) + 2 * S * 8 * 8


def test_trm_block_flops_by_hand():
    cfg = TRMConfig(**_SMALL, mlp_t=True, pos_encodings="none")
    # mlp_t block, S=6: token inter = roundup256(round(4*6*2/3)=16) = 256, along the 6 positions
    token = 2 * 8 * 6 * 512 + 2 * 8 * 256 * 6
    assert trm_flops.trm_block_flops(cfg) == _channel_mlp(6) + token
    att = TRMConfig(**_SMALL, mlp_t=False)
    assert trm_flops.trm_block_flops(att) == _attention(6) + _channel_mlp(6)
    # step: (H-1)(L+1)nL blocks forward only, (L+1)nL blocks x3, heads x3; batch 3
    step = trm_flops.trm_flops_breakdown(cfg, batch_size=3)
    blk = _channel_mlp(6) + token
    assert step["block_applications"] == 2 * 4 * 1
    assert step["blocks_no_grad"] == 3 * (1 * 4 * blk)
    assert step["blocks_grad"] == 3 * (3 * 4 * blk)
    assert step["heads"] == 3 * 3 * _HEADS_FWD
    assert step["target_q"] == 0  # no_ACT_continue=True: no second inner call
    assert step["total"] == step["blocks_no_grad"] + step["blocks_grad"] + step["heads"]
    assert trm_flops.trm_flops_per_step(cfg, 3) == step["total"]


def test_trm_no_act_continue_false_counts_the_target_q_forward():
    cfg = TRMConfig(**_SMALL, mlp_t=True, pos_encodings="none", no_ACT_continue=False)
    plain = trm_flops.trm_flops_breakdown(TRMConfig(**_SMALL, mlp_t=True, pos_encodings="none"), 2)
    step = trm_flops.trm_flops_breakdown(cfg, batch_size=2)
    blk = trm_flops.trm_block_flops(cfg)
    # the second forward of all 8 block applications, and its q_head (its logits are unused)
    assert step["target_q"] == 2 * (8 * blk + 2 * 8 * 2)
    assert step["total"] == plain["total"] + step["target_q"]


def test_hrm_step_by_hand():
    cfg = TRMConfig(**_SMALL, arch="hrm", H_layers=2)
    assert cfg.total_len == 5  # HRM's prefix is ceil(ndim / hidden), whatever puzzle_emb_len says
    blk = _attention(5) + _channel_mlp(5)
    assert trm_flops.trm_block_flops(cfg) == blk
    step = trm_flops.trm_flops_breakdown(cfg, batch_size=1)
    # per cycle 3 L-calls of 1 block + 1 H-call of 2 blocks; only the last L and H call get grads
    assert step["block_applications"] == 2 * (3 * 1 + 2)
    assert step["blocks_no_grad"] == 7 * blk
    assert step["blocks_grad"] == 3 * 3 * blk
    assert step["heads"] == 3 * _HEADS_FWD
    assert step["target_q"] == 10 * blk + 2 * 8 * 2  # HRM always computes the Q target
    assert step["total"] == 26 * blk + 3 * _HEADS_FWD + 2 * 8 * 2


def test_baseline_runs_its_h_layers_once_with_gradient():
    # mlp_t is ignored by the baseline: attention blocks
    cfg = TRMConfig(**_SMALL, arch="transformers_baseline", H_layers=2, mlp_t=True)
    blk = _attention(5) + _channel_mlp(5)
    assert trm_flops.trm_block_flops(cfg) == blk
    step = trm_flops.trm_flops_breakdown(cfg, batch_size=4)
    assert step["block_applications"] == 2
    assert step["blocks_no_grad"] == 0
    assert step["blocks_grad"] == 4 * 3 * 2 * blk
    assert step["heads"] == 4 * 3 * _HEADS_FWD
    assert step["target_q"] == 0
    assert step["total"] == 4 * (6 * blk + 3 * _HEADS_FWD)


def test_trm_sudoku_counts():
    # Sudoku mlp_t (TRMConfig's defaults are Sudoku-Extreme's): 42 block applications per ACT
    # step (H_cycles 3 x (L_cycles 6 + 1) x 2 layers); token MLP width 512 for 97 positions and
    # channel width 1536 for 512 (round(4 * d * 2/3) rounded up to a multiple of 256).
    cfg = TRMConfig(mlp_t=True, pos_encodings="none")
    step = trm_flops.trm_flops_breakdown(cfg, batch_size=1)
    assert step["block_applications"] == 42
    assert trm_flops.trm_block_flops(cfg) == 6 * 97 * 512 * 1536 + 6 * 512 * 97 * 512


# --------------------------------------------------------------------------------------------
# Peak FLOP/s


def test_peak_flops_presets():
    assert flops.peak_flops_for("NVIDIA H100 80GB HBM3") == 989e12
    assert flops.peak_flops_for("NVIDIA H100 PCIe") == 756e12
    assert flops.peak_flops_for("NVIDIA A100-SXM4-40GB") == 312e12
    assert flops.peak_flops_for("TPU v4") == flops.peak_flops_for("TPUv4") == 275e12
    assert flops.peak_flops_for("TPU v5 lite") == flops.peak_flops_for("TPUv5e") == 197e12
    assert flops.peak_flops_for("some cpu") is None


def test_cpu_peak_is_measured_once():
    import jax

    cpu = jax.devices("cpu")[0]
    first = flops.peak_flops(cpu)
    assert first > 0 and flops.peak_flops(cpu) == first
    with pytest.raises(KeyError, match="unknown peak_flops preset"):
        estimate_mfu(GPTConfig(), 1, 1.0, "no such chip")

"""Torch layers with upstream's names (models/layers.py, models/sparse_embedding.py).

The port models/trm/layers.py mirrors this file function for function, in the same order.

Axis names in variable suffixes: B batch, L positions (puzzle prefix + tokens), D hidden size,
N heads, H head size, S key positions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# Width of a truncated standard normal on [-2, 2]; dividing by it gives samples of std exactly
# `std`, like upstream's trunc_normal_init_ (and Flax's variance_scaling constant).
_TRUNC_STD = 0.87962566103423978


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # upstream upcasts to float32; "at least float32" keeps a float64 run in float64
    return torch.promote_types(torch.float32, dtype)


def trunc_normal_(t: torch.Tensor, std: float) -> torch.Tensor:
    """Truncated normal on [-2std', 2std'] scaled so the samples have std exactly `std`."""
    with torch.no_grad():
        if std == 0:
            return t.zero_()
        c = std / _TRUNC_STD
        x = torch.empty(t.shape, dtype=torch.float32)
        nn.init.trunc_normal_(x, mean=0.0, std=1.0, a=-2.0, b=2.0)
        return t.copy_(x * c)


def rms_norm(hidden_states: torch.Tensor, variance_epsilon: float) -> torch.Tensor:
    """Parameter-free RMSNorm over the last axis, computed in (at least) float32."""
    dtype = hidden_states.dtype
    h = hidden_states.to(compute_dtype(dtype))
    variance = h.square().mean(-1, keepdim=True)
    return (h * torch.rsqrt(variance + variance_epsilon)).to(dtype)


def _find_multiple(a: int, b: int) -> int:
    return -(a // -b) * b


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rotary_pos_emb(q_blnh, k_blnh, cos_lh, sin_lh):
    """Non-interleaved RoPE in the tables' dtype (at least float32), cast back to q's dtype."""
    dtype = q_blnh.dtype
    q_blnh, k_blnh = q_blnh.to(cos_lh.dtype), k_blnh.to(cos_lh.dtype)
    cos_l1h, sin_l1h = cos_lh.unsqueeze(-2), sin_lh.unsqueeze(-2)  # broadcast over heads
    q_blnh = q_blnh * cos_l1h + _rotate_half(q_blnh) * sin_l1h
    k_blnh = k_blnh * cos_l1h + _rotate_half(k_blnh) * sin_l1h
    return q_blnh.to(dtype), k_blnh.to(dtype)


class CastedLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(
            trunc_normal_(torch.empty(out_features, in_features), 1 / math.sqrt(in_features))
        )
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x):
        b = self.bias.to(x.dtype) if self.bias is not None else None
        return F.linear(x, self.weight.to(x.dtype), b)


class CastedEmbedding(nn.Module):
    def __init__(self, num: int, dim: int, init_std: float, cast_to: torch.dtype):
        super().__init__()
        self.cast_to = cast_to
        self.embedding_weight = nn.Parameter(trunc_normal_(torch.empty(num, dim), init_std))

    def forward(self, ids):
        return F.embedding(ids, self.embedding_weight.to(self.cast_to))


class CastedSparseEmbedding(nn.Module):
    """`weights` is a persistent buffer; in training the gathered rows are copied into the leaf
    `local_weights` (requires_grad) whose .grad is the per-row gradient SignSGD consumes."""

    def __init__(self, num: int, dim: int, batch_size: int, init_std: float, cast_to: torch.dtype):
        super().__init__()
        self.cast_to = cast_to
        self.weights = nn.Buffer(trunc_normal_(torch.empty(num, dim), init_std), persistent=True)
        self.local_weights = nn.Buffer(
            torch.zeros(batch_size, dim, requires_grad=True), persistent=False
        )
        self.local_ids = nn.Buffer(torch.zeros(batch_size, dtype=torch.int32), persistent=False)

    def forward(self, ids):
        if not self.training:
            return self.weights[ids].to(self.cast_to)
        with torch.no_grad():
            self.local_weights.copy_(self.weights[ids])
            self.local_ids.copy_(ids)
        return self.local_weights.to(self.cast_to)


class RotaryEmbedding(nn.Module):
    def __init__(self, dim: int, max_position_embeddings: int, base: float, dtype=torch.float32):
        super().__init__()
        dt = compute_dtype(dtype)
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=dt) / dim))
        t = torch.arange(max_position_embeddings, dtype=dt)
        emb = torch.cat([torch.outer(t, inv_freq)] * 2, dim=-1)
        self.cos_cached = nn.Buffer(emb.cos(), persistent=False)
        self.sin_cached = nn.Buffer(emb.sin(), persistent=False)

    def forward(self):
        return self.cos_cached, self.sin_cached


class Attention(nn.Module):
    def __init__(self, hidden_size: int, head_dim: int, num_heads: int):
        super().__init__()
        self.head_dim, self.num_heads = head_dim, num_heads
        self.qkv_proj = CastedLinear(hidden_size, 3 * num_heads * head_dim, bias=False)
        self.o_proj = CastedLinear(num_heads * head_dim, hidden_size, bias=False)

    def forward(self, cos_sin, hidden_states):
        B, L, _ = hidden_states.shape
        N, H = self.num_heads, self.head_dim
        qkv_blnh = self.qkv_proj(hidden_states).view(B, L, 3 * N, H)
        q_blnh, k_bsnh, v_bsnh = (
            qkv_blnh[:, :, :N],
            qkv_blnh[:, :, N : 2 * N],
            qkv_blnh[:, :, 2 * N :],
        )
        if cos_sin is not None:
            q_blnh, k_bsnh = apply_rotary_pos_emb(q_blnh, k_bsnh, *cos_sin)
        # SDPA wants B N L H (upstream: einops.rearrange; docs/architecture.md, "Why these shapes")
        out_bnlh = F.scaled_dot_product_attention(
            q_blnh.transpose(1, 2), k_bsnh.transpose(1, 2), v_bsnh.transpose(1, 2), is_causal=False
        )
        # reshape (not .view): works whatever memory layout SDPA returns (upstream's .view does not)
        return self.o_proj(out_bnlh.transpose(1, 2).reshape(B, L, N * H))


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, expansion: float):
        super().__init__()
        # Python round (banker's rounding), as upstream
        inter = _find_multiple(round(expansion * hidden_size * 2 / 3), 256)
        self.gate_up_proj = CastedLinear(hidden_size, inter * 2, bias=False)
        self.down_proj = CastedLinear(inter, hidden_size, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # first half is the gate
        return self.down_proj(F.silu(gate) * up)

"""Flax NNX ports of torch.nn building blocks, written with the parity toolkit's rules: attribute
names are torch's, so `parity.keymap.load_torch` fills them from the torch module's state_dict
(torch layout kept where the name is kept: `in_proj_weight`, `weight_ih_l0`; `kernel` where the
rule transposes). No torch here: the goldens test imports this module with torch blocked.

The tests that prove them against torch, each with a deliberately wrong variant that
`python -m parity diff` names: tests/test_parity_attention.py (MultiheadAttention,
TransformerEncoderLayer), tests/test_parity_gru.py (GRU), tests/test_parity_conv_bn.py (Conv2d +
BatchNorm2d, train and eval).

Axis names in variable suffixes: B batch, T/S query/key time, E embedding, N heads, H head size
(attention) or hidden size (GRU), C channels, K kernel size.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx


def _uniform(rngs: nnx.Rngs, shape, bound: float, dtype):
    return jax.random.uniform(rngs.params(), shape, dtype, -bound, bound)


# --------------------------------------------------------------------------------- attention


class MultiheadAttention(nnx.Module):
    """torch.nn.MultiheadAttention(embed_dim, num_heads, batch_first=True), self- or
    cross-attention with equal q/k/v sizes. Returns (output, weights averaged over heads, or
    None when need_weights=False), as torch does.

    `head_major=False` and `scale_by_embed` are wrong on purpose (the tests' wrong variants)."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        param_dtype="float32",
        head_major: bool = True,
        scale_by_embed: bool = False,
        rngs: nnx.Rngs,
    ):
        E = embed_dim
        # torch keeps q, k and v stacked in one (3E, E) matrix: the name and layout are kept
        self.in_proj_weight = nnx.Param(
            _uniform(rngs, (3 * E, E), math.sqrt(6 / (4 * E)), param_dtype)
        )
        self.in_proj_bias = nnx.Param(jnp.zeros((3 * E,), param_dtype))
        self.out_proj = nnx.Linear(E, E, param_dtype=param_dtype, rngs=rngs)
        self.num_heads = num_heads
        self.head_major, self.scale_by_embed = head_major, scale_by_embed

    def _heads(self, x_bte):
        B, T, E = x_bte.shape
        N = self.num_heads
        if self.head_major:  # torch: head n holds channels [n*H, (n+1)*H)
            return x_bte.reshape(B, T, N, E // N)
        return x_bte.reshape(B, T, E // N, N).swapaxes(2, 3)

    def __call__(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights: bool = True,
        attn_mask=None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ):
        w_q, w_k, w_v = jnp.split(self.in_proj_weight[...], 3)
        b_q, b_k, b_v = jnp.split(self.in_proj_bias[...], 3)
        q_btnh = self._heads(query @ w_q.T + b_q)
        k_bsnh = self._heads(key @ w_k.T + b_k)
        v_bsnh = self._heads(value @ w_v.T + b_v)
        B, T, N, H = q_btnh.shape
        scale = 1 / math.sqrt(N * H if self.scale_by_embed else H)
        s_bnts = jnp.einsum("btnh,bsnh->bnts", q_btnh, k_bsnh) * scale
        if attn_mask is not None:  # bool: True = may not attend (torch); float: added
            s_bnts = _apply_mask(s_bnts, attn_mask)
        if key_padding_mask is not None:
            s_bnts = _apply_mask(s_bnts, key_padding_mask[:, None, None, :])
        p_bnts = jax.nn.softmax(s_bnts, axis=-1)
        y_btnh = jnp.einsum("bnts,bsnh->btnh", p_bnts, v_bsnh)
        out_bte = self.out_proj(y_btnh.reshape(B, T, N * H))
        if not need_weights:
            return out_bte, None
        return out_bte, p_bnts.mean(axis=1) if average_attn_weights else p_bnts


def _apply_mask(s, mask):
    if mask.dtype == jnp.bool_:
        return jnp.where(mask, -jnp.inf, s)
    return s + mask


class TransformerEncoderLayer(nnx.Module):
    """torch.nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout,
    batch_first=True), post-norm (norm_first=False), ReLU. `ln_eps` other than 1e-5 is wrong on
    purpose."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int,
        dropout: float = 0.1,
        *,
        param_dtype="float32",
        ln_eps: float = 1e-5,
        attention: dict | None = None,
        rngs: nnx.Rngs,
    ):
        dt = dict(param_dtype=param_dtype)
        self.self_attn = MultiheadAttention(d_model, nhead, rngs=rngs, **dt, **(attention or {}))
        self.linear1 = nnx.Linear(d_model, dim_feedforward, rngs=rngs, **dt)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)
        self.linear2 = nnx.Linear(dim_feedforward, d_model, rngs=rngs, **dt)
        norm = dict(epsilon=1e-5, use_fast_variance=False, rngs=rngs, **dt)
        self.norm1 = nnx.LayerNorm(d_model, **norm)
        self.norm2 = nnx.LayerNorm(d_model, **{**norm, "epsilon": ln_eps})
        self.dropout1 = nnx.Dropout(dropout, rngs=rngs)
        self.dropout2 = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        if src_mask is not None and src_mask.dtype == jnp.bool_:
            # torch hands the attention an additive float mask (0 / -inf), not the bool one
            src_mask = jnp.where(src_mask, -jnp.inf, 0.0).astype(src.dtype)
        attn, _ = self.self_attn(
            src, src, src, attn_mask=src_mask, key_padding_mask=src_key_padding_mask,
            need_weights=False,
        )  # fmt: skip
        x = self.norm1(src + self.dropout1(attn))
        ff = self.linear2(self.dropout(jax.nn.relu(self.linear1(x))))
        return self.norm2(x + self.dropout2(ff))


# ---------------------------------------------------------------------------------------- GRU


class GRU(nnx.Module):
    """torch.nn.GRU(input_size, hidden_size, num_layers, batch_first=True), unidirectional.
    Parameters keep torch's names and (3H, in) layouts, gates in torch's order r, z, n:

        r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
        z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
        h' = (1 - z) * n + z * h

    `reset_after=False` (r applied to h before the matmul, b_hn outside: the other GRU of the
    literature) is wrong on purpose."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        *,
        param_dtype="float32",
        reset_after: bool = True,
        rngs: nnx.Rngs,
    ):
        bound = 1 / math.sqrt(hidden_size)
        H = hidden_size
        for layer in range(num_layers):
            n_in = input_size if layer == 0 else H
            for name, shape in (
                (f"weight_ih_l{layer}", (3 * H, n_in)),
                (f"weight_hh_l{layer}", (3 * H, H)),
                (f"bias_ih_l{layer}", (3 * H,)),
                (f"bias_hh_l{layer}", (3 * H,)),
            ):
                setattr(self, name, nnx.Param(_uniform(rngs, shape, bound, param_dtype)))
        self.num_layers, self.hidden_size, self.reset_after = num_layers, H, reset_after

    def _layer(self, layer: int, x_bti, h0_bh):
        w_ih, w_hh = (
            getattr(self, f"weight_ih_l{layer}")[...],
            getattr(self, f"weight_hh_l{layer}")[...],
        )
        b_ih, b_hh = (
            getattr(self, f"bias_ih_l{layer}")[...],
            getattr(self, f"bias_hh_l{layer}")[...],
        )
        gi_tbg = jnp.swapaxes(x_bti @ w_ih.T + b_ih, 0, 1)  # the input half of every gate, all t

        def step(h_bh, gi_bg):
            i_r, i_z, i_n = jnp.split(gi_bg, 3, axis=-1)
            w_r, w_z, w_n = jnp.split(w_hh, 3)
            b_r, b_z, b_n = jnp.split(b_hh, 3)
            r = jax.nn.sigmoid(i_r + h_bh @ w_r.T + b_r)
            z = jax.nn.sigmoid(i_z + h_bh @ w_z.T + b_z)
            if self.reset_after:
                n = jnp.tanh(i_n + r * (h_bh @ w_n.T + b_n))
            else:
                n = jnp.tanh(i_n + (r * h_bh) @ w_n.T + b_n)
            h_bh = (1 - z) * n + z * h_bh
            return h_bh, h_bh

        h_bh, y_tbh = jax.lax.scan(step, h0_bh, gi_tbg)
        return jnp.swapaxes(y_tbh, 0, 1), h_bh

    def __call__(self, x_bti, h0_lbh=None):
        B = x_bti.shape[0]
        if h0_lbh is None:
            h0_lbh = jnp.zeros((self.num_layers, B, self.hidden_size), x_bti.dtype)
        finals = []
        for layer in range(self.num_layers):
            x_bti, h_bh = self._layer(layer, x_bti, h0_lbh[layer])
            finals.append(h_bh)
        return x_bti, jnp.stack(finals)  # torch: (output, h_n)


class Tagger(nnx.Module):
    """torch: ids -> Embedding -> GRU -> Linear on every step."""

    def __init__(self, vocab, dim, hidden, layers, n_out, *, param_dtype="float32", gru=None, rngs):
        dt = dict(param_dtype=param_dtype)
        self.embed = nnx.Embed(vocab, dim, rngs=rngs, **dt)
        self.gru = GRU(dim, hidden, layers, rngs=rngs, **dt, **(gru or {}))
        self.head = nnx.Linear(hidden, n_out, rngs=rngs, **dt)

    def __call__(self, ids_bt):
        y_bth, _ = self.gru(self.embed(ids_bt))
        return self.head(y_bth)


# ---------------------------------------------------------------------------- Conv2d, BatchNorm


class Conv2d(nnx.Module):
    """torch.nn.Conv2d on NCHW inputs, kernel stored HWIO as `kernel` (the key map's conv rule
    transposes torch's OIHW `weight`). `padding` is torch's symmetric padding; `flax_same=True`
    pads like padding="SAME" instead (wrong on purpose: at stride 2 "SAME" pads one pixel on
    the far side only)."""

    def __init__(
        self, c_in, c_out, k, stride=1, padding=0, *, param_dtype="float32", flax_same=False, rngs
    ):
        bound = 1 / math.sqrt(c_in * k * k)
        self.kernel = nnx.Param(_uniform(rngs, (k, k, c_in, c_out), bound, param_dtype))
        self.bias = nnx.Param(_uniform(rngs, (c_out,), bound, param_dtype))
        self.stride = stride
        self.padding = "SAME" if flax_same else [(padding, padding)] * 2

    def __call__(self, x_bchw):
        y_bchw = jax.lax.conv_general_dilated(
            x_bchw,
            self.kernel[...],
            (self.stride, self.stride),
            self.padding,
            dimension_numbers=("NCHW", "HWIO", "NCHW"),
        )
        return y_bchw + self.bias[...][:, None, None]


class BatchNorm2d(nnx.Module):
    """torch.nn.BatchNorm2d on NCHW with torch's running statistics: momentum weighs the new
    batch, the stored variance is the unbiased one. Buffers become nnx.BatchStat under torch's
    names (`running_mean`, ...), so the key map copies them as is."""

    def __init__(self, num_features, *, eps=1e-5, momentum=0.1, param_dtype="float32"):
        self.weight = nnx.Param(jnp.ones(num_features, param_dtype))
        self.bias = nnx.Param(jnp.zeros(num_features, param_dtype))
        self.running_mean = nnx.BatchStat(jnp.zeros(num_features, param_dtype))
        self.running_var = nnx.BatchStat(jnp.ones(num_features, param_dtype))
        self.num_batches_tracked = nnx.BatchStat(jnp.zeros((), jnp.int32))
        self.eps, self.momentum = eps, momentum
        self.use_running_average = False  # the attribute .train() / .eval() set

    def __call__(self, x_bchw):
        if self.use_running_average:
            mean, var = self.running_mean[...], self.running_var[...]
        else:
            mean = x_bchw.mean((0, 2, 3))
            var = ((x_bchw - mean[:, None, None]) ** 2).mean((0, 2, 3))  # biased, two-pass
            n, m = x_bchw.size // x_bchw.shape[1], self.momentum
            unbiased = var * n / (n - 1)
            self.running_mean[...] = jax.lax.stop_gradient(
                (1 - m) * self.running_mean[...] + m * mean
            )
            self.running_var[...] = jax.lax.stop_gradient(
                (1 - m) * self.running_var[...] + m * unbiased
            )
            self.num_batches_tracked[...] += 1
        x_hat = (x_bchw - mean[:, None, None]) / jnp.sqrt(var[:, None, None] + self.eps)
        return x_hat * self.weight[...][:, None, None] + self.bias[...][:, None, None]


class ConvBN(nnx.Module):
    """torch: conv1 (3->8, k3, pad 1) -> bn1 -> ReLU -> conv2 (8->8, k3, stride 2, pad 1) -> bn2.

    `bn="torch"` uses BatchNorm2d above; `bn="flax"` the stock nnx.BatchNorm on axis 1 with
    torch's eps and momentum converted (0.9 = 1 - 0.1): right in eval mode, where the running
    statistics are only read, wrong in train mode (it stores the biased batch variance)."""

    def __init__(self, *, bn: str = "torch", param_dtype="float32", flax_same=False, rngs):
        dt = dict(param_dtype=param_dtype)
        self.conv1 = Conv2d(3, 8, 3, padding=1, rngs=rngs, **dt)
        self.bn1 = self._bn(bn, 8, dt, rngs)
        self.conv2 = Conv2d(8, 8, 3, stride=2, padding=1, flax_same=flax_same, rngs=rngs, **dt)
        self.bn2 = self._bn(bn, 8, dt, rngs)

    @staticmethod
    def _bn(kind, n, dt, rngs):
        if kind == "torch":
            return BatchNorm2d(n, **dt)
        return nnx.BatchNorm(
            n, axis=1, epsilon=1e-5, momentum=0.9, use_fast_variance=False, rngs=rngs, **dt
        )

    def __call__(self, x_bchw):
        return self.bn2(self.conv2(jax.nn.relu(self.bn1(self.conv1(x_bchw)))))

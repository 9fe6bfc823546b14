"""Flax NNX counterparts of torch.nn modules that have no one-line flax twin, built from flax's own
layers so that the key map (parity/keymap.py) fills them by rule:

- `conv_transpose(...)`: an `nnx.ConvTranspose(transpose_kernel=True)` that computes
  `torch.nn.ConvTranspose1d/2d/3d` (torch's padding translated by `conv_transpose_padding`);
- `LSTM`, `GRU`, `RNN`: torch's multi-layer (and bidirectional) recurrent modules as flax's cells
  under `nnx.RNN`, with torch's call and return values;
- `MultiheadAttention`: an `nnx.MultiHeadAttention` with torch's call (masks, `batch_first`,
  `need_weights`) and return values.

Inputs and outputs keep torch's layouts (channels first for the convolution, `batch_first` for
the rest): each port is a drop-in for the torch module inside a port that mirrors a torch model.
Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx.nn.attention import dot_product_attention_weights


def _tuple(x, n: int) -> tuple[int, ...]:
    return (x,) * n if isinstance(x, int) else tuple(x)


# -------------------------------------------------------------------------------- ConvTranspose


def conv_transpose_padding(
    kernel_size, padding=0, output_padding=0, dilation=1, *, n: int = 2
) -> list[tuple[int, int]]:
    """torch's ConvTranspose padding as flax's: torch pads the stride-dilated input by
    dilation * (k - 1) - padding on each side, plus output_padding at the end, so that the layer
    is the gradient of a Conv with the same arguments; flax's ConvTranspose takes that padding
    itself, per side: [(d * (k - 1) - p, d * (k - 1) - p + output_padding), ...]."""
    k, p, op, d = (_tuple(v, n) for v in (kernel_size, padding, output_padding, dilation))
    return [(di * (ki - 1) - pi, di * (ki - 1) - pi + oi) for ki, pi, oi, di in zip(k, p, op, d)]


def conv_transpose(
    in_channels: int,
    out_channels: int,
    kernel_size,
    stride=1,
    padding=0,
    output_padding=0,
    groups: int = 1,
    bias: bool = True,
    dilation=1,
    padding_mode: str = "zeros",
    *,
    n: int = 2,
    channels_first: bool = False,
    param_dtype="float32",
    rngs: nnx.Rngs,
) -> ConvTranspose:
    """`torch.nn.ConvTranspose{n}d(...)` with the same arguments, as an `nnx.ConvTranspose` with
    `transpose_kernel=True` (torch's gradient-of-convolution semantics; its kernel is torch's
    (in, out, *k) weight as (*k, out, in), the key map's `conv` layout). It takes channels-last
    inputs, as every flax convolution does, or with `channels_first` torch's (N, C, *spatial).
    flax has no grouped transposed convolution: groups > 1 is refused in one line."""
    if groups != 1:
        raise ValueError(
            f"ConvTranspose{n}d(groups={groups}): flax's nnx.ConvTranspose has no feature groups;"
            " port it as one conv_transpose per group, or keep groups=1"
        )
    if padding_mode != "zeros":
        raise ValueError(
            f"ConvTranspose{n}d(padding_mode={padding_mode!r}): torch itself accepts only 'zeros'"
        )
    for name, value in (("padding", padding), ("output_padding", output_padding)):
        if isinstance(value, str):
            raise ValueError(f"ConvTranspose{n}d({name}={value!r}): expected an int or a tuple")
    return ConvTranspose(
        in_channels,
        out_channels,
        _tuple(kernel_size, n),
        _tuple(stride, n),
        padding=conv_transpose_padding(kernel_size, padding, output_padding, dilation, n=n),
        kernel_dilation=_tuple(dilation, n),
        use_bias=bias,
        transpose_kernel=True,
        channels_first=channels_first,
        param_dtype=param_dtype,
        rngs=rngs,
    )


class ConvTranspose(nnx.ConvTranspose):
    """nnx.ConvTranspose that, with `channels_first`, takes and returns torch's (N, C, *spatial)
    layout (the same variables: `kernel`, `bias`)."""

    def __init__(self, *args, channels_first: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.channels_first = channels_first

    def __call__(self, x):
        if not self.channels_first:
            return super().__call__(x)
        return jnp.moveaxis(super().__call__(jnp.moveaxis(x, 1, -1)), -1, 1)


# ------------------------------------------------------------------------------------ recurrent


def _linears(cell: nnx.Module, names: Sequence[str]) -> list[nnx.Linear]:
    return [getattr(cell, n) for n in names]


def _torch_uniform(bound: float):
    """torch's init of every recurrent weight and bias: U(-1/sqrt(hidden), 1/sqrt(hidden)) (also
    free of flax's orthogonal init, which has no bfloat16 kernel)."""

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def _set_bias(linear: nnx.Linear, on: bool, init, rngs: nnx.Rngs, dtype) -> None:
    """torch's recurrent cells have a bias on both sides (b_ih and b_hh); flax's cells have one
    side's only. Give the other side one, or take both away (bias=False)."""
    if on and linear.bias is None:
        linear.bias = nnx.Param(init(rngs.params(), (linear.out_features,), dtype))
        linear.use_bias = True
    elif not on:
        linear.bias = nnx.data(None)
        linear.use_bias = False


_CELLS = {
    # torch class -> (flax cell, its input-side linears, its hidden-side linears)
    "LSTM": (nnx.OptimizedLSTMCell, ("dense_i",), ("dense_h",)),
    "LSTM-split": (nnx.LSTMCell, ("ii", "if_", "ig", "io"), ("hi", "hf", "hg", "ho")),
    "GRU": (nnx.GRUCell, ("dense_i",), ("dense_h",)),
    "RNN": (nnx.SimpleCell, ("dense_i",), ("dense_h",)),
}


class _Recurrent(nnx.Module):
    """A stack of `num_layers` nnx.RNN (nnx.Bidirectional when `bidirectional`) over flax cells, in
    `layers`: torch's nn.LSTM / nn.GRU / nn.RNN, its call `module(x, hx=None)` and its return
    value `(output, h_n)` (LSTM: `(output, (h_n, c_n))`), h_n of shape
    (num_layers * directions, batch, hidden). Dropout between layers as torch's, in train mode."""

    kind = ""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        *,
        cell_kind: str | None = None,
        cell_kwargs: dict | None = None,
        param_dtype="float32",
        rngs: nnx.Rngs,
    ):
        self.hidden_size, self.num_layers = hidden_size, num_layers
        self.batch_first, self.bidirectional = batch_first, bidirectional
        self.directions = 2 if bidirectional else 1
        cls, inputs, hidden = _CELLS[cell_kind or self.kind]
        init, extra = _torch_uniform(hidden_size**-0.5), cell_kwargs or {}

        def cell(n_in):
            # dtype=None: compute in the inputs' and weights' dtype (SimpleCell defaults to float32)
            kw = dict(dtype=None, kernel_init=init, recurrent_kernel_init=init, bias_init=init)
            c = cls(n_in, hidden_size, param_dtype=param_dtype, rngs=rngs, **kw, **extra)
            for lin in _linears(c, (*inputs, *hidden)):
                _set_bias(lin, bias, init, rngs, param_dtype)
            return c

        layers = []
        for layer in range(num_layers):
            n_in = input_size if layer == 0 else hidden_size * self.directions
            time_major = not batch_first
            if bidirectional:
                layers.append(
                    nnx.Bidirectional(
                        nnx.RNN(cell(n_in), time_major=time_major, rngs=rngs),
                        nnx.RNN(cell(n_in), time_major=time_major, rngs=rngs),
                        time_major=time_major,
                        return_carry=True,
                        rngs=rngs,
                    )
                )
            else:
                layers.append(nnx.RNN(cell(n_in), time_major=time_major, rngs=rngs))
        self.layers = nnx.List(layers)
        self.drop = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x, hx=None):
        carries = []
        for layer, rnn in enumerate(self.layers):
            if layer:
                x = self.drop(x)
            first = layer * self.directions
            if self.bidirectional:
                init = self._initial(hx, first), self._initial(hx, first + 1)
                init = None if init[0] is None else init
                (fwd, bwd), x = rnn(x, initial_carry=init)
                carries += [fwd, bwd]
            else:
                carry, x = rnn(x, initial_carry=self._initial(hx, first), return_carry=True)
                carries.append(carry)
        return x, self._final(carries)

    def _initial(self, hx, index: int):
        """The initial carry of one layer and direction from torch's hx (None: zeros)."""
        if hx is None:
            return None
        return hx[index]

    def _final(self, carries):
        return jnp.stack(carries)


class GRU(_Recurrent):
    """torch.nn.GRU: flax's GRUCell (dense_i (in, 3H) with b_ih, dense_h (H, 3H) given torch's
    b_hn side bias, which sits inside r * (W_hn h + b_hn) as in torch), gates r, z, n."""

    kind = "GRU"


class RNN(_Recurrent):
    """torch.nn.RNN with tanh: flax's SimpleCell (dense_h given torch's b_hh)."""

    kind = "RNN"


class LSTM(_Recurrent):
    """torch.nn.LSTM: flax's OptimizedLSTMCell (dense_i (in, 4H) given torch's b_ih, dense_h
    (H, 4H) with b_hh, gates i, f, g, o as torch's), or with `split_gates=True` flax's LSTMCell
    (one Linear per gate and side: ii, if_, ig, io, hi, hf, hg, ho). hx = (h_0, c_0); returns
    (output, (h_n, c_n))."""

    kind = "LSTM"

    def __init__(self, *args, split_gates: bool = False, **kwargs):
        super().__init__(*args, cell_kind="LSTM-split" if split_gates else "LSTM", **kwargs)

    def _initial(self, hx, index: int):
        if hx is None:
            return None
        h0, c0 = hx
        return c0[index], h0[index]  # flax's LSTM carry is (c, h)

    def _final(self, carries):
        return jnp.stack([h for _, h in carries]), jnp.stack([c for c, _ in carries])


# ---------------------------------------------------------------------------- MultiheadAttention


class MultiheadAttention(nnx.MultiHeadAttention):
    """torch.nn.MultiheadAttention(embed_dim, num_heads, bias=True, batch_first=False, kdim,
    vdim) as flax's nnx.MultiHeadAttention (query / key / value (E, heads, head_dim), out
    (heads, head_dim, E): the key map splits torch's packed in_proj by rule), called as torch's:
    `(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False)` -> `(attn_output, attn_weights or None)`.

    Masks as torch's: bool True (or -inf in a float mask) = may not attend; a float mask with
    other values (an additive bias) is refused in one line, since flax's attention takes a
    boolean mask. torch's add_bias_kv / add_zero_attn have no counterpart here."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        *,
        param_dtype="float32",
        rngs: nnx.Rngs,
    ):
        if kdim not in (None, embed_dim) and vdim not in (None, embed_dim) and kdim != vdim:
            raise ValueError(
                f"MultiheadAttention(kdim={kdim}, vdim={vdim}): flax's key and value projections"
                " take inputs of one size"
            )
        super().__init__(
            num_heads,
            embed_dim,
            qkv_features=embed_dim,
            out_features=embed_dim,
            in_kv_features=kdim or embed_dim,
            dropout_rate=dropout,
            use_bias=bias,
            decode=False,
            attention_fn=attention,
            param_dtype=param_dtype,
            rngs=rngs,
        )
        self.batch_first = batch_first

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
        *,
        deterministic: bool | None = None,
    ):
        if not self.batch_first:  # (T, B, E) -> (B, T, E)
            query, key, value = (jnp.swapaxes(x, 0, 1) for x in (query, key, value))
        t, s = query.shape[1], key.shape[1]
        mask = _allowed(attn_mask, key_padding_mask, is_causal, self.num_heads, t, s)
        out = super().__call__(query, key, value, mask=mask, deterministic=deterministic)
        weights = None
        if need_weights:
            q, k = self.query(query), self.key(key)
            weights = dot_product_attention_weights(q, k, mask=mask)  # (B, heads, T, S)
            weights = weights.mean(axis=1) if average_attn_weights else weights
        if not self.batch_first:
            out = jnp.swapaxes(out, 0, 1)
        return out, weights


def attention(query, key, value, bias=None, mask=None, **kwargs):
    """Flax's attention written out (softmax of the scaled scores, then the weighted values) in
    the inputs' dtype: flax's default `dot_product_attention` hands a call without dropout to
    `jax.nn.dot_product_attention`, whose softmax is float32 even in a float64 run
    (docs/porting_your_model.md, "flax's MultiHeadAttention softmax is float32")."""
    kwargs.pop("is_causal", None)
    weights = dot_product_attention_weights(query, key, bias, mask, **kwargs)
    return jnp.einsum("...hqk,...khd->...qhd", weights, value, precision=kwargs.get("precision"))


def _allowed(attn_mask, key_padding_mask, is_causal: bool, heads: int, t: int, s: int):
    """torch's masks (True / -inf = masked) as flax's (B or 1, heads or 1, T, S), True = may
    attend; None when nothing is masked."""
    allowed = None
    if attn_mask is not None:
        allowed = _bool_allowed(attn_mask, "attn_mask")  # (T, S) or (B * heads, T, S)
        allowed = allowed[None, None] if allowed.ndim == 2 else allowed.reshape(-1, heads, t, s)
    elif is_causal:
        allowed = jnp.tril(jnp.ones((t, s), bool))[None, None]
    if key_padding_mask is not None:
        keep = _bool_allowed(key_padding_mask, "key_padding_mask")[:, None, None, :]
        allowed = keep if allowed is None else allowed & keep
    return allowed


def _bool_allowed(mask, name: str):
    if mask.dtype == jnp.bool_:
        return ~mask
    if not isinstance(mask, jax.core.Tracer):
        values = np.asarray(mask)
        if not np.all((values == 0) | np.isneginf(values)):
            raise ValueError(
                f"MultiheadAttention {name}: a float mask with values other than 0 and -inf (an"
                " additive bias) has no counterpart in flax's boolean mask; port it by hand"
            )
    return ~jnp.isneginf(mask)

"""TRM building blocks in Flax NNX (upstream models/layers.py, models/sparse_embedding.py).

Read beside parity/trm_torch/layers.py: the same functions and classes in the same order, with the
same names and argument orders, so weights map by rule. Weights keep the PyTorch layout (Linear:
(out, in)) so `from_torch` is a rename, never a transpose; the forward computes x @ W.T like
F.linear.

Axis names in variable suffixes: B batch, L positions (puzzle prefix + tokens), D hidden size,
N heads, H head size, S key positions.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.attention import resolve_attention_impl
from models.trm.config import swiglu_intermediate

# Width of a truncated standard normal on [-2, 2]; dividing by it gives samples of std exactly
# `std`, like upstream's trunc_normal_init_ (and Flax's variance_scaling constant).
_TRUNC_STD = 0.87962566103423978


# torch registers these as buffers; NNX needs a Variable kind that is not nnx.Param
class LatentInit(nnx.Variable):
    """H_init / L_init: persistent buffers in the forward dtype, NOT trained (not nnx.Param)."""


class PuzzleTable(nnx.Variable):
    """The per-puzzle embedding table (upstream `puzzle_emb.weights`, a buffer updated by SignSGD)."""


def compute_dtype(dtype) -> jnp.dtype:
    """Upstream upcasts to float32 inside rms_norm and RoPE; 'at least float32' keeps a float64
    run in float64 (identical for float32/bfloat16)."""
    return jnp.promote_types(jnp.float32, dtype)


def trunc_normal(key, shape, std: float, dtype=jnp.float32) -> jax.Array:
    """Truncated normal on [-2 std', 2 std'] scaled to std exactly (upstream trunc_normal_init_;
    torch fills a tensor in place, here a new array is returned)."""
    if std == 0:
        return jnp.zeros(shape, dtype)
    if isinstance(key, jax.core.Tracer) or not jax.config.jax_threefry_partitionable:
        x = jax.random.truncated_normal(key, -2.0, 2.0, shape, jnp.float32) * (std / _TRUNC_STD)
        return x.astype(dtype)
    # Eager: jax.random's jitted sampler compiles once per SHAPE (~0.5 s each on CPU, most of the
    # 10 s an eager tiny TRM took to build). With partitionable threefry (the default) element i
    # of a draw depends only on (key, i), so the first n values of a longer flat draw ARE the draw
    # of n values: draw a power-of-two bucket (a few compiles, shared by every model) and cut it.
    # Same values as the traced branch (tests/test_trm_params.py::test_eager_init_equals_traced).
    n = math.prod(shape)
    bucket = max(1 << 16, 1 << (n - 1).bit_length())
    flat = np.asarray(_scaled_trunc_normal(key, bucket, jnp.float32(std / _TRUNC_STD)))
    return jnp.asarray(flat[:n].reshape(shape).astype(jnp.dtype(dtype)))


@functools.partial(jax.jit, static_argnums=1)
def _scaled_trunc_normal(key, size: int, scale):
    return jax.random.truncated_normal(key, -2.0, 2.0, (size,), jnp.float32) * scale


def rms_norm(hidden_states, variance_epsilon: float):
    """Parameter-free RMSNorm over the last axis, computed in (at least) float32."""
    dtype = hidden_states.dtype
    h = hidden_states.astype(compute_dtype(dtype))
    variance = jnp.mean(jnp.square(h), axis=-1, keepdims=True)
    return (h * jax.lax.rsqrt(variance + variance_epsilon)).astype(dtype)


def _rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def apply_rotary_pos_emb(q_blnh, k_blnh, cos_lh, sin_lh):
    """Non-interleaved RoPE in the tables' dtype (at least float32), cast back to q's dtype."""
    dtype = q_blnh.dtype
    q_blnh, k_blnh = q_blnh.astype(cos_lh.dtype), k_blnh.astype(cos_lh.dtype)
    cos_l1h, sin_l1h = cos_lh[:, None, :], sin_lh[:, None, :]  # broadcast over heads
    q_blnh = q_blnh * cos_l1h + _rotate_half(q_blnh) * sin_l1h
    k_blnh = k_blnh * cos_l1h + _rotate_half(k_blnh) * sin_l1h
    return q_blnh.astype(dtype), k_blnh.astype(dtype)


class CastedLinear(nnx.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, *, rngs: nnx.Rngs):
        self.weight = nnx.Param(
            trunc_normal(rngs.params(), (out_features, in_features), 1.0 / math.sqrt(in_features))
        )
        self.bias = nnx.Param(jnp.zeros((out_features,), jnp.float32)) if bias else None

    def __call__(self, x):
        # F.linear with the fp32 weight cast to the input dtype first
        w = self.weight[...].astype(x.dtype)
        if self.bias is None:
            return jnp.matmul(x, w.T)
        # torch's addmm adds the bias before the single rounding to a low-precision dtype
        ct = compute_dtype(x.dtype)
        y = jnp.matmul(x, w.T, preferred_element_type=ct) + self.bias[...].astype(x.dtype).astype(
            ct
        )
        return y.astype(x.dtype)


def onehot_grad_take(weight_vd, ids, cast_to):
    """`jnp.take(weight, ids, axis=0).astype(cast_to)` whose weight gradient is a one-hot matmul
    accumulated in the weight's dtype instead of a scatter-add.

    The forward is the gather itself (bit for bit the same rows as casting first). The gradient
    of a gather is a scatter-add of every row's cotangent into its token's row; with an 11-token
    vocabulary most of a Sudoku batch's 62,208 rows land on the blank token's row, and a bf16
    scatter-add both rounds every partial sum to bf16 and is a contended compare-and-swap loop
    on a GPU (docs/porting_trm_training.md, "An embedding's gradient is a scatter"). Here the
    gradient is onehot(ids)^T @ cotangent with exact products (one-hot entries are 0 or 1) and
    sums in float32 (float64 in a float64 run), one matmul that no row contends for."""
    vocab, dtype = weight_vd.shape[0], jnp.dtype(weight_vd.dtype).name
    return _onehot_take(vocab, dtype, jnp.dtype(cast_to).name, weight_vd, ids)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _onehot_take(vocab, dtype, cast_to, weight_vd, ids):
    return jnp.take(weight_vd, ids, axis=0).astype(cast_to)


def _onehot_take_fwd(vocab, dtype, cast_to, weight_vd, ids):
    return _onehot_take(vocab, dtype, cast_to, weight_vd, ids), ids


def _onehot_take_bwd(vocab, dtype, cast_to, ids, g_nd):
    dim = g_nd.shape[-1]
    onehot_nv = jax.nn.one_hot(ids.reshape(-1), vocab, dtype=g_nd.dtype)
    grad_vd = jnp.einsum(
        "nv,nd->vd",
        onehot_nv,
        g_nd.reshape(-1, dim),
        preferred_element_type=dtype,
        # float32 cotangents as they are (a GPU's default float32 matmul rounds them to TF32)
        precision=jax.lax.Precision.HIGHEST if g_nd.dtype == jnp.float32 else None,
    )
    return grad_vd.astype(dtype), None


_onehot_take.defvjp(_onehot_take_fwd, _onehot_take_bwd)


class CastedEmbedding(nnx.Module):
    """`grad` (TRMConfig.embed_grad) picks how the weight's gradient is summed; every choice has
    the same forward: "onehot" (a one-hot matmul, float32 sums), "scatter_f32" (gather the float32
    rows, then cast: a float32 scatter-add) or "scatter_bf16" (upstream's order, cast the table
    then gather: a scatter-add in the forward dtype)."""

    def __init__(
        self, num: int, dim: int, init_std: float, cast_to, *, grad="onehot", rngs: nnx.Rngs
    ):
        self.cast_to = jnp.dtype(cast_to)
        self.grad = grad
        self.embedding_weight = nnx.Param(trunc_normal(rngs.params(), (num, dim), init_std))

    def __call__(self, ids):
        if self.grad == "onehot":
            return onehot_grad_take(self.embedding_weight[...], ids, self.cast_to)
        if self.grad == "scatter_f32":
            return jnp.take(self.embedding_weight[...], ids, axis=0).astype(self.cast_to)
        return jnp.take(self.embedding_weight[...].astype(self.cast_to), ids, axis=0)


class CastedSparseEmbedding(nnx.Module):
    """Upstream's per-puzzle table. The table is a PuzzleTable (not a Param): upstream trains it with
    sparse SignSGD on the rows of the batch. Instead of torch's `local_weights` leaf, the caller
    passes `delta` (zeros) and differentiates w.r.t. it to get the same per-row gradient."""

    def __init__(self, num: int, dim: int, cast_to):
        self.cast_to = jnp.dtype(cast_to)
        self.weights = PuzzleTable(jnp.zeros((num, dim), jnp.float32))

    def __call__(self, ids, delta=None):
        rows = jnp.take(self.weights[...], ids, axis=0)
        if delta is not None:
            rows = rows + delta.astype(rows.dtype)
        return rows.astype(self.cast_to)


def rope_tables(dim: int, max_pos: int, base: float, dtype) -> tuple[jax.Array, jax.Array]:
    """cos/sin (max_pos, dim), non-interleaved layout; recomputed (not in the state_dict)."""
    dt = compute_dtype(dtype)
    inv_freq = 1.0 / (base ** (jnp.arange(0, dim, 2, dtype=dt) / dim))
    t = jnp.arange(max_pos, dtype=dt)
    emb = jnp.concatenate([jnp.outer(t, inv_freq)] * 2, axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


class RotaryEmbedding(nnx.Module):
    """torch caches cos/sin as non-persistent buffers; here they are recomputed per call (no state,
    so nothing appears in the checkpoint either)."""

    def __init__(self, dim: int, max_position_embeddings: int, base: float, dtype=jnp.float32):
        self.dim, self.max_position_embeddings, self.base = dim, max_position_embeddings, base
        self.dtype = jnp.dtype(dtype)

    def __call__(self):
        return rope_tables(self.dim, self.max_position_embeddings, self.base, self.dtype)


class Attention(nnx.Module):
    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        *,
        attention_impl: str = "auto",
        rngs: nnx.Rngs,
    ):
        self.head_dim, self.num_heads = head_dim, num_heads
        self.attention_impl = attention_impl  # TRMConfig.attention_impl, resolved per call
        self.qkv_proj = CastedLinear(hidden_size, 3 * num_heads * head_dim, bias=False, rngs=rngs)
        self.o_proj = CastedLinear(num_heads * head_dim, hidden_size, bias=False, rngs=rngs)

    def __call__(self, cos_sin, hidden_states):
        B, L, _ = hidden_states.shape
        N, H = self.num_heads, self.head_dim
        qkv_blnh = self.qkv_proj(hidden_states).reshape(B, L, 3 * N, H)
        q_blnh, k_bsnh, v_bsnh = (
            qkv_blnh[:, :, :N],
            qkv_blnh[:, :, N : 2 * N],
            qkv_blnh[:, :, 2 * N :],
        )
        if cos_sin is not None:
            q_blnh, k_bsnh = apply_rotary_pos_emb(q_blnh, k_bsnh, *cos_sin)
        impl = resolve_attention_impl(self.attention_impl, q_blnh.dtype, H, owner="TRMConfig")
        if impl != "explicit":  # torch's SDPA picks its kernel itself; here the config picks it
            out_blnh = jax.nn.dot_product_attention(
                q_blnh, k_bsnh, v_bsnh, scale=1.0 / math.sqrt(H), implementation=impl
            )
            return self.o_proj(out_blnh.reshape(B, L, N * H))
        # SDPA (no mask, non-causal, scale 1/sqrt(H)). Like torch's flash kernels: scores and
        # softmax in at least float32, probabilities rounded to the forward dtype before the
        # product with v (accumulated in float32), output in the forward dtype.
        ct = compute_dtype(q_blnh.dtype)
        scores_bnls = jnp.einsum(
            "blnh,bsnh->bnls", q_blnh, k_bsnh, preferred_element_type=ct
        ) / math.sqrt(H)
        e_bnls = jnp.exp(scores_bnls - jnp.max(scores_bnls, axis=-1, keepdims=True))
        out_blnh = jnp.einsum(
            "bnls,bsnh->blnh", e_bnls.astype(v_bsnh.dtype), v_bsnh, preferred_element_type=ct
        )
        denom_bln = jnp.swapaxes(jnp.sum(e_bnls, axis=-1), 1, 2)
        out_blnh = (out_blnh / denom_bln[..., None]).astype(hidden_states.dtype)
        return self.o_proj(out_blnh.reshape(B, L, N * H))


class SwiGLU(nnx.Module):
    def __init__(self, hidden_size: int, expansion: float, *, split: bool = False, rngs: nnx.Rngs):
        inter = swiglu_intermediate(hidden_size, expansion)  # upstream's _find_multiple rule
        self.gate_up_proj = CastedLinear(hidden_size, inter * 2, bias=False, rngs=rngs)
        self.down_proj = CastedLinear(inter, hidden_size, bias=False, rngs=rngs)
        self.split = split  # TRMConfig.split_gate_up

    def __call__(self, x):
        if self.split:
            # Ours: two matmuls on the halves of gate_up_proj's weight. The one matmul's backward
            # concatenates the halves' gradients, a copy of a whole activation per call; here the
            # backward adds two products instead. The same values (tests/test_trm_remat_scan.py).
            w = self.gate_up_proj.weight[...].astype(x.dtype)
            inter = w.shape[0] // 2
            gate, up = jnp.matmul(x, w[:inter].T), jnp.matmul(x, w[inter:].T)
        else:
            gate, up = jnp.split(self.gate_up_proj(x), 2, axis=-1)  # first half is the gate
        # silu rounded once to the input dtype, as torch's fused F.silu (not x*sigmoid(x) in bf16)
        act = jax.nn.silu(gate.astype(compute_dtype(gate.dtype))).astype(gate.dtype)
        return self.down_proj(act * up)

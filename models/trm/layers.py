"""TRM building blocks in Flax NNX, named like upstream's models/layers.py so weights map by rule.

Weights keep the PyTorch layout (Linear: (out, in)) so `from_torch` is a rename, never a
transpose; the forward computes x @ W.T exactly like F.linear.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.attention import ATTENTION_IMPLS, cuda_compute_capability, cudnn_unsupported
from models.trm.config import swiglu_intermediate

# Width of a truncated standard normal on [-2, 2]; dividing by it gives samples of std exactly
# `std`, like upstream's trunc_normal_init_ (and Flax's variance_scaling constant).
_TRUNC_STD = 0.87962566103423978


class LatentInit(nnx.Variable):
    """H_init / L_init: persistent buffers in the forward dtype, NOT trained (not nnx.Param)."""


class PuzzleTable(nnx.Variable):
    """The per-puzzle embedding table (upstream `puzzle_emb.weights`, a buffer updated by SignSGD)."""


def trunc_normal(key, shape, std: float, dtype=jnp.float32) -> jax.Array:
    """Truncated normal on [-2 std', 2 std'] scaled to std exactly (upstream trunc_normal_init_)."""
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


def compute_dtype(dtype) -> jnp.dtype:
    """Upstream upcasts to float32 inside rms_norm and RoPE; 'at least float32' keeps a float64
    run in float64 (identical for float32/bfloat16)."""
    return jnp.promote_types(jnp.float32, dtype)


# --- intermediate capture for parity reports (eager only; a no-op otherwise) ---------------------
_TRACE: contextvars.ContextVar[list | None] = contextvars.ContextVar("trm_trace", default=None)
_TAG: contextvars.ContextVar[str] = contextvars.ContextVar("trm_tag", default="")


@contextlib.contextmanager
def capture_intermediates():
    """Collect (name, array) for the input embedding, every block call and the outputs."""
    trace: list = []
    token = _TRACE.set(trace)
    try:
        yield trace
    finally:
        _TRACE.reset(token)


@contextlib.contextmanager
def _tag(tag: str):
    token = _TAG.set(tag)
    try:
        yield
    finally:
        _TAG.reset(token)


def record(name: str, value) -> None:
    trace = _TRACE.get()
    if trace is not None:
        tag = _TAG.get()
        trace.append((f"{tag}/{name}" if tag else name, value))


# --- layers ------------------------------------------------------------------------------------
def rms_norm(h, eps: float):
    """Parameter-free RMSNorm over the last axis, computed in (at least) float32."""
    dtype = h.dtype
    h = h.astype(compute_dtype(dtype))
    variance = jnp.mean(jnp.square(h), axis=-1, keepdims=True)
    return (h * jax.lax.rsqrt(variance + eps)).astype(dtype)


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
        ct = jnp.promote_types(jnp.float32, x.dtype)
        y = jnp.matmul(x, w.T, preferred_element_type=ct) + self.bias[...].astype(x.dtype).astype(
            ct
        )
        return y.astype(x.dtype)


class CastedEmbedding(nnx.Module):
    def __init__(self, num: int, dim: int, init_std: float, cast_to, *, rngs: nnx.Rngs):
        self.cast_to = jnp.dtype(cast_to)
        self.embedding_weight = nnx.Param(trunc_normal(rngs.params(), (num, dim), init_std))

    def __call__(self, ids):
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


class SwiGLU(nnx.Module):
    def __init__(self, hidden_size: int, expansion: float, *, rngs: nnx.Rngs):
        inter = swiglu_intermediate(hidden_size, expansion)
        self.gate_up_proj = CastedLinear(hidden_size, inter * 2, bias=False, rngs=rngs)
        self.down_proj = CastedLinear(inter, hidden_size, bias=False, rngs=rngs)

    def __call__(self, x):
        gate, up = jnp.split(self.gate_up_proj(x), 2, axis=-1)  # first half is the gate
        # silu rounded once to the input dtype, as torch's fused F.silu (not x*sigmoid(x) in bf16)
        act = jax.nn.silu(gate.astype(compute_dtype(gate.dtype))).astype(gate.dtype)
        return self.down_proj(act * up)


def rope_tables(dim: int, max_pos: int, base: float, dtype) -> tuple[jax.Array, jax.Array]:
    """cos/sin (max_pos, dim), non-interleaved layout; recomputed (not in the state_dict)."""
    dt = compute_dtype(dtype)
    inv_freq = 1.0 / (base ** (jnp.arange(0, dim, 2, dtype=dt) / dim))
    t = jnp.arange(max_pos, dtype=dt)
    freqs = jnp.outer(t, inv_freq)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def _rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def apply_rotary(q_bshd, k_bshd, cos_sd, sin_sd):
    dtype = q_bshd.dtype
    q = q_bshd.astype(cos_sd.dtype)
    k = k_bshd.astype(cos_sd.dtype)
    cos, sin = cos_sd[:, None, :], sin_sd[:, None, :]  # broadcast over heads
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    return q.astype(dtype), k.astype(dtype)


def resolve_attention_impl(requested: str, dtype, head_dim: int) -> str:
    """TRMConfig.attention_impl -> the implementation this call runs: explicit | xla | cudnn.

    Resolved at trace time (backend and dtype are static there). "auto" never raises; "cudnn"
    where it cannot run raises instead of falling back silently.
    """
    if requested not in ATTENTION_IMPLS:
        raise ValueError(
            f"TRMConfig.attention_impl={requested!r}: expected one of {ATTENTION_IMPLS}"
        )
    if requested in ("explicit", "xla"):
        return requested
    why = cudnn_unsupported(dtype, head_dim, cuda_compute_capability())
    if requested == "auto":
        return "explicit" if why else "cudnn"
    if why:
        raise ValueError(
            f"TRMConfig.attention_impl='cudnn' cannot run: {why}; "
            "use 'auto' (cudnn where possible, else explicit), 'xla' or 'explicit'"
        )
    return "cudnn"


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
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.attention_impl = attention_impl  # TRMConfig.attention_impl, resolved per call
        self.qkv_proj = CastedLinear(hidden_size, 3 * num_heads * head_dim, bias=False, rngs=rngs)
        self.o_proj = CastedLinear(num_heads * head_dim, hidden_size, bias=False, rngs=rngs)

    def __call__(self, h_bsd, cos_sin):
        b, s, _ = h_bsd.shape
        nh, hd = self.num_heads, self.head_dim
        qkv = self.qkv_proj(h_bsd).reshape(b, s, 3 * nh, hd)
        q, k, v = qkv[:, :, :nh], qkv[:, :, nh : 2 * nh], qkv[:, :, 2 * nh :]
        if cos_sin is not None:
            q, k = apply_rotary(q, k, *cos_sin)
        impl = resolve_attention_impl(self.attention_impl, q.dtype, hd)
        if impl != "explicit":  # torch's SDPA picks its kernel itself; here the config picks it
            out = jax.nn.dot_product_attention(
                q, k, v, scale=1.0 / math.sqrt(hd), implementation=impl
            )
            return self.o_proj(out.reshape(b, s, nh * hd))
        # SDPA (no mask, non-causal, scale 1/sqrt(hd)). Like torch's flash kernels: scores and
        # softmax in at least float32, probabilities rounded to the forward dtype before the
        # product with v (accumulated in float32), output in the forward dtype.
        ct = compute_dtype(q.dtype)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=ct) / math.sqrt(hd)
        e = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
        out = jnp.einsum("bhqk,bkhd->bqhd", e.astype(v.dtype), v, preferred_element_type=ct)
        out = (out / jnp.swapaxes(jnp.sum(e, axis=-1), 1, 2)[..., None]).astype(h_bsd.dtype)
        return self.o_proj(out.reshape(b, s, nh * hd))


class Block(nnx.Module):
    """Post-norm block: attention + SwiGLU, or (mlp_t) a token-mixing SwiGLU + SwiGLU."""

    def __init__(self, config, *, rngs: nnx.Rngs, mlp_t: bool | None = None):
        self.norm_eps = config.rms_norm_eps
        # config.block_mlp_t: mlp_t, except for the transformers_baseline (attention blocks only)
        self.use_mlp_t = config.block_mlp_t if mlp_t is None else mlp_t
        self.remat = config.remat
        self.remat_policy = config.remat_policy
        if self.use_mlp_t:
            self.mlp_t = SwiGLU(config.total_len, config.expansion, rngs=rngs)
        else:
            self.self_attn = Attention(
                config.hidden_size,
                config.head_dim,
                config.num_heads,
                attention_impl=config.attention_impl,
                rngs=rngs,
            )
        self.mlp = SwiGLU(config.hidden_size, config.expansion, rngs=rngs)

    def _forward(self, h_bld, cos_sin):
        if self.use_mlp_t:
            h_bdl = jnp.swapaxes(h_bld, 1, 2)
            # mixes tokens, and the RMSNorm here is over the token axis L (upstream's layout)
            h_bdl = rms_norm(h_bdl + self.mlp_t(h_bdl), self.norm_eps)
            h_bld = jnp.swapaxes(h_bdl, 1, 2)
        else:
            h_bld = rms_norm(h_bld + self.self_attn(h_bld, cos_sin), self.norm_eps)
        return rms_norm(h_bld + self.mlp(h_bld), self.norm_eps)

    def __call__(self, h_bld, cos_sin=None):
        if self.remat:
            # activation checkpointing: recompute (what the policy does not keep of) the block in
            # the backward pass
            policy = getattr(jax.checkpoint_policies, self.remat_policy)
            return jax.checkpoint(lambda h, cs: self._forward(h, cs), policy=policy)(h_bld, cos_sin)
        return self._forward(h_bld, cos_sin)


class ReasoningModule(nnx.Module):
    """h <- h + injection (once), then the blocks in order. `name` labels captured outputs."""

    def __init__(self, config, num_layers: int, name: str, *, rngs: nnx.Rngs):
        self.name = name
        self.layers = nnx.List([Block(config, rngs=rngs) for _ in range(num_layers)])

    def __call__(self, h, injection=None, cos_sin=None):
        if injection is not None:
            h = h + injection
        for i, layer in enumerate(self.layers):
            h = layer(h, cos_sin)
            record(f"{self.name}.layers.{i}", h)
        return h

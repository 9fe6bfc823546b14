"""Flax NNX ports of modules of real models no one here wrote, for tests/test_parity_zoo.py and
tests/test_parity_llama.py: T5's block, Llama's decoder layer, a two-layer Qwen2 model with its
rotary module and Whisper's encoder layer (transformers), SAM's image-encoder block and its mask
decoder's upscaling path (segment-anything), EnCodec's two-layer LSTM (transformers). Written
from reading the installed packages' sources; attribute names mirror theirs so the key map fills
every variable by rule.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from parity import layers
from parity.keymap import HEADS, LINEAR_HEADS, SAME_HEADS, To, register_rule

# T5's norm is an RMSNorm (no mean, no bias): its weight is flax's scale. SAM's LayerNorm2d
# normalises the channels of NCHW maps: nnx.LayerNorm over axis 1 holds the same scale and bias.
register_rule("T5LayerNorm", {"weight": To("scale")})
register_rule("LayerNorm2d", {"weight": To("scale")})
# Llama's RMSNorm keeps its scale in `weight`. The port's attention keeps heads on their own axis:
# q_proj (heads * head_dim, hidden) is a (hidden, heads, head_dim) kernel, o_proj's input axis the
# same split (LINEAR_HEADS: transposed, then the heads * head_dim axis split head-major, as torch's
# `.view(..., heads, head_dim)`); a bias (heads * head_dim,) is (heads, head_dim) (SAME_HEADS).
# The projections' outputs (o_proj's input) are then (..., heads, head_dim): the HEADS layout.
register_rule("LlamaRMSNorm", {"weight": To("scale")})
register_rule("Qwen2RMSNorm", {"weight": To("scale")})
register_rule(
    "LlamaAttention",
    {
        **{f"{p}_proj.weight": To(f"{p}_proj.kernel", LINEAR_HEADS) for p in "qkvo"},
        **{f"{p}_proj.bias": To(f"{p}_proj.bias", SAME_HEADS) for p in "qkv"},
    },
    layout={f"{p}_proj": HEADS for p in "qkvo"},
)


# ------------------------------------------------------------------------------------------- T5


def at_least_float32(x):
    """transformers' `.to(torch.float32)` as a port writes it: float32 in a float32 or bfloat16
    run, as the reference's; float64 in a float64 run, where `python -m parity diff` runs the
    reference's casts in float64 (parity/promote.py)."""
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


class T5LayerNorm(nnx.RMSNorm):
    """transformers' T5LayerNorm: x * rsqrt(mean(x^2) + eps) * weight, the mean of squares taken
    in at least float32 whatever the input's dtype. `float32_variance=False` is flax's RMSNorm as
    it is (wrong on purpose)."""

    def __init__(self, dim, eps=1e-6, *, float32_variance=True, param_dtype, rngs):
        super().__init__(dim, epsilon=eps, param_dtype=param_dtype, rngs=rngs)
        self.float32_variance = float32_variance

    def __call__(self, x):
        if not self.float32_variance:
            return super().__call__(x)
        variance = jnp.mean(jnp.square(at_least_float32(x)), axis=-1, keepdims=True)
        h = x * jax.lax.rsqrt(variance + self.epsilon)
        scale = self.scale[...]
        if scale.dtype in (jnp.float16, jnp.bfloat16):  # back to half precision, as T5's
            h = h.astype(scale.dtype)
        return scale * h


def relative_position_bucket(
    t: int, s: int, bidirectional: bool, buckets: int, max_distance: int, dtype=np.float32
):
    """T5's bucket of each (query, key) offset, as numpy integers (shapes are static): half the
    buckets exact offsets, the rest logarithmic up to max_distance; the log in `dtype`, torch's
    `.float()` (float32, or float64 where a float64 run promotes it)."""
    rel = np.arange(s)[None, :] - np.arange(t)[:, None]
    out = np.zeros_like(rel)
    if bidirectional:
        buckets //= 2
        out += (rel > 0) * buckets
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    exact = buckets // 2
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0): those take the exact bucket
        scaled = np.log(rel.astype(dtype) / dtype(exact)) / dtype(math.log(max_distance / exact))
        large = exact + (scaled * dtype(buckets - exact)).astype(np.int64)
    large = np.minimum(large, buckets - 1)
    return out + np.where(rel < exact, rel, large)


class T5Attention(nnx.Module):
    def __init__(self, cfg, has_relative_attention_bias, *, param_dtype, rngs):
        dt = dict(use_bias=False, param_dtype=param_dtype, rngs=rngs)
        inner = cfg.num_heads * cfg.d_kv
        self.n_heads, self.d_kv = cfg.num_heads, cfg.d_kv
        self.buckets, self.max_distance = (
            cfg.relative_attention_num_buckets,
            cfg.relative_attention_max_distance,
        )
        self.q = nnx.Linear(cfg.d_model, inner, **dt)
        self.k = nnx.Linear(cfg.d_model, inner, **dt)
        self.v = nnx.Linear(cfg.d_model, inner, **dt)
        self.o = nnx.Linear(inner, cfg.d_model, **dt)
        self.relative_attention_bias = (
            nnx.Embed(self.buckets, self.n_heads, param_dtype=param_dtype, rngs=rngs)
            if has_relative_attention_bias
            else None
        )

    def compute_bias(self, t: int, s: int, dtype=jnp.float32):
        at_least_float32 = np.promote_types(dtype, np.float32).type
        bucket = relative_position_bucket(
            t, s, True, self.buckets, self.max_distance, at_least_float32
        )
        values = self.relative_attention_bias(jnp.asarray(bucket))  # (t, s, heads)
        return jnp.transpose(values, (2, 0, 1))[None]

    def __call__(self, x, mask=None, position_bias=None):
        b, t, _ = x.shape

        def heads(y):
            return y.reshape(b, t, self.n_heads, self.d_kv).transpose(0, 2, 1, 3)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        if position_bias is None:
            position_bias = self.compute_bias(t, t, x.dtype)
        scores = q @ jnp.swapaxes(k, -1, -2) + position_bias  # T5 does not scale by 1/sqrt(d)
        if mask is not None:
            scores = scores + mask
        weights = jax.nn.softmax(scores, axis=-1)
        out = (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, -1)
        return self.o(out), position_bias, weights


class T5LayerSelfAttention(nnx.Module):
    def __init__(self, cfg, has_relative_attention_bias, *, norm, param_dtype, rngs):
        self.SelfAttention = T5Attention(
            cfg, has_relative_attention_bias, param_dtype=param_dtype, rngs=rngs
        )
        self.layer_norm = T5LayerNorm(cfg.d_model, cfg.layer_norm_epsilon, **norm)
        self.dropout = nnx.Dropout(cfg.dropout_rate, rngs=rngs)

    def __call__(self, x, attention_mask=None, position_bias=None):
        out, position_bias, weights = self.SelfAttention(
            self.layer_norm(x), mask=attention_mask, position_bias=position_bias
        )
        return x + self.dropout(out), position_bias, weights


class T5DenseGatedActDense(nnx.Module):
    def __init__(self, cfg, *, tanh_gelu=True, param_dtype, rngs):
        dt = dict(use_bias=False, param_dtype=param_dtype, rngs=rngs)
        self.tanh_gelu = tanh_gelu
        self.wi_0 = nnx.Linear(cfg.d_model, cfg.d_ff, **dt)
        self.wi_1 = nnx.Linear(cfg.d_model, cfg.d_ff, **dt)
        self.wo = nnx.Linear(cfg.d_ff, cfg.d_model, **dt)
        self.dropout = nnx.Dropout(cfg.dropout_rate, rngs=rngs)

    def __call__(self, x):
        # "gated-gelu" is transformers' gelu_new: the tanh form
        gelu = jax.nn.gelu(self.wi_0(x), approximate=self.tanh_gelu)
        return self.wo(self.dropout(gelu * self.wi_1(x)))


class T5LayerFF(nnx.Module):
    def __init__(self, cfg, *, norm, tanh_gelu, param_dtype, rngs):
        self.DenseReluDense = T5DenseGatedActDense(
            cfg, tanh_gelu=tanh_gelu, param_dtype=param_dtype, rngs=rngs
        )
        self.layer_norm = T5LayerNorm(cfg.d_model, cfg.layer_norm_epsilon, **norm)
        self.dropout = nnx.Dropout(cfg.dropout_rate, rngs=rngs)

    def __call__(self, x):
        return x + self.dropout(self.DenseReluDense(self.layer_norm(x)))


class T5Block(nnx.Module):
    """An encoder block: self-attention with T5's relative position bias, then the gated
    feed-forward; returns (hidden_states, position_bias, None) as transformers' block does."""

    def __init__(self, cfg, *, float32_variance=True, tanh_gelu=True, param_dtype="float32", rngs):
        norm = dict(float32_variance=float32_variance, param_dtype=param_dtype, rngs=rngs)
        self.layer = nnx.List(
            [
                T5LayerSelfAttention(
                    cfg, True, norm=norm, param_dtype=param_dtype, rngs=rngs
                ),
                T5LayerFF(cfg, norm=norm, tanh_gelu=tanh_gelu, param_dtype=param_dtype, rngs=rngs),
            ]
        )  # fmt: skip

    def __call__(self, hidden_states, attention_mask=None):
        hidden_states, position_bias, _ = self.layer[0](hidden_states, attention_mask)
        return self.layer[1](hidden_states), position_bias, None


# ---------------------------------------------------------------------------------------- Llama


class LlamaRMSNorm(nnx.RMSNorm):
    """transformers' LlamaRMSNorm: weight * (x * rsqrt(mean(x^2) + eps)), computed in at least
    float32 and rounded back to the input's dtype before the weight."""

    def __call__(self, x):
        h = at_least_float32(x)
        h = h * jax.lax.rsqrt(jnp.mean(jnp.square(h), axis=-1, keepdims=True) + self.epsilon)
        return self.scale[...] * h.astype(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class LlamaAttention(nnx.Module):
    """Grouped-query attention with rotary tables given as inputs (cos, sin of shape
    (B, T, head_dim), as LlamaModel computes them once for every layer). Heads stay on their own
    axis: q (B, T, N, H), k and v (B, T, K, H) with K key/value heads, each serving N / K
    consecutive query heads (transformers' repeat_kv). `tile_kv`: query head n reads key head
    n % K instead (wrong on purpose)."""

    def __init__(self, cfg, *, tile_kv=False, param_dtype, rngs):
        n, k, h, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        dt = dict(use_bias=cfg.attention_bias, param_dtype=param_dtype, rngs=rngs)
        self.q_proj = nnx.LinearGeneral(d, (n, h), **dt)
        self.k_proj = nnx.LinearGeneral(d, (k, h), **dt)
        self.v_proj = nnx.LinearGeneral(d, (k, h), **dt)
        self.o_proj = nnx.LinearGeneral((n, h), d, axis=(-2, -1), **dt)
        self.groups, self.scaling, self.tile_kv = n // k, h**-0.5, tile_kv

    def __call__(self, hidden_states, position_embeddings, attention_mask=None):
        x_btd = hidden_states
        q_btnh, k_btkh, v_btkh = self.q_proj(x_btd), self.k_proj(x_btd), self.v_proj(x_btd)
        cos_bt1h, sin_bt1h = (t[:, :, None, :] for t in position_embeddings)
        q_btnh = q_btnh * cos_bt1h + rotate_half(q_btnh) * sin_bt1h
        k_btkh = k_btkh * cos_bt1h + rotate_half(k_btkh) * sin_bt1h
        k_btnh, v_btnh = self._per_query_head(k_btkh), self._per_query_head(v_btkh)
        scores_bnts = jnp.einsum("btnh,bsnh->bnts", q_btnh, k_btnh) * self.scaling
        if (
            attention_mask is not None
        ):  # additive: 0 where a key is seen, a large negative where not
            scores_bnts = scores_bnts + attention_mask
        # transformers' eager softmax is float32 (dtype=torch.float32), then cast back
        weights_bnts = jax.nn.softmax(at_least_float32(scores_bnts), axis=-1).astype(q_btnh.dtype)
        out_btnh = jnp.einsum("bnts,bsnh->btnh", weights_bnts, v_btnh)
        return self.o_proj(out_btnh), weights_bnts

    def _per_query_head(self, x_btkh):
        if self.tile_kv:  # wrong on purpose: key head n % K for query head n
            return jnp.tile(x_btkh, (1, 1, self.groups, 1))
        return jnp.repeat(x_btkh, self.groups, axis=2)  # repeat_kv: key head n // (N / K)


class LlamaMLP(nnx.Module):
    def __init__(self, cfg, *, param_dtype, rngs):
        dt = dict(use_bias=getattr(cfg, "mlp_bias", False), param_dtype=param_dtype, rngs=rngs)
        self.gate_proj = nnx.Linear(cfg.hidden_size, cfg.intermediate_size, **dt)
        self.up_proj = nnx.Linear(cfg.hidden_size, cfg.intermediate_size, **dt)
        self.down_proj = nnx.Linear(cfg.intermediate_size, cfg.hidden_size, **dt)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU


class LlamaDecoderLayer(nnx.Module):
    """transformers' LlamaDecoderLayer: pre-norm attention and SwiGLU, each with a residual.
    `post_norm_eps` replaces the config's epsilon in post_attention_layernorm (wrong on purpose
    where it differs)."""

    def __init__(self, cfg, *, post_norm_eps=None, tile_kv=False, param_dtype="float32", rngs):
        norm = dict(param_dtype=param_dtype, rngs=rngs)
        self.self_attn = LlamaAttention(cfg, tile_kv=tile_kv, param_dtype=param_dtype, rngs=rngs)
        self.mlp = LlamaMLP(cfg, param_dtype=param_dtype, rngs=rngs)
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, epsilon=cfg.rms_norm_eps, **norm)
        eps = cfg.rms_norm_eps if post_norm_eps is None else post_norm_eps
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, epsilon=eps, **norm)

    def __call__(self, hidden_states, attention_mask=None, position_embeddings=None):
        residual = hidden_states
        # by keyword, as transformers calls it: the diff then compares the attention's inputs too
        h, _ = self.self_attn(
            hidden_states=self.input_layernorm(hidden_states),
            attention_mask=attention_mask,
            position_embeddings=position_embeddings,
        )
        h = residual + h
        return h + self.mlp(self.post_attention_layernorm(h))


# ---------------------------------------------------------------------------------------- Qwen2


class Qwen2RotaryEmbedding(nnx.Module):
    """transformers' Qwen2RotaryEmbedding (default rope): cos and sin of position * inv_freq,
    inv_freq = 1 / theta^(2i / head_dim), computed in at least float32 and returned in the
    input's dtype. Computed when called from `rope_theta`, so the module carries theta: a wrong
    theta is a wrong output of this module."""

    def __init__(self, head_dim: int, rope_theta: float, attention_scaling: float = 1.0):
        self.head_dim, self.rope_theta, self.attention_scaling = (
            head_dim,
            rope_theta,
            attention_scaling,
        )

    def __call__(self, x, position_ids):
        dt = jnp.promote_types(x.dtype, jnp.float32)
        inv_freq = 1.0 / (
            self.rope_theta ** (jnp.arange(0, self.head_dim, 2, dtype=dt) / self.head_dim)
        )
        freqs_bth = position_ids[..., None].astype(dt) * inv_freq
        emb = jnp.concatenate([freqs_bth, freqs_bth], axis=-1)
        cos, sin = jnp.cos(emb) * self.attention_scaling, jnp.sin(emb) * self.attention_scaling
        return cos.astype(x.dtype), sin.astype(x.dtype)


class Qwen2Attention(nnx.Module):
    """Grouped-query attention with biased q/k/v projections (o_proj without), heads kept as
    transformers keeps them: nnx.Linear, then a reshape to (B, T, heads, head_dim). Returns
    (output, weights (B, heads, T, S)), as the eager attention does."""

    def __init__(self, cfg, *, param_dtype, rngs):
        n, k, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
        h = getattr(cfg, "head_dim", None) or d // n
        dt = dict(param_dtype=param_dtype, rngs=rngs)
        self.q_proj = nnx.Linear(d, n * h, **dt)
        self.k_proj = nnx.Linear(d, k * h, **dt)
        self.v_proj = nnx.Linear(d, k * h, **dt)
        self.o_proj = nnx.Linear(n * h, d, use_bias=False, **dt)
        self.groups, self.head_dim, self.scaling = n // k, h, h**-0.5

    def __call__(self, hidden_states, position_embeddings, attention_mask=None, **_):
        b, t, _ = hidden_states.shape

        def heads(y):
            return y.reshape(b, t, -1, self.head_dim)

        q_btnh = heads(self.q_proj(hidden_states))
        k_btkh, v_btkh = heads(self.k_proj(hidden_states)), heads(self.v_proj(hidden_states))
        cos_bt1h, sin_bt1h = (x[:, :, None, :] for x in position_embeddings)
        q_btnh = q_btnh * cos_bt1h + rotate_half(q_btnh) * sin_bt1h
        k_btkh = k_btkh * cos_bt1h + rotate_half(k_btkh) * sin_bt1h
        k_btnh = jnp.repeat(k_btkh, self.groups, axis=2)  # repeat_kv
        v_btnh = jnp.repeat(v_btkh, self.groups, axis=2)
        scores_bnts = jnp.einsum("btnh,bsnh->bnts", q_btnh, k_btnh) * self.scaling
        if attention_mask is not None:
            scores_bnts = scores_bnts + attention_mask
        weights_bnts = jax.nn.softmax(at_least_float32(scores_bnts), axis=-1).astype(q_btnh.dtype)
        out_btnh = jnp.einsum("bnts,bsnh->btnh", weights_bnts, v_btnh)
        return self.o_proj(out_btnh.reshape(b, t, -1)), weights_bnts


class Qwen2DecoderLayer(nnx.Module):
    def __init__(self, cfg, *, param_dtype, rngs):
        norm = dict(epsilon=cfg.rms_norm_eps, param_dtype=param_dtype, rngs=rngs)
        self.self_attn = Qwen2Attention(cfg, param_dtype=param_dtype, rngs=rngs)
        self.mlp = LlamaMLP(cfg, param_dtype=param_dtype, rngs=rngs)
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, **norm)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, **norm)

    def __call__(self, hidden_states, attention_mask=None, position_embeddings=None, **kwargs):
        h, _ = self.self_attn(
            hidden_states=self.input_layernorm(hidden_states),
            attention_mask=attention_mask,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        h = hidden_states + h
        return h + self.mlp(self.post_attention_layernorm(h))


class Qwen2Model(nnx.Module):
    """transformers' Qwen2Model without a cache: embeddings, the rotary module (theta, computed
    once and handed to every layer), the causal + padding mask built in the model, the layers,
    the final norm. Called as Qwen2Model is (input_ids, attention_mask of 1 / 0 per token)."""

    def __init__(self, cfg, *, param_dtype="float32", rngs):
        self.embed_tokens = nnx.Embed(cfg.vocab_size, cfg.hidden_size, param_dtype=param_dtype, rngs=rngs)  # fmt: skip
        self.layers = nnx.List(
            [Qwen2DecoderLayer(cfg, param_dtype=param_dtype, rngs=rngs) for _ in range(cfg.num_hidden_layers)]
        )  # fmt: skip
        self.norm = LlamaRMSNorm(cfg.hidden_size, epsilon=cfg.rms_norm_eps, param_dtype=param_dtype, rngs=rngs)  # fmt: skip
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.rotary_emb = Qwen2RotaryEmbedding(head_dim, cfg.rope_parameters["rope_theta"])

    def __call__(self, input_ids, attention_mask=None, use_cache=False):
        h_btd = self.embed_tokens(input_ids)
        t = input_ids.shape[1]
        position_ids = jnp.arange(t)[None]
        # 0 where a query sees a key (causal, and the key not padding), the dtype's min elsewhere
        allowed = jnp.tril(jnp.ones((t, t), dtype=bool))[None, None]
        if attention_mask is not None:
            allowed = allowed & (attention_mask[:, None, None, :] != 0)
        mask = jnp.where(allowed, 0.0, jnp.finfo(h_btd.dtype).min).astype(h_btd.dtype)
        position_embeddings = self.rotary_emb(h_btd, position_ids)
        for layer in self.layers:
            h_btd = layer(
                h_btd,
                attention_mask=mask,
                position_embeddings=position_embeddings,
                position_ids=position_ids,
            )
        return self.norm(h_btd)


# -------------------------------------------------------------------------------------- Whisper


class WhisperAttention(nnx.Module):
    """Whisper's encoder self-attention: k_proj without bias, the query scaled before the
    product (as Whisper does, not the scores), softmax in the input's dtype (the eager attention
    passes no dtype). Returns (output, weights (B, heads, T, S))."""

    def __init__(self, dim, num_heads, *, param_dtype, rngs):
        dt = dict(param_dtype=param_dtype, rngs=rngs)
        self.k_proj = nnx.Linear(dim, dim, use_bias=False, **dt)
        self.v_proj = nnx.Linear(dim, dim, **dt)
        self.q_proj = nnx.Linear(dim, dim, **dt)
        self.out_proj = nnx.Linear(dim, dim, **dt)
        self.num_heads, self.scaling = num_heads, (dim // num_heads) ** -0.5

    def __call__(self, hidden_states, attention_mask=None):
        b, t, d = hidden_states.shape

        def heads(y):
            return y.reshape(b, t, self.num_heads, -1)

        q_btnh = heads(self.q_proj(hidden_states) * self.scaling)
        k_bsnh, v_bsnh = heads(self.k_proj(hidden_states)), heads(self.v_proj(hidden_states))
        scores_bnts = jnp.einsum("btnh,bsnh->bnts", q_btnh, k_bsnh)
        if attention_mask is not None:
            scores_bnts = scores_bnts + attention_mask
        weights_bnts = jax.nn.softmax(scores_bnts, axis=-1)
        out_btnh = jnp.einsum("bnts,bsnh->btnh", weights_bnts, v_bsnh)
        return self.out_proj(out_btnh.reshape(b, t, d)), weights_bnts


class WhisperEncoderLayer(nnx.Module):
    """transformers' WhisperEncoderLayer: pre-norm self-attention and a GELU feed-forward (the
    activation a module, as ACT2FN's), each with a residual; LayerNorm eps 1e-5."""

    def __init__(self, cfg, *, param_dtype="float32", rngs):
        dim, dt = cfg.d_model, dict(param_dtype=param_dtype, rngs=rngs)
        norm = dict(epsilon=1e-5, use_fast_variance=False, **dt)
        self.self_attn = WhisperAttention(dim, cfg.encoder_attention_heads, **dt)
        self.self_attn_layer_norm = nnx.LayerNorm(dim, **norm)
        self.activation_fn = GELU()
        self.fc1 = nnx.Linear(dim, cfg.encoder_ffn_dim, **dt)
        self.fc2 = nnx.Linear(cfg.encoder_ffn_dim, dim, **dt)
        self.final_layer_norm = nnx.LayerNorm(dim, **norm)

    def __call__(self, hidden_states, attention_mask=None):
        h, _ = self.self_attn(
            hidden_states=self.self_attn_layer_norm(hidden_states), attention_mask=attention_mask
        )
        h = hidden_states + h
        return h + self.fc2(self.activation_fn(self.fc1(self.final_layer_norm(h))))


# ------------------------------------------------------------------------------------------ SAM


def _rel_pos_index(q_size: int, k_size: int) -> np.ndarray:
    """SAM's get_rel_pos indices for equal sizes (a window): q - k + (k - 1)."""
    return np.arange(q_size)[:, None] - np.arange(k_size)[None, :] + (k_size - 1)


class SamAttention(nnx.Module):
    def __init__(self, dim, num_heads, window, *, swap_rel_pos=False, param_dtype, rngs):
        dt = dict(param_dtype=param_dtype, rngs=rngs)
        self.num_heads, self.scale = num_heads, (dim // num_heads) ** -0.5
        self.qkv = nnx.Linear(dim, 3 * dim, **dt)
        self.proj = nnx.Linear(dim, dim, **dt)
        head_dim = dim // num_heads
        self.rel_pos_h = nnx.Param(jnp.zeros((2 * window - 1, head_dim), param_dtype))
        self.rel_pos_w = nnx.Param(jnp.zeros((2 * window - 1, head_dim), param_dtype))
        self.swap_rel_pos = swap_rel_pos

    def __call__(self, x):
        b, h, w, _ = x.shape
        qkv = self.qkv(x).reshape(b, h * w, 3, self.num_heads, -1).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv.reshape(3, b * self.num_heads, h * w, -1)
        attn = (q * self.scale) @ jnp.swapaxes(k, -1, -2)
        rh = self.rel_pos_h[...][_rel_pos_index(h, h)]  # (h, h, head_dim)
        rw = self.rel_pos_w[...][_rel_pos_index(w, w)]
        if self.swap_rel_pos:  # wrong on purpose: the height table along the width
            rh, rw = rw, rh
        r_q = q.reshape(-1, h, w, q.shape[-1])
        rel_h = jnp.einsum("bhwc,hkc->bhwk", r_q, rh)
        rel_w = jnp.einsum("bhwc,wkc->bhwk", r_q, rw)
        attn = attn.reshape(-1, h, w, h, w) + rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]
        attn = jax.nn.softmax(attn.reshape(-1, h * w, h * w), axis=-1)
        out = (attn @ v).reshape(b, self.num_heads, h, w, -1).transpose(0, 2, 3, 1, 4)
        return self.proj(out.reshape(b, h, w, -1))


class MLPBlock(nnx.Module):
    def __init__(self, dim, mlp_dim, *, param_dtype, rngs):
        self.lin1 = nnx.Linear(dim, mlp_dim, param_dtype=param_dtype, rngs=rngs)
        self.lin2 = nnx.Linear(mlp_dim, dim, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x):
        return self.lin2(jax.nn.gelu(self.lin1(x), approximate=False))  # nn.GELU: erf


def window_partition(x, window: int):
    b, h, w, c = x.shape
    ph, pw = (window - h % window) % window, (window - w % window) % window
    x = jnp.pad(x, ((0, 0), (0, ph), (0, pw), (0, 0)))  # zeros take part in the attention
    hp, wp = h + ph, w + pw
    x = x.reshape(b, hp // window, window, wp // window, window, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window, window, c), (hp, wp)


def window_unpartition(windows, window: int, pad_hw, hw):
    (hp, wp), (h, w) = pad_hw, hw
    b = windows.shape[0] // (hp * wp // window // window)
    x = windows.reshape(b, hp // window, wp // window, window, window, -1)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, -1)[:, :h, :w]


class SamBlock(nnx.Module):
    """segment-anything's image-encoder Block with windowed attention and decomposed relative
    positions (channels-last (B, H, W, C) in and out, as SAM's)."""

    def __init__(self, dim, num_heads, window, mlp_ratio=4.0, *, swap_rel_pos=False, param_dtype="float32", rngs):  # fmt: skip
        norm = dict(epsilon=1e-6, use_fast_variance=False, param_dtype=param_dtype, rngs=rngs)
        self.norm1 = nnx.LayerNorm(dim, **norm)
        self.attn = SamAttention(
            dim, num_heads, window, swap_rel_pos=swap_rel_pos, param_dtype=param_dtype, rngs=rngs
        )
        self.norm2 = nnx.LayerNorm(dim, **norm)
        self.mlp = MLPBlock(dim, int(dim * mlp_ratio), param_dtype=param_dtype, rngs=rngs)
        self.window_size = window

    def __call__(self, x):
        shortcut = x
        x = self.norm1(x)
        h, w = x.shape[1], x.shape[2]
        x, pad_hw = window_partition(x, self.window_size)
        x = window_unpartition(self.attn(x), self.window_size, pad_hw, (h, w))
        x = shortcut + x
        return x + self.mlp(self.norm2(x))


class GELU(nnx.Module):
    """nn.GELU() (erf) as a module, so the ports' list indices are torch's Sequential's."""

    def __call__(self, x):
        return jax.nn.gelu(x, approximate=False)


class Upscaling(nnx.Module):
    """SAM MaskDecoder's output_upscaling: ConvTranspose2d(D, D/4, 2, 2), LayerNorm2d, GELU,
    ConvTranspose2d(D/4, D/8, 2, 2), GELU, on NCHW maps. LayerNorm2d is nnx.LayerNorm over the
    channel axis with SAM's eps 1e-6 (`eps=1e-5`, nn.LayerNorm's default: wrong on purpose)."""

    def __init__(self, dim, *, eps=1e-6, param_dtype="float32", rngs):
        dt = dict(param_dtype=param_dtype, rngs=rngs)
        up = dict(kernel_size=2, stride=2, channels_first=True, **dt)
        norm = nnx.LayerNorm(
            dim // 4, epsilon=eps, reduction_axes=1, feature_axes=1, use_fast_variance=False, **dt
        )
        self.output_upscaling = nnx.List(
            [
                layers.conv_transpose(dim, dim // 4, **up),
                norm,
                GELU(),
                layers.conv_transpose(dim // 4, dim // 8, **up),
                GELU(),
            ]
        )

    def __call__(self, x_bchw):
        for layer in self.output_upscaling:
            x_bchw = layer(x_bchw)
        return x_bchw


# -------------------------------------------------------------------------------------- EnCodec


class EncodecLSTM(nnx.Module):
    """transformers' EncodecLSTM: a multi-layer, time-major LSTM on (B, C, T) maps with a
    residual. `gate_order`: the LSTMCell gates loaded in another order (wrong on purpose)."""

    def __init__(self, dim, num_layers, *, param_dtype="float32", rngs):
        self.lstm = layers.LSTM(dim, dim, num_layers, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x_bct):
        x_tbc = jnp.transpose(x_bct, (2, 0, 1))
        return jnp.transpose(self.lstm(x_tbc)[0] + x_tbc, (1, 2, 0))

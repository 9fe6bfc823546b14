"""nanoGPT in Flax NNX: config, modules, forward and sampling.

Read beside parity/gpt_torch.py (our PyTorch nanoGPT): module and attribute names are the same, so
the torch state_dict key `transformer.h.0.attn.c_attn.weight` is `model.h[0].attn.c_attn.kernel`
here (transposed: torch Linear stores (out, in), nnx (in, out)); see parity/gpt_params.py.

Mixed precision follows torch autocast (what nanoGPT trains with): parameters in float32, matmuls
in the compute dtype (`GPTConfig.dtype`), LayerNorm / softmax / cross-entropy in float32, the
residual stream in float32 (float32 embeddings + bfloat16 branch promote to float32), GELU in the
compute dtype. `dtype="float64"` makes parameters float64 too (parity tests, under jax x64).

Axis names in variable suffixes: B batch, T/S query/key time, C channels, N heads, H head size,
V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from models.attention import (
    ATTENTION_IMPLS,
    cudnn_unsupported_without_device,
    resolve_attention_impl,
)
from models.fields import check_ranges, ranged

CROSS_ENTROPY_IMPLS = ("log_softmax", "logsumexp")
_DTYPES = {"float32": jnp.float32, "float64": jnp.float64, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """nanoGPT's GPTConfig (same names and defaults) plus the JAX compute policy."""

    block_size: int = ranged(1024, ">0")
    vocab_size: int = ranged(50304, ">0")  # GPT-2's 50257 padded up to a multiple of 64
    n_layer: int = ranged(12, ">0")
    n_head: int = ranged(12, ">0")
    n_embd: int = ranged(768, ">0")
    dropout: float = ranged(0.0, "[0,1)")
    bias: bool = True  # nanoGPT's GPTConfig default; its train.py uses False
    dtype: str = "float32"  # compute dtype: float32 | bfloat16 | float64 (float64 params too)
    # False: exact erf GELU (nanoGPT since June 2023). True: tanh form (HF GPT-2 / older nanoGPT).
    gelu_approximate: bool = False
    # Ours: one of ATTENTION_IMPLS. torch's SDPA picks flash / mem-efficient / math kernels itself;
    # here the choice is explicit, and "auto" is "explicit" except on an NVIDIA GPU in bfloat16.
    attention_impl: str = "auto"
    # Ours: one of CROSS_ENTROPY_IMPLS. "log_softmax": the float32 log-probabilities, then the
    # target's; "logsumexp": logsumexp minus the target's logit, whose gradient softmax - onehot is
    # computed from the compute-dtype logits (no float32 copy of the [B, T, V] logits to keep).
    # The same values (tests/test_gpt_grads.py).
    cross_entropy_impl: str = "log_softmax"

    def __post_init__(self):
        check_ranges(self)
        if self.cross_entropy_impl not in CROSS_ENTROPY_IMPLS:
            raise ValueError(
                f"GPTConfig.cross_entropy_impl must be one of {CROSS_ENTROPY_IMPLS}, "
                f"got {self.cross_entropy_impl!r}"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(
                f"GPTConfig.dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}"
            )
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
            )
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"GPTConfig.attention_impl must be one of {ATTENTION_IMPLS}, "
                f"got {self.attention_impl!r}"
            )
        if self.attention_impl == "cudnn":  # what is known before any device is seen
            why = cudnn_unsupported_without_device(
                jnp.dtype(self.compute_dtype).name, self.n_embd // self.n_head
            )
            if why:
                raise ValueError(
                    f"GPTConfig.attention_impl='cudnn' cannot run: {why}; "
                    "use 'auto' (cudnn where possible, else explicit), 'xla' or 'explicit'"
                )

    @property
    def compute_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def param_dtype(self):
        return jnp.float64 if self.dtype == "float64" else jnp.float32

    @property
    def norm_dtype(self):
        """LayerNorm, softmax and cross-entropy run here (torch autocast's float32 list)."""
        return jnp.float64 if self.dtype == "float64" else jnp.float32


# Named presets. shakespeare_char is config/train_shakespeare_char.py (bias from train.py's False).
PRESETS = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, block_size=1024, bias=True),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024, vocab_size=50257, bias=True),
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280, vocab_size=50257, bias=True),
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600, vocab_size=50257, bias=True),
    "gpt2-124m-owt": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50304, bias=False),
    "shakespeare_char": dict(
        n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=65, dropout=0.2, bias=False
    ),
}


def preset(name: str, **overrides) -> GPTConfig:
    if name not in PRESETS:
        raise KeyError(f"unknown GPT preset {name!r}; known: {sorted(PRESETS)}")
    return GPTConfig(**{**PRESETS[name], **overrides})


def _normal(std):
    return jax.nn.initializers.normal(stddev=std)  # untruncated, like torch.nn.init.normal_


def _linear(cfg: GPTConfig, n_in, n_out, *, std=0.02, rngs):
    return nnx.Linear(
        n_in,
        n_out,
        use_bias=cfg.bias,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.param_dtype,
        kernel_init=_normal(std),
        rngs=rngs,
    )


def _layer_norm(cfg: GPTConfig, *, rngs):
    # eps 1e-5 as nanoGPT (nnx default is 1e-6); two-pass variance like torch's layer_norm.
    return nnx.LayerNorm(
        cfg.n_embd,
        epsilon=1e-5,
        use_bias=cfg.bias,
        use_fast_variance=False,
        dtype=cfg.norm_dtype,
        param_dtype=cfg.param_dtype,
        rngs=rngs,
    )


class CausalSelfAttention(nnx.Module):
    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        c_proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)  # nanoGPT's scaled residual init
        self.c_attn = _linear(cfg, cfg.n_embd, 3 * cfg.n_embd, rngs=rngs)
        self.c_proj = _linear(cfg, cfg.n_embd, cfg.n_embd, std=c_proj_std, rngs=rngs)
        # Attention-probability dropout: torch does it inside SDPA (flash) or with attn_dropout
        # (manual path); jax.nn.dot_product_attention has no dropout, so the "explicit" path
        # writes attention out, and "auto" uses it whenever this dropout is active.
        self.attn_dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
        self.resid_dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
        self.n_head = cfg.n_head
        self.norm_dtype = cfg.norm_dtype
        self.attention_impl = cfg.attention_impl

    def __call__(self, x_btc):
        B, T, C = x_btc.shape
        N, H = self.n_head, C // self.n_head
        qkv_btc = self.c_attn(x_btc)
        q_btc, k_btc, v_btc = jnp.split(qkv_btc, 3, axis=-1)  # q, k, v in that order
        q_btnh = q_btc.reshape(B, T, N, H)  # head is the outer split of each C chunk
        k_bsnh = k_btc.reshape(B, T, N, H)
        v_bsnh = v_btc.reshape(B, T, N, H)
        drop = self.attn_dropout
        impl = resolve_attention_impl(
            self.attention_impl,
            q_btnh.dtype,
            H,
            dropout_active=drop.rate > 0 and not drop.deterministic,
            owner="GPTConfig",
        )
        if impl == "explicit":
            y_btnh = self._explicit_attention(q_btnh, k_bsnh, v_bsnh)
        else:  # torch's SDPA picks its kernel itself; here GPTConfig.attention_impl picks it
            y_btnh = jax.nn.dot_product_attention(
                q_btnh,
                k_bsnh,
                v_bsnh,
                scale=1.0 / math.sqrt(H),
                is_causal=True,
                implementation=impl,
            )
        y_btc = y_btnh.reshape(B, T, C)  # heads concatenated head-major
        return self.resid_dropout(self.c_proj(y_btc))

    def _explicit_attention(self, q_btnh, k_bsnh, v_bsnh):
        """nanoGPT's manual path: scores, causal mask, softmax in norm_dtype, dropout, @ v."""
        T, H = q_btnh.shape[1], q_btnh.shape[3]
        att_bnts = jnp.einsum("btnh,bsnh->bnts", q_btnh, k_bsnh) * (1.0 / math.sqrt(H))
        causal_ts = jnp.tril(jnp.ones((T, T), dtype=bool))
        att_bnts = jnp.where(causal_ts, att_bnts.astype(self.norm_dtype), -jnp.inf)
        att_bnts = jax.nn.softmax(att_bnts, axis=-1)
        att_bnts = self.attn_dropout(att_bnts)
        return jnp.einsum("bnts,bsnh->btnh", att_bnts.astype(v_bsnh.dtype), v_bsnh)


class MLP(nnx.Module):
    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        c_proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
        self.c_fc = _linear(cfg, cfg.n_embd, 4 * cfg.n_embd, rngs=rngs)
        self.c_proj = _linear(cfg, 4 * cfg.n_embd, cfg.n_embd, std=c_proj_std, rngs=rngs)
        self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
        self.gelu_approximate = cfg.gelu_approximate

    def __call__(self, x_btc):
        # jax.nn.gelu defaults to the tanh form; nanoGPT's nn.GELU() is exact erf.
        h_btf = jax.nn.gelu(self.c_fc(x_btc), approximate=self.gelu_approximate)
        return self.dropout(self.c_proj(h_btf))


class Block(nnx.Module):
    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        self.ln_1 = _layer_norm(cfg, rngs=rngs)
        self.attn = CausalSelfAttention(cfg, rngs=rngs)
        self.ln_2 = _layer_norm(cfg, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x_btc):
        # Residual adds promote a bfloat16 branch back to the float32 stream (as under autocast).
        x_btc = x_btc + self.attn(self.ln_1(x_btc))
        return x_btc + self.mlp(self.ln_2(x_btc))


class GPT(nnx.Module):
    """nanoGPT's GPT. torch's `transformer` ModuleDict is flattened: wte, wpe, drop, h, ln_f."""

    def __init__(self, config: GPTConfig, *, rngs: nnx.Rngs):
        cfg = config
        self.config = cfg
        # Embeddings stay in the parameter dtype: under autocast the lookups are float32.
        emb = dict(dtype=cfg.param_dtype, param_dtype=cfg.param_dtype, embedding_init=_normal(0.02))
        self.wte = nnx.Embed(cfg.vocab_size, cfg.n_embd, rngs=rngs, **emb)
        self.wpe = nnx.Embed(cfg.block_size, cfg.n_embd, rngs=rngs, **emb)
        self.drop = nnx.Dropout(cfg.dropout, rngs=rngs)
        self.h = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.n_layer)])
        self.ln_f = _layer_norm(cfg, rngs=rngs)
        # lm_head is tied to wte (torch: the same Parameter); logits = x @ wte^T, see _lm_head.

    def _lm_head(self, x_btc):
        dt = self.config.compute_dtype
        return jnp.einsum("btc,vc->btv", x_btc.astype(dt), self.wte.embedding[...].astype(dt))

    def hidden(self, idx_bt):
        """Token ids (B, T) -> final-LayerNorm output (B, T, C) for every position."""
        T = idx_bt.shape[1]
        if T > self.config.block_size:
            raise ValueError(
                f"Cannot forward sequence of length {T}, block size is only {self.config.block_size}"
            )
        x_btc = self.wte(idx_bt) + self.wpe(jnp.arange(T))[None]
        x_btc = self.drop(x_btc)
        for block in self.h:
            x_btc = block(x_btc)
        return self.ln_f(x_btc)

    def __call__(self, idx_bt, targets_bt=None):
        """-> (logits, loss). Without targets only the last position: logits (B, 1, V), loss None.

        With targets: logits (B, T, V) and the mean cross-entropy over targets != -1.
        """
        x_btc = self.hidden(idx_bt)
        if targets_bt is None:
            return self._lm_head(x_btc[:, -1:, :]), None
        logits_btv = self._lm_head(x_btc)
        loss = cross_entropy(
            logits_btv, targets_bt, self.config.norm_dtype, impl=self.config.cross_entropy_impl
        )
        return logits_btv, loss

    def get_num_params(self, non_embedding: bool = True) -> int:
        """Parameter count, tied wte/lm_head once; non_embedding subtracts wpe (as nanoGPT)."""
        n = sum(p.size for p in jax.tree.leaves(nnx.state(self, nnx.Param)))
        if non_embedding:
            n -= self.wpe.embedding.size
        return int(n)

    def crop_block_size(self, block_size: int) -> None:
        """Shrink the context (e.g. GPT-2's 1024 -> 256): keep the first rows of wpe."""
        if block_size > self.config.block_size:
            raise ValueError(
                f"crop_block_size: new block_size {block_size} > current {self.config.block_size}"
            )
        self.config = dataclasses.replace(self.config, block_size=block_size)
        self.wpe.num_embeddings = block_size
        self.wpe.embedding = nnx.Param(self.wpe.embedding[...][:block_size])


def abstract_gpt(config: GPTConfig) -> GPT:
    """The model `config` describes with ShapeDtypeStructs for arrays (nnx.eval_shape: traced,
    nothing allocated or drawn): its structure and sizes, e.g. `abstract_gpt(c).get_num_params()`."""
    return nnx.eval_shape(lambda: GPT(config, rngs=nnx.Rngs(0)))


def cross_entropy(logits_btv, targets_bt, dtype=jnp.float32, impl: str = "log_softmax"):
    """Mean token cross-entropy in `dtype`, ignoring targets == -1 (torch ignore_index=-1).

    `impl` (GPTConfig.cross_entropy_impl): "log_softmax" (jax.nn.log_softmax in `dtype`, then the
    target's entry) or "logsumexp" (`_nll_logsumexp`); the same values up to rounding."""
    valid_bt = targets_bt != -1
    safe_bt = jnp.where(valid_bt, targets_bt, 0)
    if impl == "logsumexp":
        nll_bt = _nll_logsumexp(logits_btv, safe_bt, jnp.dtype(dtype).name)
    else:
        logp_btv = jax.nn.log_softmax(logits_btv.astype(dtype), axis=-1)
        nll_bt = -jnp.take_along_axis(logp_btv, safe_bt[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(valid_bt, nll_bt, 0.0)) / jnp.sum(valid_bt)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _nll_logsumexp(logits_btv, targets_bt, dtype: str):
    """-log softmax(logits)[target] per position as logsumexp(logits) - logits[target], in
    `dtype`. Its gradient, softmax - onehot, is computed from the logits as they are (the
    compute dtype) and the saved logsumexp: the float32 copy of the logits that log_softmax's
    gradient reads need not be kept between the forward and the backward pass."""
    return _nll_logsumexp_fwd(logits_btv, targets_bt, dtype)[0]


def _nll_logsumexp_fwd(logits_btv, targets_bt, dtype):
    m_bt1 = jnp.max(logits_btv, axis=-1, keepdims=True).astype(dtype)  # exact in any dtype
    s_bt1 = jnp.sum(jnp.exp(logits_btv.astype(dtype) - m_bt1), axis=-1, keepdims=True)
    lse_bt1 = m_bt1 + jnp.log(s_bt1)
    picked_bt1 = jnp.take_along_axis(logits_btv, targets_bt[..., None], axis=-1).astype(dtype)
    return (lse_bt1 - picked_bt1)[..., 0], (logits_btv, targets_bt, lse_bt1)


def _nll_logsumexp_bwd(dtype, res, g_bt):
    logits_btv, targets_bt, lse_bt1 = res
    onehot_btv = targets_bt[..., None] == jnp.arange(logits_btv.shape[-1])
    p_btv = jnp.exp(logits_btv.astype(dtype) - lse_bt1)
    d_btv = (p_btv - onehot_btv.astype(dtype)) * g_bt[..., None].astype(dtype)
    return d_btv.astype(logits_btv.dtype), None


_nll_logsumexp.defvjp(_nll_logsumexp_fwd, _nll_logsumexp_bwd)


def top_k_filter(logits_bv, top_k: int | None):
    """nanoGPT's top-k: -inf for every logit strictly below the k-th largest (ties survive)."""
    if top_k is None:
        return logits_bv
    k = min(int(top_k), logits_bv.shape[-1])
    kth_b1 = jax.lax.top_k(logits_bv, k)[0][..., -1:]
    return jnp.where(logits_bv < kth_b1, -jnp.inf, logits_bv)


def _key(rngs):
    if isinstance(rngs, nnx.Rngs):
        return rngs.sample() if "sample" in rngs else rngs()
    return rngs  # a jax PRNG key


@nnx.jit(static_argnames=("max_new_tokens", "top_k"))
def _generate(model, idx_bt, key, temperature, max_new_tokens, top_k):
    B, T0 = idx_bt.shape
    W = min(model.config.block_size, T0 + max_new_tokens)  # static window width
    buf_bl = jnp.zeros((B, T0 + max_new_tokens), idx_bt.dtype).at[:, :T0].set(idx_bt)

    def step(i, carry):
        buf_bl, key = carry
        n = T0 + i  # tokens so far
        # Crop to the last block_size tokens. While n < W the window also holds not-yet-written
        # zeros to the right of position n-1; causal attention never lets them reach it.
        start = jnp.maximum(n - W, 0)
        window_bw = jax.lax.dynamic_slice_in_dim(buf_bl, start, W, axis=1)
        x_bwc = model.hidden(window_bw)
        last_b1c = jax.lax.dynamic_slice_in_dim(x_bwc, jnp.minimum(n, W) - 1, 1, axis=1)
        logits_bv = model._lm_head(last_b1c)[:, 0, :].astype(jnp.float32) / temperature
        logits_bv = top_k_filter(logits_bv, top_k)
        key, sub = jax.random.split(key)
        next_b = jax.random.categorical(sub, logits_bv, axis=-1).astype(buf_bl.dtype)
        buf_bl = jax.lax.dynamic_update_slice_in_dim(buf_bl, next_b[:, None], n, axis=1)
        return buf_bl, key

    buf_bl, _ = jax.lax.fori_loop(0, max_new_tokens, step, (buf_bl, key))
    return buf_bl


def generate(model: GPT, idx, max_new_tokens: int, *, temperature=1.0, top_k=None, rngs):
    """nanoGPT's generate: crop to block_size, logits / temperature, top-k, sample; append.

    One compiled loop: the context lives in a fixed (B, T0 + max_new_tokens) buffer and each step
    reads a fixed-width window, which is equivalent to nanoGPT's growing crop because attention is
    causal. `rngs` is an nnx.Rngs (its `sample` stream if present, else default) or a PRNG key.
    top_k=1 is greedy decoding. The caller puts the model in eval() mode, as in nanoGPT.
    """
    idx = jnp.asarray(idx)
    if max_new_tokens <= 0:
        return idx
    return _generate(model, idx, _key(rngs), temperature, int(max_new_tokens), top_k)

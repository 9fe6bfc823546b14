"""TRMConfig.attention_impl: jax.nn.dot_product_attention ("xla", "cudnn") against the written-out
attention ("explicit") that every TRM parity test is proven against. Torch-free."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from models.attention import resolve_attention_impl
from models.trm import TRM, TRMConfig, act_loss
from models.trm.layers import Attention, rope_tables
from parity.compare import BFLOAT16, EXACT, FLOAT32, assert_all_close
from parity.trm_draws import with_draws
from parity.trm_fixtures import tiny_config

# parity.trm_fixtures's tiny attention config at head_dim 64 (the Sudoku/ARC configs' 512 / 8), so
# the gpu test runs what cuDNN will see.
BASE = dict(
    batch_size=2,
    puzzle_emb_ndim=128,
    num_puzzle_identifiers=3,
    L_layers=1,
    hidden_size=128,
    num_heads=2,
    puzzle_emb_len=2,
)


def _batch(cfg):
    k1, k2 = jax.random.split(jax.random.key(1))
    shape = (cfg.batch_size, cfg.seq_len)
    return {
        "inputs": jax.random.randint(k1, shape, 0, cfg.vocab_size),
        "labels": jax.random.randint(k2, shape, 0, cfg.vocab_size),
        "puzzle_identifiers": jnp.arange(cfg.batch_size, dtype=jnp.int32) % 3,
    }


def _step(impl, dtype, grads=True, **over):
    """One ACT step of the whole model: [(name, value)] of the loss, the outputs and (grads=True)
    the gradient of every parameter. Same weights for every impl (no attention parameters added)."""
    cfg = tiny_config("att", dtype, **{**BASE, **over}, attention_impl=impl)
    model = TRM(cfg, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(with_draws(model), nnx.Param, ...)  # no row explores
    batch = _batch(cfg)

    def f(params):
        m = nnx.merge(graphdef, params, rest)
        carry, out = m(m.initial_carry(batch), batch)
        return act_loss(carry, out, loss_dtype="float32")[0], out

    if not grads:
        loss, out = jax.jit(f)(params)
        return [("loss", loss), *sorted(out.items())]
    (loss, out), g = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
    flat = [(".".join(map(str, p)), v.get_value()) for p, v in nnx.to_flat_state(g)]
    return [("loss", loss), *sorted(out.items()), *flat]


def _pairs(actual, expected):
    assert [n for n, _ in actual] == [n for n, _ in expected]
    return [(n, a, e) for (n, a), (_, e) in zip(actual, expected, strict=True)]


def test_xla_equals_explicit_float32_whole_model():
    """One ACT step (H2/L2, RoPE) forward and every gradient (measured: max 1.0e-6 of scale)."""
    assert_all_close(_pairs(_step("xla", "float32"), _step("explicit", "float32")), FLOAT32)


def test_config_reaches_every_attention_layer_and_auto_is_explicit_on_cpu():
    cfg = tiny_config("att", **BASE, attention_impl="xla")
    assert TRM(cfg, rngs=nnx.Rngs(0)).inner.L_level.layers[0].self_attn.attention_impl == "xla"
    assert TRMConfig().attention_impl == "auto"
    if jax.default_backend() != "gpu":
        for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
            assert resolve_attention_impl("auto", dtype, 64) == "explicit"


def test_cudnn_rules_reach_the_trm_resolver():
    """The shared rules (models/attention.py, tested in test_gpt_attention_impl.py::
    test_cudnn_rules) are the ones TRM's resolver applies: float32 or a head_dim that is not a
    multiple of 8 never resolves to cudnn, and an explicit request says why."""
    assert resolve_attention_impl("auto", jnp.float32, 64) == "explicit"
    assert resolve_attention_impl("auto", jnp.bfloat16, 42) == "explicit"  # 512 / 12 heads
    with pytest.raises(ValueError, match="cannot run: head size 42 is not a multiple of 8"):
        resolve_attention_impl("cudnn", jnp.bfloat16, 42)
    with pytest.raises(ValueError, match="cannot run: the dtype is float32"):
        resolve_attention_impl("cudnn", jnp.float32, 64)


def test_invalid_and_impossible_values_are_errors():
    with pytest.raises(ValueError, match=r"TRMConfig.attention_impl='flash'.*'explicit'"):
        TRMConfig(attention_impl="flash")
    with pytest.raises(ValueError, match="attention_impl='cudnn'.*float32.*bfloat16"):
        TRMConfig(attention_impl="cudnn", forward_dtype="float32")
    with pytest.raises(ValueError, match="head_dim 42 .* not a multiple of 8"):
        TRMConfig(arch="transformers_baseline", num_heads=12, attention_impl="cudnn")
    if jax.default_backend() != "gpu":  # "cudnn" on CPU: an error, never a silent fallback
        attn = Attention(128, 64, 2, attention_impl="cudnn", rngs=nnx.Rngs(0))
        with pytest.raises(ValueError, match="cannot run: the default JAX backend is 'cpu'"):
            attn(None, jnp.zeros((1, 8, 128), jnp.bfloat16))


@pytest.mark.parametrize("impl", ["xla", pytest.param("cudnn", marks=pytest.mark.gpu)])
def test_bfloat16_equals_explicit(impl):
    """bf16: one ACT step of the whole model (H1/L1, as docs/porting_trm.md's bf16 attention claim:
    rounding flips compound through the recursion; xla measured 8.6e-3 of scale on the logits: xla
    rounds normalised probabilities, explicit and cuDNN unnormalised ones), and the gradients of
    one RoPE attention layer (xla measured 5.6e-3).
    Whole-model bf16 gradients are not claimed: bf16 sums of cancelling terms put even
    explicit-bf16 ~1e-2 of scale from itself in float32 (measured), i.e. at the bound.
    """
    over = dict(H_cycles=1, L_cycles=1)
    got = _step(impl, "bfloat16", grads=False, **over)
    ref = _step("explicit", "bfloat16", grads=False, **over)
    assert_all_close(_pairs(got, ref), BFLOAT16)

    S, D = 18, 128
    h = jax.random.normal(jax.random.key(2), (2, S, D), jnp.bfloat16)
    w = jax.random.normal(jax.random.key(3), (2, S, D))
    cos_sin = rope_tables(64, S, 10000.0, jnp.bfloat16)

    def grads(impl):
        attn = Attention(D, 64, 2, attention_impl=impl, rngs=nnx.Rngs(0))
        f = lambda m, h: jnp.sum(m(cos_sin, h).astype(jnp.float32) * w)  # noqa: E731
        g_params, g_h = nnx.jit(nnx.grad(f, argnums=(0, 1)))(attn, h)
        flat = [(".".join(map(str, p)), v.get_value()) for p, v in nnx.to_flat_state(g_params)]
        return [*flat, ("h", g_h)]

    assert_all_close(_pairs(grads(impl), grads("explicit")), BFLOAT16)


def test_auto_equals_explicit_bit_for_bit_on_cpu():
    """The default ("auto") on CPU is today's explicit attention, bit for bit (bf16 layer)."""
    if jax.default_backend() == "gpu":
        pytest.skip("on a GPU auto picks cudnn")
    h = jax.random.normal(jax.random.key(2), (2, 18, 128), jnp.bfloat16)
    cos_sin = rope_tables(64, 18, 10000.0, jnp.bfloat16)
    out = {
        impl: Attention(128, 64, 2, attention_impl=impl, rngs=nnx.Rngs(0))(cos_sin, h)
        for impl in ("auto", "explicit")
    }
    assert_all_close([("bf16 attention", out["auto"], out["explicit"])], EXACT)

"""GPTConfig.attention_impl: jax.nn.dot_product_attention ("xla", "cudnn") against the written-out
attention ("explicit") that every GPT parity test is proven against. Torch-free."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.attention import cudnn_unsupported, resolve_attention_impl
from models.gpt import GPT, GPTConfig
from models.gpt.modeling import CausalSelfAttention
from parity.compare import BFLOAT16, EXACT, FLOAT32, FLOAT64, assert_all_close

# Head size 64 (GPT-2's) so the same configuration is valid for cuDNN in the gpu test.
TINY = dict(block_size=32, vocab_size=65, n_layer=1, n_head=2, n_embd=128, dropout=0.0, bias=True)


def _batch(T=32):
    k1, k2 = jax.random.split(jax.random.key(1))
    return jax.random.randint(k1, (2, T), 0, 65), jax.random.randint(k2, (2, T), 0, 65)


def _loss_logits_grads(impl, dtype, grads=True, **over):
    """[(name, value)]: loss, logits (B, T, V) and (grads=True) the gradient of every parameter."""
    model = GPT(GPTConfig(**{**TINY, **over}, dtype=dtype, attention_impl=impl), rngs=nnx.Rngs(0))
    idx, targets = _batch()

    def loss_fn(m, x, y):
        logits, loss = m(x, y)
        return loss, logits

    if not grads:
        loss, logits = nnx.jit(loss_fn)(model, idx, targets)
        return [("loss", loss), ("logits", logits)]
    (loss, logits), g = nnx.jit(nnx.value_and_grad(loss_fn, has_aux=True))(model, idx, targets)
    flat = [(".".join(map(str, p)), v.get_value()) for p, v in nnx.to_flat_state(g)]
    return [("loss", loss), ("logits", logits), *flat]


def _pairs(actual, expected):
    assert [n for n, _ in actual] == [n for n, _ in expected]
    return [(n, a, e) for (n, a), (_, e) in zip(actual, expected, strict=True)]


def test_xla_equals_explicit_float32():
    """Whole model, forward and every gradient (measured: forward bit-identical, gradients 7.2e-8
    of scale)."""
    xla = _loss_logits_grads("xla", "float32")
    explicit = _loss_logits_grads("explicit", "float32")
    assert_all_close(_pairs(xla, explicit), FLOAT32)


def test_xla_softmax_is_float32_even_in_float64(x64):
    """Trap: jax's xla attention casts the logits to float32 for the softmax, also for float64
    inputs, so "xla" in a float64 parity run is float32-accurate (measured 4.4e-8 of scale), not
    FLOAT64."""
    x = jax.random.normal(jax.random.key(2), (2, 16, TINY["n_embd"]), jnp.float64)
    out = {}
    for impl in ("xla", "explicit"):
        cfg = GPTConfig(**TINY, dtype="float64", attention_impl=impl)
        out[impl] = CausalSelfAttention(cfg, rngs=nnx.Rngs(0))(x)
    assert out["xla"].dtype == jnp.float64
    assert_all_close([("attn out", out["xla"], out["explicit"])], FLOAT32)
    with pytest.raises(AssertionError, match="MISMATCH"):
        assert_all_close([("attn out", out["xla"], out["explicit"])], FLOAT64)


@pytest.mark.parametrize("impl", ["explicit", "xla"])
def test_attention_is_causal(impl):
    """Changing tokens from position 20 on leaves every earlier position's logits bit-identical."""
    model = GPT(GPTConfig(**TINY, attention_impl=impl), rngs=nnx.Rngs(0))
    idx, targets = _batch()
    other = idx.at[:, 20:].set((idx[:, 20:] + 7) % 65)
    fwd = nnx.jit(lambda m, x, y: m(x, y)[0])
    a, b = fwd(model, idx, targets), fwd(model, other, targets)
    assert_all_close([("logits[:, :20]", a[:, :20], b[:, :20])], EXACT)
    assert float(jnp.max(jnp.abs(a[:, 20:] - b[:, 20:]))) > 0  # the change does reach position 20


def test_auto_is_explicit_on_cpu():
    """The default ("auto") on CPU is today's explicit attention, bit for bit, in every dtype."""
    if jax.default_backend() == "gpu":
        pytest.skip("on a GPU auto picks cudnn (test_cudnn_rules)")
    assert GPTConfig().attention_impl == "auto"
    for dtype in (jnp.float32, jnp.bfloat16):
        assert resolve_attention_impl("auto", dtype, 64, dropout_active=False) == "explicit"
    idx, targets = _batch()
    outs = {}
    for impl in ("auto", "explicit"):
        model = GPT(GPTConfig(**TINY, dtype="bfloat16", attention_impl=impl), rngs=nnx.Rngs(0))
        outs[impl] = nnx.jit(lambda m, x, y: m(x, y)[0])(model, idx, targets)
    assert_all_close([("bf16 logits", outs["auto"], outs["explicit"])], EXACT)


def test_cudnn_rules():
    """jax's cuDNN flash-attention limits, as "auto" applies them in both ports (models/attention.py;
    cc: compute capability)."""
    assert cudnn_unsupported(jnp.bfloat16, 64, (8, 0)) is None
    assert cudnn_unsupported(jnp.float16, 256, (9, 0)) is None  # Hopper: head size up to 256
    assert "> 128" in cudnn_unsupported(jnp.bfloat16, 256, (8, 0))
    assert "multiple of 8" in cudnn_unsupported(jnp.bfloat16, 60, (9, 0))
    assert "bfloat16 or float16" in cudnn_unsupported(jnp.float32, 64, (9, 0))
    assert "not an NVIDIA GPU" in cudnn_unsupported(jnp.bfloat16, 64, None)


def test_invalid_attention_impl_names_the_field_and_choices():
    with pytest.raises(ValueError, match=r"GPTConfig.attention_impl .*'explicit'.*'flash'"):
        GPTConfig(attention_impl="flash")


def test_cudnn_where_impossible_is_an_error_not_a_fallback():
    with pytest.raises(ValueError, match="attention_impl='cudnn'.*float32.*bfloat16"):
        GPTConfig(attention_impl="cudnn")  # dtype float32
    with pytest.raises(ValueError, match="head size 20 is not a multiple of 8"):
        GPTConfig(dtype="bfloat16", n_embd=40, n_head=2, attention_impl="cudnn")
    cfg = GPTConfig(**{**TINY, "dropout": 0.1}, dtype="bfloat16", attention_impl="cudnn")
    attn = CausalSelfAttention(cfg, rngs=nnx.Rngs(0))
    x = jnp.zeros((1, 8, TINY["n_embd"]), jnp.float32)
    with pytest.raises(ValueError, match="attention dropout is active"):
        attn(x)  # train mode, dropout 0.1: jax.nn.dot_product_attention has no dropout
    if jax.default_backend() != "gpu":
        attn.eval()
        with pytest.raises(ValueError, match="not an NVIDIA GPU"):
            attn(x)


def test_xla_with_active_attention_dropout_is_an_error():
    attn = CausalSelfAttention(
        GPTConfig(**{**TINY, "dropout": 0.1}, attention_impl="xla"), rngs=nnx.Rngs(0)
    )
    x = jax.random.normal(jax.random.key(0), (1, 8, TINY["n_embd"]))
    with pytest.raises(ValueError, match="'xla' cannot run: attention dropout is active"):
        attn(x)
    attn.eval()  # dropout off: runs
    assert attn(x).shape == x.shape


@pytest.mark.parametrize("impl", ["xla", pytest.param("cudnn", marks=pytest.mark.gpu)])
def test_bfloat16_equals_explicit(impl):
    """bf16 (the production dtype): model outputs, and the gradients through one attention module.

    Gradients are compared module by module: through the whole bf16 model, sums of bf16 terms that
    cancel (e.g. the key bias, whose exact gradient is 0: softmax ignores a shift shared by all
    keys) put even explicit-bf16 2e-2 of scale from explicit-float32 (measured), which would make
    a whole-model BFLOAT16 claim noise. bias=False for the same reason.
    """
    over = dict(bias=False)
    got = _loss_logits_grads(impl, "bfloat16", grads=False, **over)
    ref = _loss_logits_grads("explicit", "bfloat16", grads=False, **over)
    assert_all_close(_pairs(got, ref), BFLOAT16)

    x = jax.random.normal(jax.random.key(2), (2, TINY["block_size"], TINY["n_embd"]))
    w = jax.random.normal(jax.random.key(3), x.shape)

    def grads(impl):
        cfg = GPTConfig(**{**TINY, **over}, dtype="bfloat16", attention_impl=impl)
        attn = CausalSelfAttention(cfg, rngs=nnx.Rngs(0))
        f = lambda m, x: jnp.sum(m(x).astype(jnp.float32) * w)  # noqa: E731
        g_params, g_x = nnx.jit(nnx.grad(f, argnums=(0, 1)))(attn, x)
        flat = [(".".join(map(str, p)), v.get_value()) for p, v in nnx.to_flat_state(g_params)]
        return [*flat, ("x", g_x)]

    assert_all_close(_pairs(grads(impl), grads("explicit")), BFLOAT16)
    assert np.isfinite(np.asarray(got[0][1]))

"""Forward parity, module by module, of the NNX nanoGPT against our PyTorch nanoGPT."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference side: torch-free installs skip this module

from parity import report_gpt  # noqa: E402
from parity.compare import FLOAT32, FLOAT64, assert_close, compare  # noqa: E402

TINY = dict(block_size=16, vocab_size=65, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True)


def _assert_rows(rows):
    bad = [r.message() for r in rows if not r.passed]
    assert not bad, f"{len(bad)} of {len(rows)} module outputs differ:\n" + "\n".join(bad)
    assert [r.name for r in rows][:2] == ["embeddings", "h.0.ln_1"] and rows[-1].name == "loss"


def test_forward_float64_module_by_module(x64):
    _assert_rows(report_gpt.run("float64", TINY))


def test_forward_float32_module_by_module():
    _assert_rows(report_gpt.run("float32", TINY))


def test_forward_bfloat16_vs_torch_cpu_autocast():
    # The JAX bf16 policy (bf16 matmuls, fp32 LN/softmax/CE/residual) against torch.autocast.
    _assert_rows(report_gpt.run("bfloat16", TINY))


@pytest.mark.parametrize(
    "variant",
    [
        dict(bias=False),  # what train.py trains: no biases anywhere
        dict(gelu_approximate=True),  # pre-2023 nanoGPT / HF GPT-2 tanh GELU
    ],
    ids=["no_bias", "tanh_gelu"],
)
def test_forward_float64_variants(x64, variant):
    _assert_rows(report_gpt.run("float64", {**TINY, **variant}))


def test_forward_float64_vs_torch_manual_attention(x64):
    # nanoGPT's fallback path (masked softmax + attn_dropout, mask buffer attn.bias).
    _assert_rows(report_gpt.run("float64", TINY, flash=False))


def test_inference_head_last_position_only(x64):
    tmodel, jmodel = report_gpt.build_pair(TINY, "float64")
    idx, _ = report_gpt.batch(TINY)
    logits, loss = jmodel(jnp.asarray(idx.numpy()[:, :7]))
    assert loss is None and logits.shape == (2, 1, TINY["vocab_size"])
    with torch.no_grad():
        t_logits, t_loss = tmodel(idx[:, :7])
    assert t_loss is None
    assert_close("logits (B, 1, V)", logits, t_logits, FLOAT64)


def test_loss_ignores_minus_one_targets(x64):
    tmodel, jmodel = report_gpt.build_pair(TINY, "float64")
    idx, targets = report_gpt.batch(TINY)
    targets[0, :5] = -1
    targets[1, 9] = -1
    _, loss = jmodel(jnp.asarray(idx.numpy()), jnp.asarray(targets.numpy()))
    with torch.no_grad():
        _, t_loss = tmodel(idx, targets)
    assert_close("loss with ignore_index=-1", loss, t_loss, FLOAT64)
    # and ignoring matters: the same batch with those targets counted gives another loss
    _, loss_all = jmodel(jnp.asarray(idx.numpy()), jnp.asarray(np.maximum(targets.numpy(), 0)))
    assert abs(float(loss_all) - float(loss)) > 1e-6


def test_sequence_longer_than_block_size_is_refused():
    _, jmodel = report_gpt.build_pair(TINY, "float32")
    with pytest.raises(ValueError, match="block size is only 16"):
        jmodel(jnp.zeros((1, 17), jnp.int32))


def test_bfloat16_policy_dtypes():
    """Params fp32, residual stream fp32, logits bf16 (as lm_head under autocast), loss fp32."""
    _, jmodel = report_gpt.build_pair(TINY, "bfloat16")
    idx, targets = report_gpt.batch(TINY)
    logits, loss = jmodel(jnp.asarray(idx.numpy()), jnp.asarray(targets.numpy()))
    assert jmodel.wte.embedding[...].dtype == jnp.float32
    assert jmodel.h[0].mlp.c_fc.kernel[...].dtype == jnp.float32
    assert logits.dtype == jnp.bfloat16 and loss.dtype == jnp.float32
    acts = report_gpt.jax_activations(
        jmodel, jnp.asarray(idx.numpy()), jnp.asarray(targets.numpy())
    )
    assert acts["h.0.attn"].dtype == jnp.bfloat16  # branch output of a bf16 matmul
    assert acts["h.0.ln_2"].dtype == jnp.float32  # LN of the fp32 residual stream
    assert acts["embeddings"].dtype == jnp.float32  # lookups are not rounded to bf16


def test_parity_report_cli_prints_table_and_exit_status(capsys):
    assert report_gpt.main(["--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "h.1.mlp" in out and "logits" in out and "0 failed" in out


@pytest.mark.parametrize(
    "dtype, mean_over_std", [("float32", 20.0), ("float64", 500.0)], ids=["float32", "float64"]
)
def test_layer_norm_variance_is_two_pass(dtype, mean_over_std, request):
    """The port's LayerNorm (`use_fast_variance=False`) computes the variance as E[(x - E[x])^2],
    like torch's layer_norm. On activations whose mean is large against their spread the one-pass
    E[x^2] - E[x]^2 (Flax's default) cancels catastrophically. Measured scale-relative errors
    against torch: float32 at mean/std 20, two-pass 2.7e-6, one-pass 1.1e-4; float64 at 500,
    two-pass 6.3e-14, one-pass 1.1e-10. Reverting to use_fast_variance=True fails the bound."""
    from flax import nnx

    from models.gpt import GPT, GPTConfig
    from parity import gpt_torch

    if dtype == "float64":
        request.getfixturevalue("x64")
    tol = FLOAT64 if dtype == "float64" else FLOAT32
    C = TINY["n_embd"]
    ln = GPT(GPTConfig(**{**TINY, "dtype": dtype}), rngs=nnx.Rngs(0)).h[0].ln_1  # the model's own
    rng = np.random.default_rng(0)
    scale, bias = 1 + 0.1 * rng.standard_normal(C), 0.1 * rng.standard_normal(C)
    ln.scale[...], ln.bias[...] = jnp.asarray(scale, dtype), jnp.asarray(bias, dtype)
    ref = gpt_torch.LayerNorm(C, bias=True).to(getattr(torch, dtype))
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(scale))
        ref.bias.copy_(torch.from_numpy(bias))
    x = (mean_over_std + rng.standard_normal((4, 16, C))).astype(dtype)
    with torch.no_grad():
        expected = ref(torch.from_numpy(x))
    assert_close(f"LayerNorm, mean/std {mean_over_std:g}", ln(jnp.asarray(x)), expected, tol)
    one_pass = nnx.LayerNorm(
        C, epsilon=1e-5, use_fast_variance=True, dtype=ln.dtype, param_dtype=ln.param_dtype,
        rngs=nnx.Rngs(0),
    )  # fmt: skip
    one_pass.scale[...], one_pass.bias[...] = ln.scale[...], ln.bias[...]
    fast = compare("one-pass variance", one_pass(jnp.asarray(x)), expected, tol)
    assert not fast.passed, f"the one-pass formula should fail here: {fast.message()}"

"""Gradients of every parameter (dropout off): NNX port vs torch autograd."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import pytest
from flax import nnx

torch = pytest.importorskip("torch")  # the reference side: torch-free installs skip this module

from parity import report_gpt  # noqa: E402
from parity.compare import FLOAT32, FLOAT64, assert_all_close  # noqa: E402
from parity.gpt_params import to_torch  # noqa: E402

TINY = dict(block_size=16, vocab_size=65, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True)


def jax_grads_as_torch_keys(model, idx, targets) -> dict:
    """nnx.grad of the loss, written out under nanoGPT's keys (transposed like the weights)."""
    grads = nnx.jit(nnx.grad(lambda m, x, y: m(x, y)[1]))(model, idx, targets)
    holder = nnx.clone(model)
    nnx.update(holder, grads)
    return to_torch(holder)


@pytest.mark.parametrize(
    "dtype,tol,bias,ce",
    [
        ("float64", FLOAT64, True, "log_softmax"),
        ("float64", FLOAT64, False, "log_softmax"),
        ("float32", FLOAT32, True, "log_softmax"),
        ("float64", FLOAT64, True, "logsumexp"),
        ("float32", FLOAT32, True, "logsumexp"),
    ],
    ids=["float64", "float64-no-bias", "float32", "float64-logsumexp", "float32-logsumexp"],
)
def test_grads_of_every_parameter(request, dtype, tol, bias, ce):
    """...for both GPTConfig.cross_entropy_impl values, with some targets ignored (-1)."""
    if dtype == "float64":
        request.getfixturevalue("x64")
    cfg = {**TINY, "bias": bias}
    tmodel, jmodel = report_gpt.build_pair(cfg, dtype)
    jmodel.config = dataclasses.replace(jmodel.config, cross_entropy_impl=ce)
    idx, targets = report_gpt.batch(cfg)
    targets[:, ::5] = -1  # torch's ignore_index=-1 (nanoGPT's F.cross_entropy)
    _, loss = tmodel(idx, targets)
    loss.backward()
    t_grads = {n: p.grad for n, p in tmodel.named_parameters()}  # tied wte counted once
    j_grads = jax_grads_as_torch_keys(
        jmodel, jnp.asarray(idx.numpy()), jnp.asarray(targets.numpy())
    )
    assert set(t_grads) == set(j_grads) - {"lm_head.weight"}
    # wte's gradient is the sum of the lookup and the tied lm_head contributions in both.
    assert_all_close([(f"grad {k}", j_grads[k], t_grads[k]) for k in t_grads], tol)
    assert float(torch.stack([g.abs().max() for g in t_grads.values()]).min()) > 0

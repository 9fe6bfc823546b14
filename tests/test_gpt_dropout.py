"""Dropout: inverted-dropout semantics in both frameworks, all four sites live, eval turns them off."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")  # the reference side: torch-free installs skip this module

from parity import report_gpt  # noqa: E402

P = 0.2  # shakespeare_char's dropout
TINY = dict(block_size=16, vocab_size=65, n_layer=2, n_head=2, n_embd=32, dropout=P, bias=True)
N = 200_000
SIGMA5 = 5 * np.sqrt(P * (1 - P) / N)  # 5 standard errors of a dropped fraction over N draws


def _check_mask(name, out):
    out = np.asarray(out, np.float64)
    dropped = out == 0.0
    assert abs(dropped.mean() - P) < SIGMA5, f"{name}: dropped {dropped.mean():.4f}, want {P}"
    # inverted dropout: survivors are scaled by 1/(1-p), so the expectation is unchanged
    np.testing.assert_allclose(out[~dropped], 1.0 / (1.0 - P), rtol=1e-6, err_msg=name)


def test_keep_probability_and_scaling_in_both_frameworks():
    _check_mask("nnx.Dropout", nnx.Dropout(P, rngs=nnx.Rngs(dropout=0))(jnp.ones(N)))
    torch.manual_seed(0)
    _check_mask("torch nn.Dropout", torch.nn.Dropout(P).train()(torch.ones(N)))


def _sites(model):
    yield "drop (embeddings)", model.drop
    for i, block in enumerate(model.h):
        yield f"h.{i}.attn.attn_dropout (probabilities)", block.attn.attn_dropout
        yield f"h.{i}.attn.resid_dropout", block.attn.resid_dropout
        yield f"h.{i}.mlp.dropout", block.mlp.dropout


def test_each_of_the_four_sites_is_live_in_train_mode():
    _, jmodel = report_gpt.build_pair(TINY, "float32")  # eval(): every site off
    idx, targets = (jnp.asarray(t.numpy()[:1]) for t in report_gpt.batch(TINY))
    eval_logits = jmodel(idx, targets)[0]
    sites = list(_sites(jmodel))
    assert len(sites) == 1 + 3 * TINY["n_layer"]
    for name, site in sites:
        site.deterministic = False  # only this site in train mode
        changed = np.abs(np.asarray(jmodel(idx, targets)[0] - eval_logits)).max()
        site.deterministic = True
        assert changed > 1e-4, f"{name} did not change the output in train mode"
    assert np.array_equal(jmodel(idx, targets)[0], eval_logits)  # all off again: deterministic


@pytest.mark.parametrize("flash", [True, False], ids=["torch-flash", "torch-manual"])
def test_train_mode_differs_from_eval_mode_in_both(flash):
    tmodel, jmodel = report_gpt.build_pair(TINY, "float32", flash=flash)
    idx, targets = report_gpt.batch(TINY)
    with torch.no_grad():
        t_eval = tmodel(idx, targets)[1].item()
        tmodel.train()
        t_train = [tmodel(idx, targets)[1].item() for _ in range(2)]
    j_eval = float(jmodel(jnp.asarray(idx.numpy()), jnp.asarray(targets.numpy()))[1])
    jmodel.train()
    j_train = [
        float(jmodel(jnp.asarray(idx.numpy()), jnp.asarray(targets.numpy()))[1]) for _ in range(2)
    ]
    assert abs(j_eval - t_eval) < 1e-5 * abs(t_eval)  # same weights, eval: same loss
    for name, ev, tr in (("torch", t_eval, t_train), ("jax", j_eval, j_train)):
        assert all(abs(x - ev) > 1e-6 for x in tr), f"{name}: train-mode loss equals eval loss"
        assert abs(tr[0] - tr[1]) > 1e-6, f"{name}: two train-mode calls drew the same masks"
    jmodel.eval()
    assert float(jmodel(jnp.asarray(idx.numpy()), jnp.asarray(targets.numpy()))[1]) == j_eval

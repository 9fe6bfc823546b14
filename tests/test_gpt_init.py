"""Initialisation statistics: N(0, 0.02) untruncated, c_proj 0.02/sqrt(2 n_layer), zero biases, LN ones."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")  # the reference side: torch-free installs skip this module

from models.gpt import GPT, GPTConfig  # noqa: E402
from parity import gpt_torch  # noqa: E402
from parity.gpt_params import to_torch  # noqa: E402

CFG = dict(block_size=128, vocab_size=512, n_layer=4, n_head=4, n_embd=128, dropout=0.0, bias=True)


def _check_stats(sd: dict, n_layer: int, who: str):
    c_proj_std = 0.02 / math.sqrt(2 * n_layer)
    checked = 0
    for k, v in sd.items():
        w = np.asarray(v, np.float64)
        if k.endswith("ln_1.weight") or k.endswith("ln_2.weight") or k.endswith("ln_f.weight"):
            assert (w == 1.0).all(), f"{who} {k}: LayerNorm weight must start at 1"
        elif k.endswith(".bias"):
            assert (w == 0.0).all(), f"{who} {k}: biases must start at 0"
        else:
            std = c_proj_std if k.endswith("c_proj.weight") else 0.02
            n = w.size
            # sampling error of a normal's sample std is std/sqrt(2n), of its mean std/sqrt(n)
            assert abs(w.std() - std) < 5 * std / math.sqrt(2 * n), (
                f"{who} {k}: std {w.std():.5f} vs {std:.5f}"
            )
            assert abs(w.mean()) < 5 * std / math.sqrt(n), f"{who} {k}: mean {w.mean():.2e}"
            if n >= 16_384:  # untruncated: a 2-sigma truncated normal never passes 2 std
                assert np.abs(w).max() > 3.5 * std, f"{who} {k}: looks truncated"
        checked += 1
    assert checked == len(sd) - ("lm_head.weight" in sd)


def test_init_statistics_nnx():
    model = GPT(GPTConfig(**CFG), rngs=nnx.Rngs(0))
    sd = to_torch(model)
    del sd["lm_head.weight"]  # tied: the same array as wte
    _check_stats(sd, CFG["n_layer"], "nnx")


def test_init_statistics_torch_reference():
    torch.manual_seed(0)
    model = gpt_torch.GPT(gpt_torch.GPTConfig(**CFG))
    sd = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    _check_stats(sd, CFG["n_layer"], "torch")


def test_init_is_seeded_and_tied():
    a = GPT(GPTConfig(**CFG), rngs=nnx.Rngs(0))
    b = GPT(GPTConfig(**CFG), rngs=nnx.Rngs(0))
    c = GPT(GPTConfig(**CFG), rngs=nnx.Rngs(1))
    la, lb, lc = (jax.tree.leaves(nnx.state(m, nnx.Param)) for m in (a, b, c))
    assert all(np.array_equal(x, y) for x, y in zip(la, lb))
    assert not np.array_equal(la[-1], lc[-1])
    # one (V, C) array serves the lookup and the head: there is no separate lm_head parameter
    assert not hasattr(a, "lm_head")
    assert a.get_num_params(non_embedding=False) == sum(x.size for x in la)

"""Test-time scaling (models/trm/scaling.py, docs/evaluation.md "Test-time scaling"): K noisy
trajectories per puzzle, one answer chosen by the Q head or a vote.

What is proven here, on tiny random-weight TRMs in float32 (default tier, but the first-k test and
four of the archs, which are slow):
- one trajectory without noise IS the plain evaluation: every sum, every per-step sum, the
  predictions and q, EXACTLY (the same eval_step on the same rows);
- the same seed gives the same result, another seed another; the K trajectories of a puzzle
  really differ (predictions and q);
- a trajectory's noise depends on its puzzle, its index and the seed only: the first k of K
  trajectories are a run with k trajectories (by_k[k] equals it), and the batch a puzzle runs in
  changes nothing;
- the selection rules on made-up answers: q_halt takes the highest q, vote the most common
  answer, ties by the best q; the oracle counts a puzzle any trajectory got right;
- every arch noises the latent the docs name, and runs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.trm import TRM
from models.trm.evaluation import LatentNoise, eval_step, noised_latents
from models.trm.scaling import prefix_ks, select_answers, trajectories_step
from models.trm.training import TRMOptimConfig, init_train_state
from parity.trm_fixtures import make_batch, tiny_config

OPTIM = TRMOptimConfig()


def _model_state(variant="mlp_t", **overrides):
    """A random-weight TRM whose Q head reads the latent (upstream initialises it to a constant
    -5, which no trajectory could change)."""
    cfg = tiny_config(
        variant, "float32", batch_size=6, halt_max_steps=2, hidden_size=32, loss_dtype="float32",
        **overrides,
    )  # fmt: skip
    model = TRM(cfg, rngs=nnx.Rngs(0))
    w = model.inner.q_head.weight[...]
    model.inner.q_head.weight[...] = jax.random.normal(jax.random.key(1), w.shape, w.dtype)
    model.train()
    graphdef, state = init_train_state(model, OPTIM)
    return cfg, graphdef, state


def _batch(cfg, seed=0, first=0):
    b = make_batch(cfg, seed)
    b["example"] = np.arange(first, first + cfg.batch_size, dtype=np.int32)
    return {k: jnp.asarray(v) for k, v in b.items()}


@functools.cache
def _jit(graphdef, **kw):
    return jax.jit(functools.partial(trajectories_step, graphdef, **kw))


@pytest.mark.parametrize("noise", [None, LatentNoise(0.0, seed=5)])
def test_one_trajectory_without_noise_is_the_plain_evaluation(noise):
    cfg, graphdef, state = _model_state()
    batch = _batch(cfg)
    plain = jax.jit(functools.partial(eval_step, graphdef))(
        state, {k: v for k, v in batch.items() if k != "example"}
    )
    one = _jit(graphdef, trajectories=1, noise=noise)(state, batch)
    for part in ("sums", "per_step"):
        assert one[part].keys() == plain[part].keys()
        for k in plain[part]:
            np.testing.assert_array_equal(np.asarray(one[part][k]), np.asarray(plain[part][k]))
    np.testing.assert_array_equal(np.asarray(one["preds"]), np.asarray(plain["preds"]))
    np.testing.assert_array_equal(
        np.asarray(one["q_halt_logits"]), np.asarray(plain["q_halt_logits"])
    )
    # the chosen answer's sums are the plain ones too (one trajectory per puzzle)
    assert float(one["chosen"]["exact_accuracy"]) == float(plain["sums"]["exact_accuracy"])
    assert float(one["chosen"]["count"]) == float(plain["sums"]["count"])


def test_same_seed_same_result_and_the_trajectories_differ():
    cfg, graphdef, state = _model_state()
    batch = _batch(cfg)
    fn = _jit(graphdef, trajectories=4, noise=LatentNoise(1.0, seed=3))
    a, b = fn(state, batch), fn(state, batch)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # every trajectory of every puzzle, before selection
    noisy = _trajectory_outputs(graphdef, state, batch, 4, LatentNoise(1.0, seed=3))
    preds_bkl, q_bk = noisy
    assert all(len(set(map(bytes, preds_bkl[i]))) > 1 for i in range(len(preds_bkl)))
    assert all(len(set(q_bk[i].tolist())) == 4 for i in range(len(q_bk)))
    other = _trajectory_outputs(graphdef, state, batch, 4, LatentNoise(1.0, seed=4))
    assert not np.array_equal(other[1], q_bk)


def _trajectory_outputs(graphdef, state, batch, K, noise):
    """(preds [B, K, L], q [B, K]) of every trajectory: eval_step on the rows K times over."""
    rows = {k: jnp.repeat(v, K, axis=0) for k, v in batch.items() if k != "example"}
    B = batch["labels"].shape[0]
    ids = np.stack(np.meshgrid(np.asarray(batch["example"]), np.arange(K), indexing="ij"), -1)
    rows["noise_ids"] = jnp.asarray(ids.reshape(B * K, 2), jnp.int32)
    out = jax.jit(functools.partial(eval_step, graphdef, noise=noise))(state, rows)
    L = batch["labels"].shape[1]
    return (
        np.asarray(out["preds"]).reshape(B, K, L),
        np.asarray(out["q_halt_logits"]).reshape(B, K),
    )


@pytest.mark.slow  # five programs; test_evaluate's slow tests check the seed end to end too
def test_the_first_k_trajectories_are_a_run_with_k_and_the_batch_changes_nothing():
    cfg, graphdef, state = _model_state()
    batch = _batch(cfg)
    noise = LatentNoise(1.0, seed=7)
    eight = _trajectory_outputs(graphdef, state, batch, 8, noise)
    two = _trajectory_outputs(graphdef, state, batch, 2, noise)
    np.testing.assert_array_equal(eight[0][:, :2], two[0])
    np.testing.assert_allclose(eight[1][:, :2], two[1], rtol=1e-6, atol=1e-6)
    # the K=8 run's by_k[2] is the K=2 run's answer
    k8 = _jit(graphdef, trajectories=8, noise=noise)(state, batch)
    k2 = _jit(graphdef, trajectories=2, noise=noise)(state, batch)
    assert float(k8["by_k"][2]["exact_accuracy"]) == float(k2["chosen"]["exact_accuracy"])
    np.testing.assert_allclose(
        float(k8["by_k"][2]["accuracy"]), float(k2["chosen"]["accuracy"]), rtol=1e-6
    )
    # puzzles 3..5 alone (their own batch, other rows around them) draw the same noise
    half = {k: v[3:] for k, v in batch.items()}
    alone = _trajectory_outputs(graphdef, state, half, 2, noise)
    np.testing.assert_array_equal(alone[0], two[0][3:])


def test_selection_rules_on_made_up_answers():
    """3 puzzles of 4 cells, 4 trajectories each; label of every puzzle [1, 2, 3, 4] (puzzle 2
    has one unlabelled cell, where answers may differ)."""
    labels = np.array([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, -100]], np.int32)
    R, W, V = [1, 2, 3, 4], [1, 2, 3, 9], [9, 9, 9, 9]  # right, wrong, other wrong
    preds = np.array(
        [
            [W, W, R, V],  # vote: W (2 of 4); q_halt: the q of R is highest
            [R, V, V, R],  # vote tie R/V (2 each): R's best q is 0.9, V's 0.8
            [W, R, [1, 2, 3, 7], V],  # cell 4 unlabelled: W, R and [1,2,3,7] are one answer
        ],
        np.int32,
    )
    q = np.array([[0.1, 0.2, 0.9, 0.3], [0.9, 0.8, 0.1, -1.0], [0.0, 0.0, 0.5, 2.0]], np.float32)
    ks = (1, 2, 4)
    by_q, idx_q, count = select_answers(
        jnp.asarray(preds), jnp.asarray(q), jnp.asarray(labels), select="q_halt", ks=ks
    )
    by_v, idx_v, _ = select_answers(
        jnp.asarray(preds), jnp.asarray(q), jnp.asarray(labels), select="vote", ks=ks
    )
    assert float(count) == 3
    assert np.asarray(idx_q).tolist() == [2, 0, 3]
    assert np.asarray(idx_v).tolist() == [0, 0, 0]  # puzzle 3: the group of 3 (first of it)
    assert float(by_q[4]["exact_accuracy"]) == 2  # R, R, V
    assert float(by_v[4]["exact_accuracy"]) == 2  # W, R, [1,2,3,*]
    assert float(by_q[1]["exact_accuracy"]) == 2  # trajectory 0 alone: W, R, W (right on 3)
    assert [float(by_q[k]["oracle_exact_accuracy"]) for k in ks] == [2, 2, 3]
    assert float(by_v[4]["accuracy"]) == pytest.approx(0.75 + 1 + 1)


@pytest.mark.parametrize(
    "variant, noised",
    [  # the default tier runs hier6 (six latents); the others ~6 s each in the slow tier
        pytest.param("att", ("z_L",), marks=pytest.mark.slow),
        pytest.param("hrm", ("z_L",), marks=pytest.mark.slow),
        pytest.param("singlez", ("z_L",), marks=pytest.mark.slow),
        ("hier6", ("z_L1", "z_L2", "z_L3", "z_L4", "z_L5", "z_L6")),
        pytest.param("baseline", ("z_H",), marks=pytest.mark.slow),
    ],
)
def test_every_arch_noises_its_low_level_latent_and_runs(variant, noised):
    cfg, graphdef, state = _model_state(variant)
    model = nnx.merge(graphdef, state.params, state.table, state.rest)
    assert noised_latents(model.inner.latent_names) == noised
    batch = _batch(cfg)
    preds_bkl, q_bk = _trajectory_outputs(graphdef, state, batch, 3, LatentNoise(2.0, seed=1))
    assert np.isfinite(q_bk).all()
    assert not np.array_equal(q_bk[:, 0], q_bk[:, 1])


def test_prefix_ks():
    assert prefix_ks(1) == (1,)
    assert prefix_ks(16) == (1, 2, 4, 8, 16)
    assert prefix_ks(100) == (1, 2, 4, 8, 16, 32, 64, 100)

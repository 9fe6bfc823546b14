"""ACT wrapper behaviour that a parity run with one fixed setting could miss: eval halting,
per-row exploration from the model's RNG stream, labels read from the carry, detached carry."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.trm import TRM, act_loss
from parity.trm_draws import with_draws
from parity.trm_fixtures import tiny_config

# parity.trm_fixtures's tiny mlp_t config: 16 rows (per-row draws), at most 8 ACT steps, and no
# exploration unless a test asks for it.
CFG = tiny_config("mlp_t", batch_size=16, halt_max_steps=8, halt_exploration_prob=0.0)


def _batch(seed, cfg=CFG):
    r = np.random.default_rng(seed)
    shape = (cfg.batch_size, cfg.seq_len)
    return {
        "inputs": jnp.asarray(r.integers(0, cfg.vocab_size, shape), jnp.int32),
        "labels": jnp.asarray(r.integers(0, cfg.vocab_size, shape), jnp.int32),
        "puzzle_identifiers": jnp.zeros((cfg.batch_size,), jnp.int32),
    }


def _model(cfg=CFG, q_bias=10.0, seed=0):
    model = TRM(cfg, rngs=nnx.Rngs(seed))
    model.inner.q_head.bias[...] = jnp.full((2,), q_bias)  # q_halt = +10 > 0: "halt now"
    return model


@nnx.jit
def _step(model, carry, batch):
    return model(carry, batch)


def _halt_steps(model, n_steps):
    """Per row: the ACT step at which the row first halted (0 = never)."""
    carry = model.initial_carry(_batch(0))
    first = np.zeros(CFG.batch_size, int)
    for t in range(1, n_steps + 1):
        carry, _ = _step(model, carry, _batch(t))
        halted = np.asarray(carry.halted)
        first = np.where((first == 0) & halted, t, first)
        if halted.all():
            break
    return first


def test_eval_always_runs_halt_max_steps():
    model = _model()
    model.train()
    assert (_halt_steps(model, CFG.halt_max_steps) == 1).all()  # q_halt > 0 halts at once
    model.eval()
    assert (_halt_steps(model, CFG.halt_max_steps) == CFG.halt_max_steps).all()  # q head ignored


def test_exploration_is_drawn_per_row_from_the_model_stream():
    cfg = dataclasses.replace(CFG, halt_exploration_prob=1.0)  # every row explores
    model = _model(cfg)
    model.train()
    first = _halt_steps(model, cfg.halt_max_steps)
    # each row halts at its own min_halt draw in [2, halt_max_steps]
    assert ((first >= 2) & (first <= cfg.halt_max_steps)).all(), first
    assert len(set(first.tolist())) > 2, f"one draw for the whole batch? {first}"
    # the stream advances (nnx RNG state): a second rollout draws differently
    assert not np.array_equal(first, _halt_steps(model, cfg.halt_max_steps))


def test_given_exploration_draws_are_used_per_row():
    """The draws the halting rule reads (`_exploration_draws`, given here through
    parity.trm_draws) gate each row on its own: a row explores when its uniform draw is below
    halt_exploration_prob and then halts at its own min_halt draw."""
    cfg = dataclasses.replace(CFG, halt_exploration_prob=0.5)
    model = _model(cfg)
    model.train()
    b = cfg.batch_size
    u = jnp.asarray(np.linspace(0, 0.99, b), jnp.float32)  # rows < 0.5 explore
    k = jnp.asarray(np.arange(b) % 7 + 2, jnp.int32)
    model = with_draws(model, (u, k))
    carry = model.initial_carry(_batch(0))
    first = np.zeros(b, int)
    for t in range(1, cfg.halt_max_steps + 1):
        carry, _ = model(carry, _batch(t))
        first = np.where((first == 0) & np.asarray(carry.halted), t, first)
    expected = np.where(np.asarray(u) < 0.5, np.asarray(k), 1)
    np.testing.assert_array_equal(first, expected)


def test_loss_labels_come_from_the_carry_not_the_new_batch():
    model = _model(q_bias=-10.0)
    model.eval()
    a, b = _batch(1), _batch(2)
    carry = model.initial_carry(a)
    carry, _ = model(carry, a)
    carry, out = model(carry, b)  # no row halted: slots keep batch a
    np.testing.assert_array_equal(np.asarray(carry.current_data["labels"]), np.asarray(a["labels"]))
    _, m = act_loss(carry, out, loss_dtype="float32")
    wrong = dataclasses.replace(carry, current_data=dict(carry.current_data, labels=b["labels"]))
    _, m_wrong = act_loss(wrong, out, loss_dtype="float32")
    assert float(m["lm_loss"]) != float(m_wrong["lm_loss"])


def test_halted_slots_are_refilled_and_reset():
    model = _model(q_bias=10.0)
    model.train()
    a, b = _batch(1), _batch(2)
    carry, _ = model(model.initial_carry(a), a)  # all rows halt at step 1
    carry, _ = model(carry, b)
    np.testing.assert_array_equal(np.asarray(carry.current_data["inputs"]), np.asarray(b["inputs"]))
    np.testing.assert_array_equal(np.asarray(carry.steps), 1)


def test_carry_is_detached_between_act_steps():
    model = with_draws(_model())  # no row explores
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    batch = _batch(1)

    def carry_sum(params):
        m = nnx.merge(graphdef, params, rest)
        carry, _ = m(m.initial_carry(batch), batch)
        return sum(jnp.sum(z) for z in carry.inner_carry.values())

    grads = jax.grad(carry_sum)(params)
    assert all(float(jnp.abs(g).max()) == 0 for g in jax.tree.leaves(grads))

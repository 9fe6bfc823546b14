"""20 TRM training steps, JAX (models/trm/training.py `train_batch`) vs our PyTorch reference
following upstream's train_batch order (parity/trm_torch + parity/trm_torch/optim.py), in float64.

Both sides: the persistent ACT carry (slots refilled only where halted), a stream of batches with
duplicate puzzle ids, the same exploration draws, SignSGD then AdamATan2 each with its own lr from
the warm-up + cosine schedule (lr_min_ratio 0.1 < 1), the EMA after every step, and the last two
steps past total_steps (no update, EMA only). Every parameter, the puzzle table, the EMA and the
loss terms must agree after every step within the one-ulp envelope of the reference's own
trajectory (parity/envelope.py), the integer state and counts EXACT.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.trm.losses import normalize_metrics
from parity.compare import EXACT, FLOAT32, assert_close
from parity.envelope import assert_within_envelope, measure_envelope, perturbed_copies

torch = pytest.importorskip("torch")

from models.trm.training import (  # noqa: E402
    TRMOptimConfig,
    ema_model,
    init_state,
    init_train_state,
    train_step,
)
from models.trm.training import train_batch as port_train_batch  # noqa: E402
from parity.trm_draws import state_with_draws, with_draws  # noqa: E402
from parity.trm_fixtures import make_batch, make_pair, tiny_config, to_float64  # noqa: E402
from parity.trm_torch.optim import AdamATan2, EMAHelper, SparseSignSGD, train_batch  # noqa: E402

N_STEPS = 20
BATCH = 6
NUM_IDS = 5  # ids drawn from 0..2 only: rows 3 and 4 are never present and must keep their bits
TOTAL_STEPS = N_STEPS - 2  # steps 19 and 20 are past the end: skipped, EMA still moves
OPT = dict(
    lr=3e-3,
    lr_min_ratio=0.1,
    lr_warmup_steps=5,  # steps 1-4 warm up, 5-18 follow the cosine
    weight_decay=0.5,
    beta1=0.9,
    beta2=0.95,
    puzzle_emb_lr=1e-2,
    puzzle_emb_weight_decay=0.5,
    ema=True,
    ema_rate=0.9,  # upstream uses 0.999; 0.9 makes 20 steps of EMA visibly differ from params
)


def _config():
    return tiny_config(
        "att",
        "float64",
        batch_size=BATCH,
        num_puzzle_identifiers=NUM_IDS,
        hidden_size=32,
        num_heads=2,
        puzzle_emb_ndim=32,
        puzzle_emb_len=2,
        halt_max_steps=4,
        halt_exploration_prob=0.5,
    )


def _batches(config):
    out = []
    for i in range(N_STEPS):
        b = make_batch(config, seed=100 + i)
        b["puzzle_identifiers"] = np.random.default_rng(i).integers(0, 3, BATCH).astype(np.int32)
        out.append(b)
    return out


def _exploration(config):
    rng = np.random.default_rng(7)
    return [
        (rng.random(BATCH), rng.integers(2, config.halt_max_steps + 1, BATCH))
        for _ in range(N_STEPS)
    ]


def _float64_pair(config):
    """The paired models of parity.trm_fixtures.make_pair, moved to float64 on both sides (every
    stored value is float32-exact, so the casts are lossless and both start from the same bits)."""
    head, model = make_pair(config, seed=3, q_bias=0.0)  # q_bias 0: about half the rows halt
    return to_float64(head, model)


def _torch_key(path) -> str:
    return "model." + ".".join(str(p) for p in path)


def _flat(state) -> dict:
    return {_torch_key(p): v.get_value() for p, v in nnx.to_flat_state(state)}


def _np(t):
    return t.detach().numpy().copy() if hasattr(t, "detach") else np.asarray(t)


# Per step, both sides record the same names: integer state and counts under `exact`, the rest
# (every parameter, its EMA, the puzzle table, the carry, lrs, losses, gradient norms) under
# `floats`. A step past total_steps records no metrics (no forward on the torch side).
METRIC_FLOATS = ("lm_loss", "q_halt_loss", "accuracy")
METRIC_EXACT = ("count", "exact_accuracy", "q_halt_accuracy", "steps")


def _torch_trajectory(head, config, opt, batches, draws):
    """Upstream's pretrain.py loop on the reference: SignSGD then AdamATan2 (train_batch), the EMA
    after every step. Returns the per-step records and the EMA helper."""
    head.train()
    inner = head.model.inner
    pe = inner.puzzle_emb
    sign_sgd = SparseSignSGD(
        pe.weights, pe.local_weights, pe.local_ids, lr=0.0, weight_decay=opt.puzzle_emb_weight_decay
    )
    adam = AdamATan2(
        head.parameters(), lr=0.0, betas=(opt.beta1, opt.beta2), weight_decay=opt.weight_decay
    )
    ema = EMAHelper(mu=opt.ema_rate)
    ema.register(head)
    # The gradient norms the JAX step logs, read on the torch side just before each optimizer
    # step (train_batch zeroes the grads right after it).
    norms = {}

    def _norm(tensors):
        grads = [t.grad.reshape(-1) for t in tensors if t.grad is not None]
        return float(torch.linalg.vector_norm(torch.cat(grads))) if grads else 0.0

    sign_sgd.register_step_pre_hook(
        lambda *_: norms.update(puzzle_emb_grad_norm=_norm([pe.local_weights]))
    )
    adam.register_step_pre_hook(lambda *_: norms.update(grad_norm=_norm(list(head.parameters()))))
    params = dict(head.named_parameters())
    carry, records = None, []
    for i in range(N_STEPS):
        tb = {k: torch.from_numpy(v.copy()) for k, v in batches[i].items()}
        u, k = draws[i]
        if carry is None:
            carry = head.initial_carry(tb)
        out = {}

        def loss_fn(tb=tb, u=u, k=k, out=out):
            nonlocal carry
            carry, loss, metrics, _, _ = head(
                carry=carry,
                batch=tb,
                exploration=(torch.from_numpy(u).to(torch.float32), torch.from_numpy(k)),
            )
            out.update(metrics)
            return loss, metrics

        _, lrs = train_batch(
            loss_fn,
            [sign_sgd, adam],  # upstream's order: SignSGD first, then AdamATan2
            [opt.puzzle_emb_lr, opt.lr],
            i + 1,
            total_steps=TOTAL_STEPS,
            warmup_steps=opt.lr_warmup_steps,
            min_ratio=opt.lr_min_ratio,
            global_batch_size=BATCH,
        )
        ema.update(head)
        exact = {"halted": _np(carry.halted), "steps": _np(carry.steps)}
        exact["current_data.puzzle_identifiers"] = _np(carry.current_data["puzzle_identifiers"])
        floats = {f"param {n}": _np(p) for n, p in params.items()}
        floats.update({f"ema {n}": _np(ema.shadow[n]) for n in params})
        floats["puzzle table"] = _np(pe.weights)
        floats.update({f"carry {n}": _np(carry.inner_carry[n]) for n in ("z_H", "z_L")})
        if lrs is not None:
            floats.update(puzzle_emb_lr=np.float64(lrs[0]), lr=np.float64(lrs[1]))
            floats.update({k_: np.float64(v) for k_, v in norms.items()})
            floats.update({f"metrics.{k_}": _np(out[k_]) for k_ in METRIC_FLOATS})
            exact.update({f"metrics.{k_}": _np(out[k_]) for k_ in METRIC_EXACT})
        records.append((exact, floats))
    return records, ema


def _jax_trajectory(model, config, opt, batches, draws):
    """The port's jitted train_batch over the same batches and draws, recorded like the torch side.
    Returns the records, the last metrics of each step, and (graphdef, final state)."""
    model.train()
    graphdef, state = init_train_state(with_draws(model), opt)
    step_fn = jax.jit(
        functools.partial(port_train_batch, graphdef, config=opt, total_steps=TOTAL_STEPS)
    )
    carry = model.initial_carry({k: jnp.asarray(v) for k, v in batches[0].items()})
    records, all_metrics = [], []
    for i in range(N_STEPS):
        u, k = draws[i]
        jb = {k_: jnp.asarray(v) for k_, v in batches[i].items()}
        state = state_with_draws(graphdef, state, (u, k))
        state, carry, metrics = step_fn(state, carry, jb)
        assert int(state.step) == i + 1
        params, ema = _flat(state.params), _flat(state.ema)
        exact = {"halted": np.asarray(carry.halted), "steps": np.asarray(carry.steps)}
        exact["current_data.puzzle_identifiers"] = np.asarray(
            carry.current_data["puzzle_identifiers"]
        )
        exact.update({f"metrics.{k_}": np.asarray(metrics[k_]) for k_ in METRIC_EXACT})
        floats = {f"param {n}": np.asarray(v) for n, v in params.items()}
        floats.update({f"ema {n}": np.asarray(v) for n, v in ema.items()})
        floats["puzzle table"] = np.asarray(jax.tree.leaves(state.table)[0])
        floats.update({f"carry {n}": np.asarray(carry.inner_carry[n]) for n in ("z_H", "z_L")})
        floats.update({k_: np.asarray(v) for k_, v in metrics.items() if k_ in NORMS_AND_LRS})
        floats.update({f"metrics.{k_}": np.asarray(metrics[k_]) for k_ in METRIC_FLOATS})
        records.append((exact, floats))
        all_metrics.append(metrics)
    return records, all_metrics, (graphdef, state)


NORMS_AND_LRS = ("lr", "puzzle_emb_lr", "grad_norm", "puzzle_emb_grad_norm")
ENVELOPE_SEEDS = (1, 2)


def _accuracy_float32(step: int, name: str):
    # upstream sums accuracy in float32 (is_correct.to(float32) / divisor): float32's bound
    return FLOAT32 if name == "metrics.accuracy" else None


def test_training_trajectory_matches_torch_float64(x64):
    """Every parameter, its EMA, the puzzle table, the carry, the lrs, the loss terms and the
    gradient norms after each of 20 steps, within the one-ulp envelope of the reference's own
    trajectory (parity/envelope.py): one ulp of every initial weight, the same 20 steps, how far
    the reference moves is what round-off alone does by that step; integer state EXACT."""
    config = _config()
    batches, draws = _batches(config), _exploration(config)
    head, model = _float64_pair(config)
    # Upstream casts q to float32; the models cast to promote_types(float32, forward dtype), the
    # same for float32/bf16. A float32 q here would be a float32 island: its BCE gradient differs
    # by float32 ulps between torch and XLA and the trajectories part at ~1e-9 from step 2.
    z = jnp.zeros((1, config.total_len, config.hidden_size), jnp.float64)
    assert model.inner.heads(z)[1][0].dtype == jnp.float64
    opt = TRMOptimConfig(**OPT)
    pe = head.model.inner.puzzle_emb
    initial_table = pe.weights.clone()
    perturbed = [
        _torch_trajectory(h, config, opt, batches, draws)[0]
        for h in perturbed_copies(head, ENVELOPE_SEEDS)
    ]
    ref, ema = _torch_trajectory(head, config, opt, batches, draws)
    envelope = measure_envelope(ref, perturbed)
    port, metrics, (graphdef, state) = _jax_trajectory(model, config, opt, batches, draws)
    torch_params = dict(head.named_parameters())
    assert set(_flat(state.params)) == set(torch_params)  # the EMA/Adam set is exactly the Params
    assert_within_envelope(port, ref, envelope, tolerance_for=_accuracy_float32)

    saw_halt_mix = saw_duplicates = False
    for i, (exact, _) in enumerate(port):
        if i + 1 > TOTAL_STEPS:  # skipped step: no forward on the torch side, all sums zero
            assert all(
                float(v) == 0.0 for k, v in metrics[i].items() if k not in ("lr", "puzzle_emb_lr")
            )
            continue
        halted = exact["halted"]
        saw_halt_mix |= bool(halted.any() and not halted.all())
        ids = exact["current_data.puzzle_identifiers"]
        saw_duplicates |= len(set(ids.tolist())) < len(ids)

    # the test exercised what it claims
    assert saw_halt_mix, "no step had both halted and running rows"
    assert saw_duplicates, "no step had duplicate puzzle ids"
    final_table = jax.tree.leaves(state.table)[0]
    assert_close("never-present rows 3-4", final_table[3:], initial_table[3:], EXACT)
    assert not np.allclose(np.asarray(final_table[:3]), initial_table[:3].numpy())
    # EMA differs from the live params, and the eval model carries EMA params + live buffers
    last = len(ref) - 1
    eval_model = ema_model(graphdef, state)
    assert not eval_model.training
    e = _flat(nnx.state(eval_model, nnx.Param))
    for n in torch_params:
        assert_close(n, e[n], ema.shadow[n], envelope.tolerance(last, f"ema {n}"))
    teval = ema.ema_copy(head)
    assert_close(
        "eval table is live",
        eval_model.puzzle_emb.weights[...],
        teval.model.inner.puzzle_emb.weights,
        envelope.tolerance(last, "puzzle table"),
    )
    live = nnx.merge(graphdef, state.params, state.table, state.rest)
    for name in ("H_init", "L_init"):  # buffers: live values, not averaged, never trained
        value = getattr(eval_model.inner, name)[...]
        assert_close(f"eval {name} is live", value, getattr(live.inner, name)[...], EXACT)
        assert_close(f"torch eval {name}", value, getattr(teval.model.inner, name), EXACT)
    jparams = _flat(state.params)
    assert not np.allclose(
        np.asarray(e["model.inner.lm_head.weight"]),
        np.asarray(jparams["model.inner.lm_head.weight"]),
    )
    # normalisation (upstream pretrain.py): losses / global batch, the rest / max(count, 1)
    last_out = metrics[TOTAL_STEPS - 1]
    norm = normalize_metrics(
        {k: float(v) for k, v in last_out.items()}, mode="train", global_batch_size=BATCH
    )
    assert norm["lm_loss"] == pytest.approx(float(last_out["lm_loss"]) / BATCH)
    count = max(float(last_out["count"]), 1)
    assert norm["steps"] == pytest.approx(float(last_out["steps"]) / count)


def test_train_step_refuses_an_empty_schedule():
    """A schedule of no steps is refused by name while tracing (no weights needed): the step's
    contract, (state with its carry, batch) -> (state, metrics), down to train_batch."""
    config = tiny_config("att", "float32", batch_size=4)
    opt = TRMOptimConfig()
    from models.trm import TRM

    def run():
        model = TRM(config, rngs=nnx.Rngs(0))
        batch = {k: jnp.asarray(v) for k, v in make_batch(config).items()}
        graphdef, state = init_state(model, opt, batch)
        return train_step(graphdef, state, batch, config=opt, total_steps=0)

    with pytest.raises(ValueError, match="total_steps=0: expected > 0"):
        jax.eval_shape(run)


@pytest.mark.slow
def test_train_step_float32_without_x64_jit_donated():
    """The production shape: float32 forward, x64 off (loss_dtype float32), the trainer's
    contract (the carry inside the state) jitted with the state donated; 3 steps change the params
    and the table, stay finite, and log upstream's normalised metrics in float32."""
    config = tiny_config(
        "att", "float32", batch_size=4, num_puzzle_identifiers=3, loss_dtype="float32"
    )
    from models.trm import TRM

    model = TRM(config, rngs=nnx.Rngs(0))
    model.train()
    opt = TRMOptimConfig(lr_warmup_steps=2, puzzle_emb_lr=1e-2)
    batch = {k: jnp.asarray(v) for k, v in make_batch(config).items()}
    graphdef, state = init_state(model, opt, batch)
    before = jax.tree.map(np.asarray, (state["train"].params, state["train"].table))
    step = functools.partial(train_step, graphdef, config=opt, total_steps=10)
    step_fn = jax.jit(step, donate_argnums=0)
    for _ in range(3):
        state, metrics = step_fn(state, batch)
    assert int(state["train"].step) == 3
    assert float(metrics["lr"]) == pytest.approx(1e-4)  # step 3 >= warm-up 2: full base lr
    after = jax.tree.map(np.asarray, (state["train"].params, state["train"].table))
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(after))
    changed = [
        not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after))
    ]
    assert all(changed), "every Param and the puzzle table must move"
    assert all(v.dtype == jnp.float32 for v in metrics.values())
    assert 0 <= float(metrics["accuracy"]) <= 1 and np.isfinite(float(metrics["lm_loss"]))

"""20 TRM training steps, JAX (models/trm/train_step.py) vs our PyTorch reference following
upstream's train_batch order (parity/trm_torch + parity/trm_torch_optim.py), in float64.

Both sides: the persistent ACT carry (slots refilled only where halted), a stream of batches with
duplicate puzzle ids, the same exploration draws, SignSGD then AdamATan2 each with its own lr from
the warm-up + cosine schedule (lr_min_ratio 0.1 < 1), the EMA after every step, and the last two
steps past total_steps (no update, EMA only). Every parameter, the puzzle table, the EMA and the
loss terms must agree within TRAJECTORY_F64 (1e-10) after every step.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from parity.compare import EXACT, FLOAT32, TRAJECTORY_F64, assert_all_close, assert_close

torch = pytest.importorskip("torch")

from models.trm.train_step import (  # noqa: E402
    TRMOptimConfig,
    ema_model,
    init_train_state,
    merge_model,
    normalize_train_metrics,
    train_step,
)
from parity.report_trm import make_batch, make_pair, tiny_config  # noqa: E402
from parity.trm_torch_optim import AdamATan2, EMAHelper, SparseSignSGD, train_batch  # noqa: E402

N_STEPS = 20
BATCH = 6
NUM_IDS = 5  # ids drawn from 0..2 only: rows 3 and 4 are never present and must keep their bits
OPT = dict(
    global_batch_size=BATCH,
    total_steps=N_STEPS - 2,  # steps 19 and 20 are past the end: skipped, EMA still moves
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
    """B's paired models, moved to float64 on both sides (every stored value is float32-exact, so
    the casts are lossless and both start from the same bits)."""
    head, model = make_pair(config, seed=3, q_bias=0.0)  # q_bias 0: about half the rows halt
    head.double()
    pe = head.model.inner.puzzle_emb
    # .double() turns the grad-receiving leaf into a non-leaf copy; make it a float64 leaf again
    pe.local_weights = torch.zeros(pe.local_weights.shape, dtype=torch.float64, requires_grad=True)
    for _, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Variable) and not isinstance(var, nnx.RngState):
            value = var.get_value()
            if jnp.issubdtype(value.dtype, jnp.floating):
                var.set_value(jnp.asarray(value, jnp.float64))
    return head, model


def _torch_key(path) -> str:
    return "model." + ".".join(str(p) for p in path)


def _flat(state) -> dict:
    return {_torch_key(p): v.get_value() for p, v in nnx.to_flat_state(state)}


def test_training_trajectory_matches_torch_float64(x64):
    config = _config()
    batches, draws = _batches(config), _exploration(config)
    head, model = _float64_pair(config)
    # Upstream casts q to float32; the models cast to promote_types(float32, forward dtype), the
    # same for float32/bf16. A float32 q here would be a float32 island: its BCE gradient differs
    # by float32 ulps between torch and XLA and the trajectories part at ~1e-9 from step 2.
    z = jnp.zeros((1, config.total_len, config.hidden_size), jnp.float64)
    assert model.inner.heads(z)[1][0].dtype == jnp.float64
    head.train()
    model.train()
    opt = TRMOptimConfig(**OPT)

    # --- torch: upstream's pretrain.py loop ---------------------------------------------------
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
    torch_norms = {}

    def _norm(tensors):
        grads = [t.grad.reshape(-1) for t in tensors if t.grad is not None]
        return float(torch.linalg.vector_norm(torch.cat(grads))) if grads else 0.0

    sign_sgd.register_step_pre_hook(
        lambda *_: torch_norms.update(puzzle_emb_grad_norm=_norm([pe.local_weights]))
    )
    adam.register_step_pre_hook(
        lambda *_: torch_norms.update(grad_norm=_norm(list(head.parameters())))
    )

    # --- JAX -------------------------------------------------------------------------------
    graphdef, state = init_train_state(model, opt)
    step_fn = jax.jit(functools.partial(train_step, graphdef, config=opt))
    jcarry = model.initial_carry({k: jnp.asarray(v) for k, v in batches[0].items()})
    tcarry = None

    torch_params = dict(head.named_parameters())
    assert set(_flat(state.params)) == set(torch_params)  # the EMA/Adam set is exactly the Params
    initial_table = pe.weights.clone()
    saw_halt_mix = saw_duplicates = False
    last_out = {}
    for i in range(N_STEPS):
        step = i + 1
        tb = {k: torch.from_numpy(v.copy()) for k, v in batches[i].items()}
        u, k = draws[i]
        if tcarry is None:
            tcarry = head.initial_carry(tb)
        out = {}

        def loss_fn(tb=tb, u=u, k=k, out=out):
            nonlocal tcarry
            tcarry, loss, metrics, _, _ = head(
                carry=tcarry,
                batch=tb,
                exploration=(torch.from_numpy(u).to(torch.float32), torch.from_numpy(k)),
            )
            out.update(metrics)
            return loss, metrics

        _, lrs = train_batch(
            loss_fn,
            [sign_sgd, adam],  # upstream's order: SignSGD first, then AdamATan2
            [opt.puzzle_emb_lr, opt.lr],
            step,
            total_steps=opt.total_steps,
            warmup_steps=opt.lr_warmup_steps,
            min_ratio=opt.lr_min_ratio,
            global_batch_size=opt.global_batch_size,
        )
        ema.update(head)

        jb = {k_: jnp.asarray(v) for k_, v in batches[i].items()}
        state, jcarry, metrics = step_fn(
            state, jcarry, jb, exploration=(jnp.asarray(u, jnp.float32), jnp.asarray(k, jnp.int32))
        )

        # --- compare everything after this step ------------------------------------------
        assert int(state.step) == step
        jparams, jema = _flat(state.params), _flat(state.ema)
        table = jax.tree.leaves(state.table)[0]
        pairs = [(f"step{step} {n}", jparams[n], p) for n, p in torch_params.items()]
        pairs += [(f"step{step} ema {n}", jema[n], ema.shadow[n]) for n in torch_params]
        pairs.append((f"step{step} puzzle table", table, pe.weights))
        assert_all_close(pairs, TRAJECTORY_F64)
        for name in ("z_H", "z_L"):
            assert_close(
                f"step{step} carry {name}",
                jcarry.inner_carry[name],
                tcarry.inner_carry[name],
                TRAJECTORY_F64,
            )
        assert_close(f"step{step} halted", jcarry.halted, tcarry.halted, EXACT)
        assert_close(f"step{step} steps", jcarry.steps, tcarry.steps, EXACT)
        if lrs is None:  # skipped step: no forward on the torch side, all sums zero here
            assert step > opt.total_steps
            assert all(
                float(v) == 0.0 for kk, v in metrics.items() if kk not in ("lr", "puzzle_emb_lr")
            )
        else:
            assert_close(f"step{step} lr", metrics["lr"], lrs[1], TRAJECTORY_F64)
            assert_close(
                f"step{step} puzzle_emb_lr", metrics["puzzle_emb_lr"], lrs[0], TRAJECTORY_F64
            )
            assert_close(f"step{step} lm_loss", metrics["lm_loss"], out["lm_loss"], TRAJECTORY_F64)
            assert_close(
                f"step{step} q_halt_loss",
                metrics["q_halt_loss"],
                out["q_halt_loss"],
                TRAJECTORY_F64,
            )
            for key in ("grad_norm", "puzzle_emb_grad_norm"):
                assert_close(f"step{step} {key}", metrics[key], torch_norms[key], TRAJECTORY_F64)
            for key in ("count", "exact_accuracy", "q_halt_accuracy", "steps"):
                assert_close(f"step{step} {key}", metrics[key], out[key], EXACT)
            # upstream sums accuracy in float32 (is_correct.to(float32) / divisor): float32's bound
            assert_close(f"step{step} accuracy", metrics["accuracy"], out["accuracy"], FLOAT32)
            halted = np.asarray(jcarry.halted)
            last_out = out
            saw_halt_mix |= bool(halted.any() and not halted.all())
            ids = np.asarray(jcarry.current_data["puzzle_identifiers"])
            saw_duplicates |= len(set(ids.tolist())) < len(ids)

    # the test exercised what it claims
    assert saw_halt_mix, "no step had both halted and running rows"
    assert saw_duplicates, "no step had duplicate puzzle ids"
    final_table = jax.tree.leaves(state.table)[0]
    assert_close("never-present rows 3-4", final_table[3:], initial_table[3:], EXACT)
    assert not np.allclose(np.asarray(final_table[:3]), initial_table[:3].numpy())
    # EMA differs from the live params, and the eval model carries EMA params + live buffers
    eval_model = ema_model(graphdef, state)
    assert not eval_model.training
    e = _flat(nnx.state(eval_model, nnx.Param))
    assert_all_close([(n, e[n], ema.shadow[n]) for n in torch_params], TRAJECTORY_F64)
    teval = ema.ema_copy(head)
    assert_close(
        "eval table is live",
        eval_model.puzzle_emb.weights[...],
        teval.model.inner.puzzle_emb.weights,
        TRAJECTORY_F64,
    )
    live = merge_model(graphdef, state)
    for name in ("H_init", "L_init"):  # buffers: live values, not averaged, never trained
        value = getattr(eval_model.inner, name)[...]
        assert_close(f"eval {name} is live", value, getattr(live.inner, name)[...], EXACT)
        assert_close(f"torch eval {name}", value, getattr(teval.model.inner, name), EXACT)
    assert not np.allclose(
        np.asarray(e["model.inner.lm_head.weight"]),
        np.asarray(jparams["model.inner.lm_head.weight"]),
    )
    # normalisation (upstream pretrain.py): losses / global batch, the rest / max(count, 1)
    norm = normalize_train_metrics({k: float(v) for k, v in last_out.items()}, BATCH)
    assert norm["lm_loss"] == pytest.approx(float(last_out["lm_loss"]) / BATCH)
    count = max(float(last_out["count"]), 1)
    assert norm["steps"] == pytest.approx(float(last_out["steps"]) / count)


def test_train_step_rejects_wrong_batch_size():
    """The loss is scaled by 1/global_batch_size: a batch of another size is refused by name."""
    config = tiny_config("att", "float32", batch_size=4)
    opt = TRMOptimConfig(global_batch_size=8, total_steps=5)
    from models.trm import TRM

    def run():  # abstract (eval_shape): the check fires while tracing, no weights needed
        model = TRM(config, rngs=nnx.Rngs(0))
        graphdef, state = init_train_state(model, opt)
        batch = {k: jnp.asarray(v) for k, v in make_batch(config).items()}
        return train_step(graphdef, state, model.initial_carry(batch), batch, config=opt)

    with pytest.raises(ValueError, match="has 4 rows but global_batch_size is 8"):
        jax.eval_shape(run)
    with pytest.raises(ValueError, match="total_steps must be > 0"):
        TRMOptimConfig(total_steps=0)


@pytest.mark.slow
def test_train_step_float32_without_x64_jit_donated():
    """The production shape: float32 forward, x64 off (loss_dtype float32), jitted with the
    state and carry donated; 3 steps change the params and the table and stay finite."""
    config = tiny_config("att", "float32", batch_size=4, num_puzzle_identifiers=3)
    from models.trm import TRM

    model = TRM(config, rngs=nnx.Rngs(0))
    model.train()
    opt = TRMOptimConfig(
        global_batch_size=4,
        total_steps=10,
        lr_warmup_steps=2,
        loss_dtype="float32",
        puzzle_emb_lr=1e-2,
    )
    graphdef, state = init_train_state(model, opt)
    before = jax.tree.map(np.asarray, (state.params, state.table))
    step_fn = jax.jit(functools.partial(train_step, graphdef, config=opt), donate_argnums=(0, 1))
    batch = {k: jnp.asarray(v) for k, v in make_batch(config).items()}
    carry = model.initial_carry(batch)
    for _ in range(3):
        state, carry, metrics = step_fn(state, carry, batch)
    assert int(state.step) == 3
    assert float(metrics["lr"]) == pytest.approx(1e-4)  # step 3 >= warm-up 2: full base lr
    after = jax.tree.map(np.asarray, (state.params, state.table))
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(after))
    changed = [
        not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after))
    ]
    assert all(changed), "every Param and the puzzle table must move"
    norm = normalize_train_metrics(metrics, 4)
    assert np.isfinite(float(norm["lm_loss"]))

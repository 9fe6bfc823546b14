"""models/trm/optim.py against our PyTorch reference (parity/trm_torch/optim.py) and against the
values worked by hand from upstream's formulas (AdamATan2, the puzzle-table SignSGD, the lr
schedule)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from models.trm.optim import (
    AdamATan2State,
    adam_atan2,
    ema_init,
    ema_update,
    sparse_sign_sgd,
    total_steps,
    trm_lr,
)
from parity.compare import EXACT, FLOAT32, FLOAT64, assert_all_close, assert_close

torch = pytest.importorskip("torch")
from parity.trm_torch.optim import (  # noqa: E402
    AdamATan2,
    EMAHelper,
    SparseSignSGD,
    compute_lr,
)

# --------------------------------------------------------------------------------------------
# AdamATan2
# --------------------------------------------------------------------------------------------

SHAPES = {"w": (6, 5), "b": (5,), "q": (2, 4)}


def _params_and_grads(rng: np.random.Generator, dtype, n_steps: int):
    params = {k: rng.normal(size=s).astype(dtype) for k, s in SHAPES.items()}
    grads = []
    for _ in range(n_steps):
        g = {k: rng.normal(size=s).astype(dtype) for k, s in SHAPES.items()}
        g["q"][1] = 0.0  # like q_head's q_continue row: never any gradient, but it must decay
        g["w"][0, 0] = 0.0  # an entry whose moments stay 0: atan2(0, 0) = 0
        grads.append(g)
    return params, grads


def _torch_adam(params, lr, wd):
    tparams = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in params.items()}
    opt = AdamATan2(list(tparams.values()), lr=lr, betas=(0.9, 0.95), weight_decay=wd)
    return tparams, opt


def _torch_step(tparams, opt, grads, lr):
    for k, p in tparams.items():
        p.grad = torch.tensor(grads[k])
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()


LRS = [0.0, 1e-3, 3e-3, 1e-2, 1e-2, 5e-3] + [2e-3] * 14  # lr = 0 first, as upstream's warm-up


def _run_trajectory(dtype, wd, n_steps):
    rng = np.random.default_rng(0)
    params, grads = _params_and_grads(rng, dtype, n_steps)
    tparams, opt = _torch_adam(params, 0.0, wd)
    tx = optax.inject_hyperparams(adam_atan2)(learning_rate=0.0, weight_decay=wd)
    jparams = {k: jnp.asarray(v) for k, v in params.items()}
    state = tx.init(jparams)

    @jax.jit
    def step(jparams, state, g, lr):
        state.hyperparams["learning_rate"] = lr
        updates, state = tx.update(g, state, jparams)
        return optax.apply_updates(jparams, updates), state

    history = []
    for i in range(n_steps):
        _torch_step(tparams, opt, grads[i], LRS[i])
        jparams, state = step(jparams, state, grads[i], jnp.asarray(LRS[i], dtype))
        history.append(({k: p.detach().clone() for k, p in tparams.items()}, jparams))
    return history, opt, tparams, state


def test_adam_atan2_matches_torch_float64(x64):
    """Single steps in float64 from identical states: <= 1e-12 (the optax form p + u vs torch's
    in-place decay-then-step differs only by round-off)."""
    rng = np.random.default_rng(1)
    params, grads = _params_and_grads(rng, np.float64, 6)
    tparams, opt = _torch_adam(params, 0.0, 1.0)
    tx = optax.inject_hyperparams(adam_atan2)(learning_rate=0.0, weight_decay=1.0)

    @jax.jit
    def step(jparams, inner, g, lr):
        state = tx.init(jparams)._replace(inner_state=inner)
        state.hyperparams["learning_rate"] = lr
        updates, state = tx.update(g, state, jparams)
        return optax.apply_updates(jparams, updates), state.inner_state

    for i in range(6):
        # start the JAX step from torch's exact current state
        jparams = {k: jnp.asarray(p.detach().numpy()) for k, p in tparams.items()}
        if i == 0:
            mu = jax.tree.map(jnp.zeros_like, jparams)
            nu = jax.tree.map(jnp.zeros_like, jparams)
        else:
            mu = {k: jnp.asarray(opt.state[p]["exp_avg"].numpy()) for k, p in tparams.items()}
            nu = {k: jnp.asarray(opt.state[p]["exp_avg_sq"].numpy()) for k, p in tparams.items()}
        inner = AdamATan2State(count=jnp.asarray(i, jnp.int32), mu=mu, nu=nu)
        new, state = step(jparams, inner, grads[i], jnp.asarray(LRS[i], jnp.float64))
        before = {k: p.detach().clone() for k, p in tparams.items()}
        _torch_step(tparams, opt, grads[i], LRS[i])
        assert_all_close([(f"step{i + 1}.{k}", new[k], tparams[k]) for k in SHAPES], FLOAT64)
        if LRS[i] == 0.0:  # lr = 0: nothing moves, but the moments are updated
            assert_all_close([(f"lr0.{k}", new[k], before[k]) for k in SHAPES], EXACT)
        assert_all_close(
            [(f"m{i + 1}.{k}", state.mu[k], opt.state[tparams[k]]["exp_avg"]) for k in SHAPES]
            + [(f"v{i + 1}.{k}", state.nu[k], opt.state[tparams[k]]["exp_avg_sq"]) for k in SHAPES],
            FLOAT64,
        )


def test_adam_atan2_trajectory_float64(x64):
    """20 steps run independently on both sides (lr injected per step, jitted) within FLOAT64.

    The optimizer alone has no recursion to amplify round-off: the measured worst deviation over
    the 20 steps is 6.8e-16 of scale natively, with XLA/ATen held to AVX2 and to SSE4.2/default
    alike, so FLOAT64 (1e-12) holds with three orders of margin."""
    history, *_ = _run_trajectory(np.float64, 0.1, 20)
    for i, (t, j) in enumerate(history):
        assert_all_close([(f"step{i + 1}.{k}", j[k], t[k]) for k in SHAPES], FLOAT64)


def test_adam_atan2_matches_torch_float32():
    history, *_ = _run_trajectory(np.float32, 0.1, 5)
    for i, (t, j) in enumerate(history):
        assert j["w"].dtype == jnp.float32
        assert_all_close([(f"step{i + 1}.{k}", j[k], t[k]) for k in SHAPES], FLOAT32)


def test_adam_atan2_zero_grad_row_still_decays(x64):
    """The q_continue row of q_head never gets a gradient; it must still shrink by (1 - lr*wd)
    each step (and move by nothing else, since atan2(0, 0) = 0)."""
    history, _, _, _ = _run_trajectory(np.float64, 0.5, 4)
    params, _ = _params_and_grads(np.random.default_rng(0), np.float64, 4)  # same draws
    row = params["q"][1].copy()
    for i, (_, j) in enumerate(history):
        row = row * (1 - LRS[i] * 0.5)
        assert_close(f"q[1] after step {i + 1}", j["q"][1], row, FLOAT64)
    assert not np.allclose(row, params["q"][1])  # the decay really happened


def test_adam_atan2_first_step_by_hand(x64):
    """One scalar worked by hand from imoneoi's AdamATan2 update, so a mistake shared by both implementations shows."""
    p, g, lr, wd = 1.0, 0.5, 0.1, 0.1
    m = 0.1 * g  # lerp from 0 with weight 1 - b1
    v = 0.05 * g * g
    expected = p * (1 - lr * wd) - lr / (1 - 0.9) * math.atan2(
        m, math.sqrt(v) / math.sqrt(1 - 0.95)
    )
    tx = adam_atan2(learning_rate=lr, weight_decay=wd)
    x = jnp.asarray([p])
    u, _ = tx.update(jnp.asarray([g]), tx.init(x), x)
    assert_close("p1", x + u, np.asarray([expected]), FLOAT64)
    # atan2 is not scale-invariant: 1/(1-b1^t) stays OUTSIDE it. Bias-correcting m inside
    # (atan2(m_hat, sqrt(v_hat)) = pi/4 here) would move p by 0.0785 instead of 0.0997.
    inside = p * (1 - lr * wd) - lr * math.atan2(m / (1 - 0.9), math.sqrt(v / (1 - 0.95)))
    assert abs(expected - inside) > 1e-2


def test_adam_atan2_schedule_callable_and_missing_params():
    """A schedule gets the count of previous updates (0 first); params are required."""
    seen = []
    tx = adam_atan2(learning_rate=lambda c: (seen.append(c), 0.0)[1])
    x = jnp.ones(3)
    u, s = tx.update(jnp.ones(3), tx.init(x), x)
    tx.update(jnp.ones(3), s, x)
    assert [int(c) for c in seen] == [0, 1]
    with pytest.raises(ValueError, match="needs params"):
        tx.update(jnp.ones(3), tx.init(x))


# --------------------------------------------------------------------------------------------
# Sparse SignSGD
# --------------------------------------------------------------------------------------------

N_ROWS, D = 7, 5
# id 3 three times: grads (+1, +1, -5) per coordinate -> the SUM is negative (sign -1) although
# two of three rows are positive; id 1 twice with opposite grads -> sum 0 -> sign 0 -> decay only.
IDS = np.array([3, 1, 3, 5, 3, 1, 0], np.int32)


def _sign_grads(dtype):
    rng = np.random.default_rng(2)
    g = rng.normal(size=(len(IDS), D)).astype(dtype)
    g[0], g[2], g[4] = 1.0, 1.0, -5.0
    g[1], g[5] = 2.0, -2.0
    return g


def _torch_sign_sgd(table, ids, grads, lr, wd):
    weights = torch.tensor(table)
    local_weights = torch.nn.Parameter(weights[torch.tensor(ids).long()].clone())
    local_ids = torch.tensor(ids)
    opt = SparseSignSGD(weights, local_weights, local_ids, lr=lr, weight_decay=wd)
    local_weights.grad = torch.tensor(grads)
    opt.step()
    return weights.numpy()


UPDATES = pytest.mark.parametrize("update", ["sparse", "dense"])


@UPDATES
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sparse_sign_sgd_matches_torch(dtype, update, x64):
    table = np.random.default_rng(3).normal(size=(N_ROWS, D)).astype(dtype)
    grads = _sign_grads(dtype)
    lr, wd = 0.01, 0.5
    expected = _torch_sign_sgd(table, IDS, grads, lr, wd)
    got = jax.jit(functools.partial(sparse_sign_sgd, update=update))(
        jnp.asarray(table), jnp.asarray(IDS), jnp.asarray(grads), learning_rate=lr, weight_decay=wd
    )
    assert got.dtype == table.dtype
    absent = np.array([2, 4, 6])
    present = np.array([0, 1, 3, 5])
    assert_close("absent rows", got[absent], table[absent], EXACT)  # no decay, same bits
    # not EXACT: XLA may fuse p*(1-lr*wd) - lr*s into one FMA (one rounding fewer than torch)
    tol = FLOAT64 if dtype == np.float64 else FLOAT32
    assert_close("present rows", got[present], expected[present], tol)
    # the formula by hand: duplicates summed, sign(0) = 0
    f = 1 - lr * wd
    assert_close("id 3 (sum of grads is negative)", got[3], table[3] * f + lr, tol)
    assert_close("id 1 (grads cancel, decay only)", got[1], table[1] * f, tol)


@UPDATES
def test_sparse_sign_sgd_moves_present_rows_by_lr(update):
    """Fails for a SignSGD that never updates (or updates the wrong rows): with wd = 0 every
    present row moves by exactly -lr * sign(g) and the others keep their bits."""
    table = jnp.asarray(np.random.default_rng(4).normal(size=(N_ROWS, D)), jnp.float32)
    ids = jnp.asarray([6, 2, 6, 4], jnp.int32)
    grads = jnp.asarray(np.random.default_rng(5).normal(size=(4, D)), jnp.float32)
    lr = 0.25  # a power of two: every row move is exact in float32
    new = jax.jit(functools.partial(sparse_sign_sgd, update=update))(
        table, ids, grads, learning_rate=lr, weight_decay=0.0
    )
    summed = np.zeros((N_ROWS, D), np.float32)
    np.add.at(summed, np.asarray(ids), np.asarray(grads))
    for r in range(N_ROWS):
        if r in (2, 4, 6):
            assert np.all(np.asarray(new[r]) != np.asarray(table[r]))
            step = np.float32(lr) * np.sign(summed[r])  # exact (power of two times +-1)
            assert_close(f"row {r}", new[r], np.asarray(table[r]) - step, EXACT)
        else:
            assert_close(f"row {r}", new[r], table[r], EXACT)


@UPDATES
def test_sparse_sign_sgd_single_shared_row(update):
    """Sudoku/Maze: one puzzle id, every batch row has id 0: the whole batch's grads are summed."""
    table = jnp.asarray([[0.5, -0.5, 0.0]], jnp.float32)
    grads = jnp.asarray([[1.0, -1.0, 1.0], [1.0, -1.0, -3.0], [-1.5, 3.0, 1.0]], jnp.float32)
    new = jax.jit(functools.partial(sparse_sign_sgd, update=update))(
        table, jnp.zeros(3, jnp.int32), grads, learning_rate=0.5, weight_decay=1.0
    )
    assert_close("row 0", new, [[0.25 - 0.5, -0.25 - 0.5, 0.0 + 0.5]], EXACT)


@UPDATES
@pytest.mark.parametrize("axis_type", ["Explicit", "Auto"])
def test_sparse_sign_sgd_sharded_matches_single_device(axis_type, update):
    """Under SPMD jit the table (rows over one mesh axis) and the global batch (over the other)
    give the same table as on one device: the global ids/grads are seen without an all-gather."""
    if len(jax.devices()) < 8:
        pytest.skip("needs the 8 fake CPU devices from conftest")
    mesh = jax.make_mesh(
        (2, 4), ("rows", "batch"), axis_types=(getattr(jax.sharding.AxisType, axis_type),) * 2
    )
    P, NS = jax.sharding.PartitionSpec, jax.sharding.NamedSharding
    rng = np.random.default_rng(6)
    table = jnp.asarray(rng.normal(size=(16, 4)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, 16, size=8), jnp.int32).at[1].set(3).at[6].set(3)
    grads = jnp.asarray(rng.normal(size=(8, 4)), jnp.float32)
    step = jax.jit(functools.partial(sparse_sign_sgd, update=update))
    expected = step(table, ids, grads, learning_rate=0.1, weight_decay=0.1)
    with jax.set_mesh(mesh):
        t_s = jax.device_put(table, NS(mesh, P("rows", None)))
        i_s = jax.device_put(ids, NS(mesh, P("batch")))
        g_s = jax.device_put(grads, NS(mesh, P("batch", None)))
        got = step(t_s, i_s, g_s, learning_rate=0.1, weight_decay=0.1)
    assert got.sharding.spec == P("rows", None)
    assert_close("sharded table", got, expected, EXACT)


def test_sparse_sign_sgd_keeps_indices_int32_under_x64(x64):
    """The float64 loss turns x64 on; jnp.unique then built int64 index arithmetic, which TPUs
    emulate (the trm_sudoku v4-64 AOT compile ran out of vmem). The step must lower with no s64."""
    from models.trm.optim import _unique_int32

    ids = jnp.asarray([5, 2, 5, 7, 2, 2, 0, 9], jnp.int32)
    unique_ids, inverse = _unique_int32(ids, fill_value=10)
    ref_unique, ref_inverse = jnp.unique(ids, size=8, fill_value=10, return_inverse=True)
    assert_close("unique ids", unique_ids, ref_unique, EXACT)
    assert_close("inverse", inverse, ref_inverse.reshape(8), EXACT)
    assert unique_ids.dtype == inverse.dtype == jnp.int32

    table = jnp.zeros((10, 4), jnp.float64)
    grads = jnp.ones((8, 4), jnp.float64)
    hlo = (
        jax.jit(lambda t, i, g: sparse_sign_sgd(t, i, g, learning_rate=0.1, weight_decay=0.1))
        .lower(table, ids, grads)
        .compile()
        .as_text()
    )
    assert "s64[" not in hlo, "int64 index arithmetic in the SignSGD step"


def test_sparse_sign_sgd_bad_shapes():
    with pytest.raises(ValueError, match=r"row_grads \[B, 5\]"):
        sparse_sign_sgd(
            jnp.zeros((3, 5)),
            jnp.zeros(2, jnp.int32),
            jnp.zeros((2, 4)),
            learning_rate=0.1,
            weight_decay=0.1,
        )


# --------------------------------------------------------------------------------------------
# Schedule
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("min_ratio", [0.1, 1.0])
def test_trm_lr_boundaries(min_ratio, x64):
    base, W, T = 3e-4, 10, 30
    steps = [1, 2, 9, 10, 11, 20, 29, 30]

    def by_hand(s):
        if s < W:
            return base * s / W
        progress = (s - W) / max(1, T - W)
        return base * (
            min_ratio + max(0.0, (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
        )

    got = [
        float(trm_lr(s, base_lr=base, warmup_steps=W, total_steps=T, min_ratio=min_ratio))
        for s in steps
    ]
    jitted = jax.jit(
        lambda s: trm_lr(s, base_lr=base, warmup_steps=W, total_steps=T, min_ratio=min_ratio)
    )
    assert_close("trm_lr vs formula", got, [by_hand(s) for s in steps], FLOAT64)
    assert_close(
        "trm_lr vs torch ref", got, [compute_lr(base, s, W, T, min_ratio) for s in steps], FLOAT64
    )
    assert_close("trm_lr jitted", [float(jitted(jnp.asarray(s))) for s in steps], got, FLOAT64)
    assert got[0] == pytest.approx(base / W)  # first update (step 1) is NOT lr 0
    assert got[3] == pytest.approx(base)  # step W: end of warm-up, full lr
    assert got[-1] == pytest.approx(base * min_ratio)  # step T: the floor


def test_total_steps_sudoku():
    assert total_steps(50000, 1000, 1.0, 768) == 65104


# --------------------------------------------------------------------------------------------
# EMA
# --------------------------------------------------------------------------------------------


class _Init(nnx.Variable):
    """Stands in for a non-trainable buffer kind (H_init/L_init, puzzle table)."""


class _Tiny(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(3, 2, param_dtype=jnp.float64, rngs=rngs)
        self.H_init = _Init(jnp.asarray([1.0, 2.0], jnp.float64))

    def __call__(self, x):
        return self.lin(x) + self.H_init[...]


class _TinyTorch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.register_buffer("H_init", torch.tensor([1.0, 2.0], dtype=torch.float64))


def test_ema_tracks_params_only_and_matches_torch(x64):
    model = _Tiny(nnx.Rngs(0))
    tmodel = _TinyTorch().double()
    with torch.no_grad():
        tmodel.lin.weight.copy_(torch.tensor(np.asarray(model.lin.kernel[...]).T))
        tmodel.lin.bias.copy_(torch.tensor(np.asarray(model.lin.bias[...])))
    ema = ema_init(nnx.state(model, nnx.Param))
    helper = EMAHelper(mu=0.9)
    helper.register(tmodel)
    assert sorted(helper.shadow) == ["lin.bias", "lin.weight"]
    assert {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(ema)} == {"lin/bias", "lin/kernel"}
    rng = np.random.default_rng(7)
    for i in range(3):
        delta_w = rng.normal(size=(3, 2))
        delta_b = rng.normal(size=(2,))
        model.lin.kernel[...] = model.lin.kernel[...] + delta_w
        model.lin.bias[...] = model.lin.bias[...] + delta_b
        model.H_init[...] = model.H_init[...] + 1.0  # a buffer changing must not enter the EMA
        with torch.no_grad():
            tmodel.lin.weight += torch.tensor(delta_w.T)
            tmodel.lin.bias += torch.tensor(delta_b)
            tmodel.H_init += 1.0
        ema = ema_update(ema, nnx.state(model, nnx.Param), mu=0.9)
        helper.update(tmodel)
        assert_all_close(
            [
                (f"ema{i}.kernel", ema["lin"]["kernel"][...], helper.shadow["lin.weight"].T),
                (f"ema{i}.bias", ema["lin"]["bias"][...], helper.shadow["lin.bias"]),
            ],
            FLOAT64,
        )
    # the eval copy (EMA params, live buffers) is train_step.ema_model, checked against the
    # torch EMAHelper's copy by test_training_trajectory_matches_torch_float64

"""TRM's optimisation pieces in Optax/JAX: AdamATan2, the sparse SignSGD of the puzzle table,
upstream's LR schedule and the EMA of the trainable parameters.

Each function mirrors one piece of upstream's `pretrain.py` stack (see docs/porting_trm_training.md)
and is proven against our own PyTorch copy in parity/trm_torch/optim.py by tests/test_trm_optim.py.

    tx = adam_atan2(learning_rate=1e-4, b1=0.9, b2=0.95, weight_decay=1.0)   # nnx.Param only
    table = sparse_sign_sgd(table, ids, row_grads, learning_rate=lr_emb, weight_decay=1.0)
    lr = trm_lr(step, base_lr=1e-4, warmup_steps=2000, total_steps=n, min_ratio=1.0)  # step >= 1
    ema = ema_update(ema, params, mu=0.999)

Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

ScalarOrSchedule = float | jax.Array | Callable[[jax.Array], jax.Array]
# sparse_sign_sgd's `update` (TRMOptimConfig.table_update)
TABLE_UPDATES = ("auto", "dense", "sparse")


# --------------------------------------------------------------------------------------------
# AdamATan2
# --------------------------------------------------------------------------------------------


class AdamATan2State(NamedTuple):
    """`count`: updates done so far (upstream's per-parameter step t before its increment)."""

    count: jax.Array
    mu: optax.Updates  # first moment m
    nu: optax.Updates  # second moment v


def adam_atan2(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.95,
    weight_decay: float = 0.1,
) -> optax.GradientTransformation:
    """Upstream's AdamATan2 (imoneoi/adam-atan2) as an Optax transformation; needs `params`.

    Per parameter p with gradient g, upstream does in place (t counts from 1):

        p <- p * (1 - lr*wd)                           # decoupled decay, BEFORE the moments
        m <- m + (1 - b1) * (g - m)
        v <- v + (1 - b2) * (g^2 - v)
        p <- p - lr / (1 - b1^t) * atan2(m, sqrt(v) / sqrt(1 - b2^t))

    There is no epsilon: atan2 is bounded by pi/2 and atan2(0, 0) = 0, so a parameter whose
    gradient has always been zero moves only by the decay. Optax applies updates additively
    (p_new = p + u), so the update returned is the whole change relative to p:

        u = -lr*wd*p - lr / (1 - b1^t) * atan2(m, sqrt(v) / sqrt(1 - b2^t))

    p + u equals the in-place sequence up to one rounding (proven to 1e-12 per step in float64 by
    tests/test_trm_optim.py::test_adam_atan2_matches_torch_float64).

    `learning_rate` is a float or an Optax-style schedule called with the number of updates done
    so far (0 at the first update). To set it per step from outside (as the TRM train step does),
    wrap the factory: `optax.inject_hyperparams(adam_atan2)(learning_rate=0.0, ...)` and write
    `state.hyperparams["learning_rate"]` before each update.
    """

    def init_fn(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return AdamATan2State(
            count=jnp.zeros([], jnp.int32), mu=zeros, nu=jax.tree.map(jnp.zeros_like, params)
        )

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError(
                "adam_atan2 needs params (its weight decay is decoupled): "
                "call tx.update(grads, state, params)"
            )
        count = optax.safe_increment(state.count)  # t, from 1
        lr = learning_rate(state.count) if callable(learning_rate) else learning_rate

        mu = jax.tree.map(lambda m, g: m + (1 - b1) * (g - m), state.mu, updates)
        nu = jax.tree.map(lambda v, g: v + (1 - b2) * (g * g - v), state.nu, updates)

        def leaf_update(p, m, v):
            t = count.astype(p.dtype)
            lr_p = jnp.asarray(lr, p.dtype)
            bias1 = 1 - jnp.asarray(b1, p.dtype) ** t
            bias2 = 1 - jnp.asarray(b2, p.dtype) ** t
            step = lr_p / bias1 * jnp.arctan2(m, jnp.sqrt(v) / jnp.sqrt(bias2))
            return -(lr_p * weight_decay) * p - step

        new_updates = jax.tree.map(leaf_update, params, mu, nu)
        return new_updates, AdamATan2State(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


# --------------------------------------------------------------------------------------------
# Sparse SignSGD for the puzzle-embedding table
# --------------------------------------------------------------------------------------------


def sparse_sign_sgd(
    table: jax.Array,
    ids: jax.Array,
    row_grads: jax.Array,
    *,
    learning_rate: float | jax.Array,
    weight_decay: float | jax.Array,
    enabled: bool | jax.Array = True,
    update: str = "auto",
) -> jax.Array:
    """Upstream's CastedSparseEmbeddingSignSGD_Distributed step on a [N, D] table; returns the new table.

    `ids` [B] are the puzzle ids of the batch rows, `row_grads` [B, D] the gradients of the rows
    gathered for them (d loss / d puzzle_emb_delta). Gradients of duplicate ids are summed, and
    only rows present in the batch change:

        p[i] <- p[i] * (1 - lr*wd) - lr * sign(sum of grads with id i)      (sign(0) = 0)

    Rows absent from the batch keep their exact bits (no decay); with `enabled` False (a traced
    bool: the train step's skipped steps) every row keeps them. Fixed shapes for jit:
    the int32 unique (`_unique_int32`) pads the unique ids with N, an out-of-range row that the final scatter
    drops, so the work is O(B*D), not O(N*D). Under SPMD jit with a global batch array the ids and
    gradients are already the global batch's (upstream all-gathers them by hand).

    `update` (TRMOptimConfig.table_update): "sparse" is the unique-and-scatter path above;
    "dense" sums the gradients per row with a one-hot matmul and updates the whole [N, D] table
    through a mask, O(N*B*D) with no scatter (Sudoku's one-row table takes every one of the 768
    updates of a batch: a contended scatter on a GPU); "auto" is dense when N <= B. The same
    values up to the order of the float32 sums, which sign() sees only when a sum is 0 within
    round-off.
    """
    if table.ndim != 2:
        raise ValueError(f"sparse_sign_sgd: table must be [N, D], got shape {table.shape}")
    n, d = table.shape
    if ids.ndim != 1 or row_grads.shape != (ids.shape[0], d):
        raise ValueError(
            f"sparse_sign_sgd: expected ids [B] and row_grads [B, {d}], got ids {ids.shape} "
            f"and row_grads {row_grads.shape}"
        )
    batch = ids.shape[0]
    if update not in TABLE_UPDATES:
        raise ValueError(f"sparse_sign_sgd: update={update!r}: expected one of {TABLE_UPDATES}")
    if update == "dense" or (update == "auto" and n <= batch):
        return _dense_sign_sgd(table, ids, row_grads, learning_rate, weight_decay, enabled)
    # Explicit-sharding meshes type every array with its layout: the batch must be replicated for
    # the sort inside unique (this is upstream's all-gather), and the gathered rows need a stated
    # layout. Under Auto sharding or on one device these are no-ops and XLA decides.
    ids = _replicate_if_explicit(ids.astype(jnp.int32))
    row_grads = _replicate_if_explicit(row_grads)
    unique_ids, inverse = _unique_int32(ids, fill_value=n)
    grad_sum = jax.ops.segment_sum(row_grads.astype(table.dtype), inverse, num_segments=batch)
    lr = jnp.asarray(learning_rate, table.dtype)
    wd = jnp.asarray(weight_decay, table.dtype)
    table_spec = _explicit_spec(table)
    rows_kw = {} if table_spec is None else {"out_sharding": P(None, table_spec[1])}
    table_kw = {} if table_spec is None else {"out_sharding": P(*table_spec)}
    rows = table.at[unique_ids].get(mode="fill", fill_value=0, **rows_kw)
    new_rows = jnp.where(enabled, rows * (1 - lr * wd) - lr * jnp.sign(grad_sum), rows)
    return table.at[unique_ids].set(new_rows, mode="drop", **table_kw)


def _dense_sign_sgd(table, ids, row_grads, learning_rate, weight_decay, enabled):
    """sparse_sign_sgd's update of every row at once: per-row sums by one-hot matmul, rows absent
    from the batch (and every row of a disabled step) kept by a mask."""
    onehot_bn = jax.nn.one_hot(ids.astype(jnp.int32), table.shape[0], dtype=table.dtype)
    # an Explicit mesh asks where a sum over the sharded batch goes: into the table's layout
    table_spec = _explicit_spec(table)
    explicit = table_spec or _explicit_spec(ids) or _explicit_spec(row_grads)
    out_kw = {"out_sharding": P(*(table_spec or ()))} if explicit else {}
    grad_sum_nd = jnp.einsum(
        "bn,bd->nd",
        onehot_bn,
        row_grads.astype(table.dtype),
        precision=jax.lax.Precision.HIGHEST,  # float32 sums (a GPU's default would be TF32)
        **out_kw,
    )
    present_n1 = (jnp.sum(onehot_bn, axis=0) > 0)[:, None]
    lr = jnp.asarray(learning_rate, table.dtype)
    wd = jnp.asarray(weight_decay, table.dtype)
    new_table = table * (1 - lr * wd) - lr * jnp.sign(grad_sum_nd)
    return jnp.where(jnp.logical_and(present_n1, enabled), new_table, table)


def _unique_int32(ids: jax.Array, fill_value: int) -> tuple[jax.Array, jax.Array]:
    """`jnp.unique(ids, size=B, fill_value=fill_value, return_inverse=True)` in int32 throughout.

    jnp.unique builds its index arithmetic in the default int type, which is int64 when x64 is on
    (the float64 stablemax loss turns it on). TPUs emulate int64, and the emulated cumsum of a
    trm_sudoku step did not fit in vmem (train/aot.py, docs/porting_trm_training.md). Sorting with
    an explicit int32 iota keeps every index int32 whatever the x64 setting.
    """
    batch = ids.shape[0]
    sorted_ids, order = jax.lax.sort(
        (ids, jnp.arange(batch, dtype=jnp.int32)), num_keys=1, is_stable=True
    )
    is_first = jnp.concatenate([jnp.ones((1,), bool), sorted_ids[1:] != sorted_ids[:-1]])
    segment_of_sorted = jnp.cumsum(is_first.astype(jnp.int32), dtype=jnp.int32) - 1
    inverse = jnp.zeros((batch,), jnp.int32).at[order].set(segment_of_sorted)
    unique_ids = jnp.full((batch,), fill_value, jnp.int32).at[segment_of_sorted].set(sorted_ids)
    return unique_ids, inverse


def _explicit_spec(x: jax.Array):
    """x's PartitionSpec when it is sharded over an Explicit mesh axis, else None."""
    sharding = jax.typeof(x).sharding
    spec = getattr(sharding, "spec", None)
    if spec is None or all(axis is None for axis in spec):
        return None
    return tuple(spec) + (None,) * (x.ndim - len(spec))


def _replicate_if_explicit(x: jax.Array) -> jax.Array:
    return x if _explicit_spec(x) is None else jax.sharding.reshard(x, P())


# --------------------------------------------------------------------------------------------
# Learning-rate schedule
# --------------------------------------------------------------------------------------------


def trm_lr(
    step: int | jax.Array,
    *,
    base_lr: float,
    warmup_steps: int,
    total_steps: int,
    min_ratio: float = 1.0,
) -> jax.Array:
    """Upstream's `cosine_schedule_with_warmup_lr_lambda` times base_lr, at update `step`.

    `step` counts updates FROM 1 (upstream increments its counter before computing the lr):
      step < W:  base * step / W
      else:      base * (r + max(0, (1 - r) * 0.5 * (1 + cos(pi * progress)))),
                 progress = (step - W) / max(1, total - W)
    With upstream's default r = min_ratio = 1 the lr is constant after warm-up.
    Works on Python ints (returns a Python-precision jnp scalar) and traced arrays alike.
    """
    s = jnp.asarray(step)
    dtype = jnp.result_type(float)  # float64 under x64, else float32
    s = s.astype(dtype)
    warm = base_lr * s / max(warmup_steps, 1)  # only used where s < W, so never with W = 0
    progress = (s - warmup_steps) / max(1, total_steps - warmup_steps)
    cosine = jnp.maximum(0.0, (1.0 - min_ratio) * 0.5 * (1.0 + jnp.cos(math.pi * progress)))
    after = base_lr * (min_ratio + cosine)
    return jnp.where(s < warmup_steps, warm, after).astype(dtype)


def total_steps(
    epochs: int, total_groups: int, mean_puzzle_examples: float, global_batch_size: int
) -> int:
    """Upstream's schedule length: int(epochs * total_groups * mean_puzzle_examples / global_batch).

    It only shapes the schedule (and stops updates after it): the loader drops each iteration's
    last partial batch, so the run itself may do fewer steps (at most one per iteration).
    """
    return int(epochs * total_groups * mean_puzzle_examples / global_batch_size)


# --------------------------------------------------------------------------------------------
# EMA of the trainable parameters
# --------------------------------------------------------------------------------------------


def ema_init(params):
    """The shadow starts as a copy of the trainable parameters (nnx.Param state only)."""
    return jax.tree.map(jnp.array, params)


def ema_update(ema, params, mu: float = 0.999):
    """shadow <- (1 - mu) * param + mu * shadow, upstream's EMAHelper.update, every train batch."""
    return jax.tree.map(lambda s, p: (1.0 - mu) * p + mu * s, ema, params)

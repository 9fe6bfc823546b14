"""One TRM training step as a pure function (upstream pretrain.py `train_batch` + `ema.update`).

The trainer's step, and every caller's, is `train_step(graphdef, state, batch) -> (state, metrics)`
with the graphdef, config and schedule length bound:

    model.train()                                    # halting is adaptive only in training
    graphdef, state = init_state(model, cfg, batch)  # cfg: TRMOptimConfig; every carry slot halted
    step = jax.jit(functools.partial(train_step, graphdef, config=cfg, total_steps=n),
                   donate_argnums=0)
    for batch in loader:                             # global batches of B rows
        state, metrics = step(state, batch)          # metrics as upstream logs them, no host sync
    eval_model = ema_model(graphdef, state["train"]) # EMA params + live buffers, eval mode

The state holds the persistent ACT carry beside the weights and optimizer (upstream's
`TrainState.carry`): {"train": TRMTrainState, "carry": TRMCarry}. `train_step` is `train_batch`
on it, with the batch sums normalised as upstream's train_batch returns them for logging.
`train_batch` is the update itself, (state, carry, batch) -> (state, carry, sums), the function
the parity test runs beside the reference's `train_batch` (parity/trm_torch/optim.py).

One call = one ACT step on the persistent carry, in upstream's order:
  1. step += 1; if step > total_steps nothing is updated (params, table, optimizer, carry, RNG
     keep their values) but the EMA is still updated (upstream runs ema.update after every batch).
  2. forward on (carry, batch) -> new carry; loss = act_loss(...) / global_batch_size, the
     batch's rows (upstream's train_batch argument; the loader drops partial batches), with the
     model config's loss_type and loss_dtype (upstream's arch.loss).
  3. gradients of every nnx.Param and of the gathered puzzle rows (via `puzzle_emb_delta`, zeros:
     d loss / d delta is upstream's `local_weights.grad`).
  4. SignSGD on the puzzle table (ids = new_carry.current_data['puzzle_identifiers']), then
     AdamATan2 on the params, each with its own lr from trm_lr(step) over total_steps (step
     counted from 1).
     No clipping, no accumulation, no loss scaling.
  5. EMA of the params (mu = ema_rate).
Under SPMD jit with global batch arrays the gradients and the SignSGD ids are global: there is no
hand-written all-reduce / all-gather (upstream's dist.all_reduce and the SignSGD all-gather).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from models.fields import check_ranges, ranged
from models.trm.layers import PuzzleTable
from models.trm.losses import act_loss, normalize_metrics
from models.trm.optim import (
    TABLE_UPDATES,
    adam_atan2,
    ema_init,
    ema_update,
    sparse_sign_sgd,
    trm_lr,
)


@dataclasses.dataclass(frozen=True)
class TRMOptimConfig:
    """The optimisation fields of upstream's cfg_pretrain.yaml (same names and defaults, but
    `ema`: True here, as every run of upstream's README passes ema=True; False in
    cfg_pretrain.yaml). The schedule's length is `train_batch`'s `total_steps`, the loss's scale
    the batch's rows, the loss itself the model config's (TRMConfig.loss_type, loss_dtype)."""

    lr: float = ranged(1e-4, ">0")
    lr_min_ratio: float = ranged(1.0, "[0,1]")
    lr_warmup_steps: int = ranged(2000, ">=0")
    weight_decay: float = ranged(0.1, ">=0")
    beta1: float = ranged(0.9, "[0,1)")
    beta2: float = ranged(0.95, "[0,1)")
    puzzle_emb_lr: float = ranged(1e-2, ">=0")
    puzzle_emb_weight_decay: float = ranged(0.1, ">=0")
    ema: bool = True
    ema_rate: float = ranged(0.999, "[0,1]")
    freeze_weights: bool = False  # upstream: train only the puzzle table
    # how SignSGD updates the puzzle table (models.trm.optim.TABLE_UPDATES): "auto" is a dense
    # masked update when the table has no more rows than the batch (Sudoku: 1), else sparse
    table_update: str = "auto"

    def __post_init__(self):
        check_ranges(self)
        if self.table_update not in TABLE_UPDATES:
            raise ValueError(
                f"TRMOptimConfig.table_update={self.table_update!r}: expected one of "
                f"{TABLE_UPDATES}"
            )

    def schedule(self, step, base_lr: float, total_steps: int):
        return trm_lr(
            step,
            base_lr=base_lr,
            warmup_steps=self.lr_warmup_steps,
            total_steps=total_steps,
            min_ratio=self.lr_min_ratio,
        )


@struct.dataclass
class TRMTrainState:
    """Everything one step reads and writes, as a pytree of arrays (shard, donate, checkpoint)."""

    params: Any  # nnx.State of nnx.Param: what AdamATan2 trains and the EMA averages
    table: Any  # nnx.State holding the PuzzleTable (empty without a puzzle embedding)
    rest: Any  # nnx.State of everything else: H_init/L_init, the exploration RNG stream
    opt_state: Any  # AdamATan2 state (optax.inject_hyperparams: lr is written every step)
    ema: Any  # nnx.State like `params`, or None when config.ema is False
    step: jax.Array  # int32: train_batch calls so far (upstream train_state.step)


def adam_atan2_for(config: TRMOptimConfig) -> optax.GradientTransformation:
    """The parameter optimizer, with the lr injected per step by `train_batch`."""
    return optax.inject_hyperparams(adam_atan2)(
        learning_rate=0.0, b1=config.beta1, b2=config.beta2, weight_decay=config.weight_decay
    )


def init_train_state(model: nnx.Module, config: TRMOptimConfig):
    """Split `model` (already in train mode) into (graphdef, TRMTrainState) at step 0."""
    graphdef, params, table, rest = nnx.split(model, nnx.Param, PuzzleTable, ...)
    state = TRMTrainState(
        params=params,
        table=table,
        rest=rest,
        opt_state=adam_atan2_for(config).init(params),
        ema=ema_init(params) if config.ema else None,
        step=jnp.zeros([], jnp.int32),
    )
    return graphdef, state


def init_state(model: nnx.Module, config: TRMOptimConfig, batch: dict):
    """(graphdef, the state `train_step` takes): `init_train_state`'s and the model's initial
    carry for batches shaped like `batch` (every slot halted: refilled from the first batch)."""
    graphdef, train = init_train_state(model, config)
    return graphdef, {"train": train, "carry": model.initial_carry(batch)}


def ema_model(graphdef, state: TRMTrainState) -> nnx.Module:
    """The model upstream evaluates and checkpoints: EMA params (if config.ema) with the live
    H_init/L_init and puzzle table, in eval mode."""
    params = state.params if state.ema is None else state.ema
    model = nnx.merge(graphdef, params, state.table, state.rest)
    model.eval()
    return model


def _table_leaf(table_state):
    leaves = jax.tree.leaves(table_state)
    if len(leaves) > 1:
        raise ValueError(f"expected at most one PuzzleTable variable, found {len(leaves)}")
    return leaves[0] if leaves else None


def train_step(graphdef, state: dict, batch: dict, *, config: TRMOptimConfig, total_steps: int):
    """The step: (state, batch) -> (state, metrics), the carry inside the state ({"train":
    TRMTrainState, "carry": TRMCarry}, `init_state`). `train_batch`, then its sums normalised as
    upstream logs them (`normalize_metrics`: losses / the batch's rows, the rest / the count),
    float32 scalars whatever the loss dtype (float64 with upstream's stablemax)."""
    train, carry, sums = train_batch(
        graphdef, state["train"], state["carry"], batch, config=config, total_steps=total_steps
    )
    rows = batch["inputs"].shape[0]  # global: the whole batch under SPMD jit
    metrics = normalize_metrics(sums, mode="train", global_batch_size=rows)
    return {"train": train, "carry": carry}, {
        k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()
    }


def train_batch(
    graphdef,
    state: TRMTrainState,
    carry,
    batch: dict,
    *,
    config: TRMOptimConfig,
    total_steps: int,
):
    """One upstream train_batch + EMA update. Returns (state, carry, sums).

    `total_steps` is the schedule's length (upstream's, from epochs and the data set: the trainer's
    trainer.total_steps, `models.trm.optim.total_steps`); the loss is scaled by 1 / the batch's
    rows, upstream's global_batch_size.

    `sums` holds act_loss's raw batch sums (count, accuracy, exact_accuracy, q_halt_accuracy,
    steps, lm_loss, q_halt_loss) plus `lr`, `puzzle_emb_lr`, `grad_norm` (global L2 norm of the
    nnx.Param gradients of the 1/global_batch-scaled loss) and `puzzle_emb_grad_norm` (of the
    gathered puzzle rows' gradients; absent without a puzzle table), all jnp scalars; on a skipped
    step (step > total_steps) the sums and norms are zeros.
    """
    if total_steps <= 0:
        raise ValueError(f"train_batch: total_steps={total_steps}: expected > 0")
    batch_rows = batch["inputs"].shape[0]  # global: the whole batch under SPMD jit
    step = state.step + 1
    lr = config.schedule(step, config.lr, total_steps)
    emb_lr = config.schedule(step, config.puzzle_emb_lr, total_steps)
    table = _table_leaf(state.table)

    def loss_fn(params, delta):
        # copy=True: fresh Variables at this (grad) trace level, so the model may advance its
        # exploration RNG here; reusing the outer-level ones raises TraceContextError
        model = nnx.merge(graphdef, params, state.table, state.rest, copy=True)
        new_carry, outputs = model(carry, batch, puzzle_emb_delta=delta)
        c = model.config  # upstream's ACTLossHead reads arch.loss
        loss, metrics = act_loss(new_carry, outputs, loss_type=c.loss_type, loss_dtype=c.loss_dtype)
        rest = nnx.state(model, nnx.Not(nnx.Any(nnx.Param, PuzzleTable)))
        return loss / batch_rows, (new_carry, metrics, rest)

    delta = None
    if table is not None:
        delta = jnp.zeros((batch_rows, table.shape[-1]), table.dtype)
    grad_fn = jax.grad(loss_fn, argnums=(0, 1), has_aux=True)
    (grads, delta_grad), (new_carry, metrics, rest) = grad_fn(state.params, delta)
    # Global L2 norms (torch clip_grad_norm_'s total norm; nothing is clipped, upstream does
    # not clip): of the nnx.Param grads, and of the gathered puzzle rows' grads (the
    # `local_weights.grad` SignSGD reads, duplicates of an id counted per row).
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads))
    if delta_grad is not None:
        metrics["puzzle_emb_grad_norm"] = optax.tree.norm(delta_grad)

    # SignSGD runs after the mask (below) on these inputs: a table passed through a cond's
    # branches, or through the mask, would be copied whole every step
    # (docs/porting_trm_training.md, "The puzzle table stays out of the cond").
    table_inputs = None
    if table is not None:
        table_inputs = (new_carry.current_data["puzzle_identifiers"], delta_grad)
    params, opt_state = state.params, state.opt_state
    if not config.freeze_weights:  # then AdamATan2
        hyper = dict(opt_state.hyperparams)  # a new dict: never mutate the input state
        hyper["learning_rate"] = jnp.asarray(lr, hyper["learning_rate"].dtype)
        opt_state = opt_state._replace(hyperparams=hyper)
        updates, opt_state = adam_atan2_for(config).update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)

    # A step past total_steps changes nothing but the EMA (and the step counter). Upstream skips
    # the update with an `if`; here the update is computed and its result masked out
    # (jnp.where picks the old bits exactly), so the program holds no conditional: XLA:TPU's
    # cost model then predicts the step (train/aot.py), which it cannot for a cond's branches.
    # Only steps past the schedule compute in vain (upstream's runs: none; the loader drops the
    # last partial batch of each iteration, so a run takes at most the scheduled steps).
    skipped = step > total_steps
    keep = (state.params, state.rest, state.opt_state, carry)
    params, rest, opt_state, new_carry = jax.tree.map(
        lambda old, new: jnp.where(skipped, old, new),
        keep,
        (params, rest, opt_state, new_carry),
    )
    table_inputs, metrics = jax.tree.map(
        lambda x: jnp.where(skipped, jnp.zeros_like(x), x), (table_inputs, metrics)
    )
    new_table = state.table
    if table is not None:  # SignSGD first (upstream's optimizer order); a skipped step keeps it
        ids, delta_grad = table_inputs
        new_table = jax.tree.map(
            lambda t: sparse_sign_sgd(
                t,
                ids,
                delta_grad,
                learning_rate=emb_lr,
                weight_decay=config.puzzle_emb_weight_decay,
                enabled=jnp.logical_not(skipped),
                update=config.table_update,
            ),
            state.table,
        )
    ema = ema_update(state.ema, params, config.ema_rate) if state.ema is not None else None
    new_state = TRMTrainState(
        params=params, table=new_table, rest=rest, opt_state=opt_state, ema=ema, step=step
    )
    metrics = dict(metrics, lr=lr, puzzle_emb_lr=emb_lr)
    return new_state, new_carry, metrics


# Logged as they are: not batch sums.

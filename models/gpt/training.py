"""nanoGPT's optimisation math as pure JAX/optax functions, and one pure `train_step`.

What nanoGPT's train.py does per iteration, and where it is here:
- lr = get_lr(iter_num) set on every param group   -> `get_lr`, used as an optax schedule of the
  optimizer's step count (`lr_schedule`), so the lr is part of the optimizer state;
- AdamW, decay on ndim >= 2 (wte and wpe included), betas, eps 1e-8 -> `configure_optimizers`;
- gradient_accumulation_steps micro-steps of backward(loss / accum) -> `loss_and_grads`;
- clip_grad_norm_(max_norm): coef = min(1, max_norm / (norm + 1e-6)) -> `clip_by_global_norm`
  (optax.clip_by_global_norm has no 1e-6);
- optimizer.step()                                   -> `train_step` (nnx.Optimizer.update on the
  merged (model, optimizer): (graphdef, state, batch) -> (state, metrics), as the TRM step).
train.py's optimiser keys are `GPTOptimConfig` (the `optim` config section), and the state the step
takes is `init_train_state`'s: nnx.split((model, optimizer)).
nanoGPT's FLOP count (6N + 12 L H Q T per token) is models/gpt/flops.py's, and its estimate_mfu
train/families/gpt/mfu.py's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from models.fields import check_ranges, ranged
from models.gpt.modeling import GPT


@dataclasses.dataclass(frozen=True)
class GPTOptimConfig:
    """nanoGPT train.py's optimiser keys (names and defaults of train.py): the `optim` section."""

    learning_rate: float = ranged(6e-4, ">0")
    max_iters: int = ranged(600000, ">=0")
    weight_decay: float = ranged(1e-1, ">=0")
    beta1: float = ranged(0.9, "[0,1)")
    beta2: float = ranged(0.95, "[0,1)")
    grad_clip: float = ranged(1.0, ">=0")
    decay_lr: bool = True
    warmup_iters: int = ranged(2000, ">=0")
    lr_decay_iters: int = ranged(600000, ">=0")
    min_lr: float = ranged(6e-5, ">=0")
    # Ours: Adam's moments over one flat vector of every parameter (`configure_optimizers(flat=)`),
    # the JAX counterpart of torch's fused AdamW (one kernel over all tensors). Same values; a
    # speed variant for one device (on a mesh the flat moments are replicated).
    adamw_flat: bool = False

    def __post_init__(self):
        check_ranges(self)

    def schedule(self) -> Callable:
        """nanoGPT's get_lr as an optax schedule of the update count (`lr_schedule`)."""
        return lr_schedule(
            learning_rate=self.learning_rate,
            warmup_iters=self.warmup_iters,
            lr_decay_iters=self.lr_decay_iters,
            min_lr=self.min_lr,
            decay_lr=self.decay_lr,
        )


def get_lr(it, *, learning_rate, warmup_iters, lr_decay_iters, min_lr):
    """nanoGPT's schedule: linear warmup (it+1)/(warmup+1), cosine to min_lr, then min_lr.

    A Python int gives a Python float (exactly nanoGPT's double arithmetic); a JAX integer (e.g.
    the optimizer's step count inside jit) gives a JAX scalar of the same formula.
    """
    if isinstance(it, (int, np.integer)):
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        if it > lr_decay_iters:
            return min_lr
        ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        assert 0 <= ratio <= 1
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)
    # Explicit float dtype: left to promotion, an int32 step count gives a float32 lr under jit
    # even with x64 on (a 5e-8 relative error that the float64 trajectory test catches).
    it = jnp.asarray(it).astype(jnp.result_type(float))
    warm = learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = jnp.clip((it - warmup_iters) / max(lr_decay_iters - warmup_iters, 1), 0.0, 1.0)
    cos = min_lr + 0.5 * (1.0 + jnp.cos(jnp.pi * ratio)) * (learning_rate - min_lr)
    return jnp.where(it < warmup_iters, warm, jnp.where(it > lr_decay_iters, min_lr, cos))


def lr_schedule(
    *, learning_rate, warmup_iters, lr_decay_iters, min_lr, decay_lr: bool = True
) -> Callable:
    """optax schedule: step count -> lr (nanoGPT's iter_num is the optimizer's update count)."""
    if not decay_lr:
        return lambda count: learning_rate
    kw = dict(
        learning_rate=learning_rate,
        warmup_iters=warmup_iters,
        lr_decay_iters=lr_decay_iters,
        min_lr=min_lr,
    )
    return lambda count: get_lr(count, **kw)


def decay_mask(params):
    """nanoGPT's two groups: decay every tensor with ndim >= 2 (Linear kernels, wte, wpe)."""
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def configure_optimizers(
    *, weight_decay: float, learning_rate, betas=(0.9, 0.95), eps: float = 1e-8, flat=False
) -> optax.GradientTransformation:
    """torch.optim.AdamW over nanoGPT's decay / no-decay groups.

    `learning_rate` is a float or a schedule (see `lr_schedule`). optax.adamw and torch AdamW
    are the same math: decoupled decay scaled by lr, eps added after sqrt(v_hat).
    Clipping is not in the chain: `train_step` applies torch's formula before the update.
    `flat`: optax.adamw's own chain with Adam's moments kept over one vector of every parameter
    (optax.flatten), as torch's fused AdamW runs one kernel over all tensors: the same formulas,
    fewer and larger kernels; not the same bits (XLA rewrites a division by a scalar in one layout
    and not the other: docs/porting_nanogpt.md, "XLA divides by a scalar with its reciprocal"), so
    both layouts are proven within torch's one-ulp envelope in float64
    (tests/test_gpt_train_step.py::test_twenty_iterations_match_torch_adamw_float64).
    """
    if flat:
        return optax.chain(
            optax.flatten(optax.scale_by_adam(b1=betas[0], b2=betas[1], eps=eps)),
            optax.add_decayed_weights(weight_decay, decay_mask),
            optax.scale_by_learning_rate(learning_rate),
        )
    return optax.adamw(
        learning_rate=learning_rate,
        b1=betas[0],
        b2=betas[1],
        eps=eps,
        weight_decay=weight_decay,
        mask=decay_mask,
    )


def global_norm(grads):
    """torch clip_grad_norm_'s total norm: the 2-norm of the per-tensor 2-norms."""
    norms = [jnp.linalg.norm(g.ravel()) for g in jax.tree.leaves(grads)]
    return jnp.linalg.norm(jnp.stack(norms))


def clip_by_global_norm(grads, max_norm: float):
    """torch.nn.utils.clip_grad_norm_: scale by min(1, max_norm / (norm + 1e-6)). -> (grads, norm)."""
    norm = global_norm(grads)
    coef = jnp.minimum(max_norm / (norm + 1e-6), 1.0)
    return jax.tree.map(lambda g: g * coef.astype(g.dtype), grads), norm


def loss_and_grads(model: GPT, x_abt, y_abt):
    """Gradient accumulation: -> (mean micro-batch loss, grads of nnx.Param).

    x_abt / y_abt hold `A` micro-batches on the leading axis. As nanoGPT, each micro-step
    differentiates loss / A and the gradients are summed (torch accumulates into .grad). Dropout
    RNG state advances in `model` (it is carried through the scan and written back).
    """
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    A = x_abt.shape[0]

    def body(carry, xy):
        grads, loss_sum, rest = carry
        x_bt, y_bt = xy
        # Merge fresh Variables in the scan body (NNX refuses to trace or mutate Variables created
        # at an outer trace level: the closed-over params are re-wrapped by the tree map), and
        # use nnx.value_and_grad, which carries the dropout RNG counter updates out of the grad.
        m = nnx.merge(graphdef, jax.tree.map(lambda p: p, params), rest)
        loss, g = nnx.value_and_grad(lambda m: m(x_bt, y_bt)[1] / A)(m)
        rest = nnx.split(m, nnx.Param, ...)[2]
        return (jax.tree.map(jnp.add, grads, g), loss_sum + loss, rest), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    loss0 = jnp.zeros((), model.config.norm_dtype)
    (grads, loss, rest), _ = jax.lax.scan(body, (zeros, loss0, rest), (x_abt, y_abt))
    nnx.update(model, rest)
    return loss, grads


def init_train_state(model: GPT, config: GPTOptimConfig):
    """(graphdef, state) of `model` (in train mode) and its AdamW (`configure_optimizers` with
    nanoGPT's schedule): nnx.split((model, nnx.Optimizer)), the state `train_step` takes."""
    tx = configure_optimizers(
        weight_decay=config.weight_decay,
        learning_rate=config.schedule(),
        betas=(config.beta1, config.beta2),
        flat=config.adamw_flat,
    )
    return nnx.split((model, nnx.Optimizer(model, tx, wrt=nnx.Param)))


def train_step(graphdef, state, batch: dict, *, grad_clip: float = 1.0, lr=None):
    """One nanoGPT iteration as a pure function: (graphdef, state, batch) -> (state, metrics).

    `graphdef, state = nnx.split((model, optimizer))` with `optimizer = nnx.Optimizer(model,
    configure_optimizers(...), wrt=nnx.Param)`, whose schedule sets the lr from its step count.
    `batch` holds "x" and "y", each [A, B, T]: A accumulation micro-batches. Accumulate, clip
    (grad_clip=0 disables), AdamW update; call it under jax.jit with graphdef and the keywords
    bound (functools.partial). Metrics: 'loss' (mean micro-batch loss), 'grad_norm' (before
    clipping) and, when `lr` (the schedule) is given, 'lr' of this iteration as nanoGPT logs it.
    """
    model, optimizer = nnx.merge(graphdef, state)
    it = optimizer.step[...]  # nanoGPT's iter_num: updates done before this one
    loss, grads = loss_and_grads(model, batch["x"], batch["y"])
    if grad_clip:
        grads, grad_norm = clip_by_global_norm(grads, grad_clip)
    else:
        grad_norm = global_norm(grads)
    optimizer.update(model, grads)
    metrics = {"loss": loss, "grad_norm": grad_norm}
    if lr is not None:
        metrics["lr"] = jnp.asarray(lr(it), jnp.float32)
    return nnx.state((model, optimizer)), metrics

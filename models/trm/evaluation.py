"""One TRM evaluation batch as a pure function (upstream pretrain.py `evaluate`, one batch).

Upstream evaluates every test batch from a FRESH carry: halt_max_steps ACT steps of the EMA model
in eval mode (no halting, no exploration), and reports the loss head's metrics of the last step,
summed over the batch. `eval_step` does that and a little more, for `python -m train.evaluate`:

    out = eval_step(graphdef, state, batch)    # state: TRMTrainState (training.py)
    out["sums"]        # act_loss's sums of the last step (what upstream reports, after / count)
    out["per_step"]    # exact_accuracy / accuracy sums after EVERY ACT step ([steps] each)
    out["preds"], out["q_halt_logits"]                     # per row (the ARC evaluator's input)

`extra_steps` runs more ACT steps past halt_max_steps; `halt` lets the Q head halt each row at its
first step where `halting_rule` fires (as in training, without exploration) and scores the row
there; `trace` also returns every step's predictions and halting decisions ([steps, B, ...]);
`noise` (LatentNoise) adds Gaussian noise to the latents before every ACT step (test-time scaling:
models/trm/scaling.py runs many such trajectories per puzzle and picks one).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from models.trm.losses import IGNORE_LABEL_ID, act_loss
from models.trm.training import TRMTrainState, ema_model

# What `halt` freezes per row at its halting step
HALT_KEYS = ("logits", "q_halt_logits", "q_continue_logits")


@dataclasses.dataclass(frozen=True)
class LatentNoise:
    """Gaussian noise N(0, sigma^2) added to latents of every row before each ACT step.

    `latents`: carry names (default `noised_latents`: the low-level latents z_L, z_L1..z_L6, or
    z_H where it is the only one). Row r's draw at ACT step s comes from key(seed) folded with
    batch["noise_ids"][r] = (puzzle, trajectory), then s: a trajectory's noise depends neither on
    the batch, the chunk or the device it runs on, nor on how many trajectories were drawn."""

    sigma: float
    seed: int = 0
    latents: tuple[str, ...] | None = None


def noised_latents(latent_names: tuple[str, ...]) -> tuple[str, ...]:
    """The latents LatentNoise perturbs by default: the z_L ones (TRM, HRM, trm_singlez: z_L;
    trm_hier6: z_L1..z_L6), else every latent (transformers_baseline: z_H)."""
    low = tuple(n for n in latent_names if n.startswith("z_L"))
    return low or tuple(latent_names)


def eval_step(
    graphdef,
    state: TRMTrainState,
    batch: dict,
    *,
    extra_steps: int = 0,
    halt: bool = False,
    trace: bool = False,
    noise: LatentNoise | None = None,
) -> dict:
    """A fresh carry, then halt_max_steps + `extra_steps` ACT steps of the EMA model in eval mode;
    -> {"sums", "per_step", "preds", "q_halt_logits"} (+ "step_preds", "step_halts" with
    `trace`). Pure and jittable; see the module docstring. With `noise`, the batch carries
    "noise_ids" (int32 [B, 2]) and a sigma of 0 adds nothing."""
    model = ema_model(graphdef, state)
    total = model.config.halt_max_steps + int(extra_steps)
    if extra_steps:  # the wrapper halts every row at halt_max_steps: move that point
        model.config = dataclasses.replace(model.config, halt_max_steps=total)
    labels_bl = batch["labels"]
    mask_bl = labels_bl != IGNORE_LABEL_ID
    counts_b = jnp.sum(mask_bl, axis=-1)

    perturb = _perturbation(model, batch, noise)
    carry = model.initial_carry(batch)
    if perturb is not None:  # the first step's reset happens here, so its latents get noise too
        carry = perturb(_started(model, carry, batch), 0)
    frozen = None
    if halt:
        shapes = jax.eval_shape(lambda c: model(c, batch)[1], carry)
        frozen = {k: jnp.zeros(shapes[k].shape, shapes[k].dtype) for k in HALT_KEYS}
        frozen.update(steps=carry.steps, done=jnp.zeros_like(carry.halted))

    def body(loop, step):
        carry, frozen = loop
        carry, outputs = model(carry, batch)
        if perturb is not None:  # before the next ACT step
            carry = perturb(carry, step + 1)
        if halt:
            frozen = _freeze(model, frozen, outputs, carry.steps, False)
        sums, preds_bl = step_sums(outputs["logits"], labels_bl, mask_bl, counts_b)
        return (carry, frozen), (sums, _trace(model, outputs, preds_bl) if trace else None)

    (carry, frozen), (early, early_trace) = jax.lax.scan(
        body, (carry, frozen), jnp.arange(total - 1, dtype=jnp.int32)
    )
    carry, outputs = model(carry, batch)
    outputs_last = outputs
    last_sums, preds_bl = step_sums(outputs["logits"], labels_bl, mask_bl, counts_b)
    if halt:
        frozen = _freeze(model, frozen, outputs, carry.steps, True)
        carry = carry.replace(steps=frozen["steps"])
        outputs = {**outputs, **{k: frozen[k] for k in HALT_KEYS}}
    c = model.config  # upstream's ACTLossHead reads arch.loss
    _, sums = act_loss(carry, outputs, loss_type=c.loss_type, loss_dtype=c.loss_dtype)
    if not halt:  # the last step's entry IS the reported metric (same sums, by construction)
        last_sums = {k: sums[k] for k in last_sums}
    per_step = {
        k: jnp.concatenate([early[k].astype(jnp.float32), last_sums[k][None].astype(jnp.float32)])
        for k in last_sums
    }
    result = {
        "sums": {k: jnp.asarray(v, jnp.float32) for k, v in sums.items()},
        "per_step": per_step,
        "preds": jnp.argmax(outputs["logits"], axis=-1).astype(jnp.int32),
        "q_halt_logits": outputs["q_halt_logits"].astype(jnp.float32),
    }
    if trace:  # [S, B, ...]: the predictions and the Q head's halting decision of every step
        last = _trace(model, outputs_last, preds_bl)
        for k, v in last.items():
            result[k] = jnp.concatenate([early_trace[k], v[None]])
    return result


def step_sums(logits_blv, labels_bl, mask_bl, counts_b):
    """Sums over the labelled rows of one ACT step's predictions (exact, token accuracy)."""
    preds_bl = jnp.argmax(logits_blv, axis=-1).astype(jnp.int32)
    correct_bl = mask_bl & (preds_bl == labels_bl)
    valid_b = counts_b > 0
    frac_b = jnp.sum(correct_bl.astype(jnp.float32) / jnp.maximum(counts_b, 1)[:, None], -1)
    sums = {
        "exact_accuracy": jnp.sum(valid_b & (jnp.sum(correct_bl, -1) == counts_b)),
        "accuracy": jnp.sum(jnp.where(valid_b, frac_b, 0)),
    }
    return sums, preds_bl


def _started(model, carry, batch):
    """The carry as the wrapper makes it at the start of the first ACT step (every row reset from
    the batch: upstream's halted-slot refill), so noise can be added before that step runs."""
    return carry.replace(
        inner_carry=model.inner.reset_carry(carry.halted, carry.inner_carry),
        halted=jnp.zeros_like(carry.halted),
        current_data={k: batch[k] for k in carry.current_data},
    )


def _perturbation(model, batch: dict, noise: LatentNoise | None):
    """(carry, step) -> carry with LatentNoise added, or None when there is nothing to add."""
    if noise is None or noise.sigma == 0:
        return None
    names = noise.latents or noised_latents(model.inner.latent_names)
    unknown = sorted(set(names) - set(model.inner.latent_names))
    if unknown:
        raise ValueError(
            f"LatentNoise.latents {unknown}: this arch's latents are {model.inner.latent_names}"
        )
    base = jax.random.key(noise.seed)
    ids_b2 = batch["noise_ids"]

    def perturb(carry, step):
        inner = dict(carry.inner_carry)
        for i, name in enumerate(names):
            z = inner[name]

            def draw(ids, z_shape=z.shape[1:], i=i):
                key = jax.random.fold_in(jax.random.fold_in(base, ids[0]), ids[1])
                key = jax.random.fold_in(jax.random.fold_in(key, step), i)
                return jax.random.normal(key, z_shape, jnp.float32)

            inner[name] = (z + noise.sigma * jax.vmap(draw)(ids_b2)).astype(z.dtype)
        return carry.replace(inner_carry=inner)

    return perturb


def _freeze(model, frozen: dict, outputs: dict, steps_b, last: bool) -> dict:
    """`halt`: rows whose Q head halts now (or every row still running at the last step) keep
    this step's logits, q and step count."""
    rule_b = model.halting_rule(outputs["q_halt_logits"], outputs["q_continue_logits"])
    now_b = ~frozen["done"] & (rule_b | last)

    def pick(new, old):
        return jnp.where(now_b.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)

    kept = {k: pick(outputs[k], frozen[k]) for k in HALT_KEYS}
    return {**kept, "steps": pick(steps_b, frozen["steps"]), "done": frozen["done"] | now_b}


def _trace(model, outputs, preds_bl) -> dict:
    halts_b = model.halting_rule(outputs["q_halt_logits"], outputs["q_continue_logits"])
    return {"step_preds": preds_bl, "step_halts": halts_b}

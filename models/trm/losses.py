"""Upstream's ACTLossHead (models/losses.py) as a pure function: `loss, metrics = act_loss(carry, outputs)`.

float64: upstream computes stablemax cross-entropy in float64. JAX silently computes "float64" in
float32 unless x64 is enabled, so `act_loss` refuses to run the float64 loss without x64
(ValueError) rather than degrade in silence. Either enable x64 for the run
(`jax.config.update("jax_enable_x64", True)`; the TRM port sets every dtype explicitly, so the model
is unaffected), or pass `loss_dtype="float32"` to accept float32 rounding of the loss (relative
~1e-7; a documented deviation). tests/test_trm_loss.py::test_stablemax_is_really_float64 fails if
the loss is ever computed in float32 while float64 was asked for.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

IGNORE_LABEL_ID = -100
LOSS_TYPES = ("stablemax_cross_entropy", "softmax_cross_entropy")


def _s(x):
    # The x >= 0 entries take x + 1, but where() still differentiates the other branch there:
    # at x == 1 exactly (common for bf16 logits) 1/(1 - x + 1e-30) has gradient -1e60, inf in
    # float32, and inf * 0 = NaN. Feeding that branch 0 for x >= 0 keeps values and gradients.
    x_neg = jnp.where(x < 0, x, 0)
    return jnp.where(x < 0, 1 / (1 - x_neg + 1e-30), x + 1)


def log_stablemax(x, axis=-1):
    s_x = _s(x)
    return jnp.log(s_x / jnp.sum(s_x, axis=axis, keepdims=True))


def _resolve_dtype(loss_dtype: str):
    if loss_dtype == "float64" and not jax.config.jax_enable_x64:
        raise ValueError(
            "act_loss: stablemax cross-entropy is computed in float64 (as upstream), but jax x64 is "
            "disabled, so float64 would silently be float32. Enable it "
            "(jax.config.update('jax_enable_x64', True), or `with jax.enable_x64(True):`), or pass "
            "loss_dtype='float32' to accept a float32 loss (docs/porting_trm.md)."
        )
    if loss_dtype not in ("float64", "float32"):
        raise ValueError(f"act_loss: loss_dtype={loss_dtype!r}: expected 'float64' or 'float32'")
    return jnp.dtype(loss_dtype)


def stablemax_cross_entropy(logits, labels, valid_mask, loss_dtype: str = "float64"):
    logprobs = log_stablemax(logits.astype(_resolve_dtype(loss_dtype)), axis=-1)
    safe = jnp.where(valid_mask, labels, 0)  # ignored labels gather class 0, then are masked
    picked = jnp.take_along_axis(logprobs, safe[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return -jnp.where(valid_mask, picked, 0)


def softmax_cross_entropy(logits, labels, valid_mask, loss_dtype: str = "float64"):
    # upstream: float32 F.cross_entropy with ignore_index (its valid_mask TypeError is fixed here)
    del loss_dtype
    logprobs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    safe = jnp.where(valid_mask, labels, 0)
    picked = jnp.take_along_axis(logprobs, safe[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return -jnp.where(valid_mask, picked, 0)


def bce_with_logits_sum(x, z):
    return jnp.sum(jnp.maximum(x, 0) - x * z + jnp.log1p(jnp.exp(-jnp.abs(x))))


def act_loss(
    new_carry,
    outputs: dict,
    *,
    loss_type: str = "stablemax_cross_entropy",
    loss_dtype: str = "float64",
):
    """(total loss, metrics) of one ACT step, exactly upstream's ACTLossHead.

    Labels come from `new_carry.current_data["labels"]` (the data each slot holds after refill),
    never from the incoming batch. Loss = lm_loss + 0.5 * (q_halt_loss + q_continue_loss), where
    lm_loss = sum over rows of (per-row mean token loss over labelled cells) and q_halt_loss is the
    summed BCE of q_halt against "this row is exactly right now". `metrics` are raw batch sums
    (count, accuracy, exact_accuracy, q_halt_accuracy, steps over rows that halted with labels;
    lm_loss, q_halt_loss[, q_continue_loss] over all rows); see `normalize_metrics`.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"act_loss: loss_type={loss_type!r}: expected one of {LOSS_TYPES}")
    loss_fn = stablemax_cross_entropy if loss_type == LOSS_TYPES[0] else softmax_cross_entropy
    labels = new_carry.current_data["labels"]
    logits = outputs["logits"]
    sg = jax.lax.stop_gradient  # upstream's torch.no_grad metrics block

    mask = labels != IGNORE_LABEL_ID
    counts = jnp.sum(mask, axis=-1)
    divisor = jnp.maximum(counts, 1)[..., None]
    preds = jnp.argmax(sg(logits), axis=-1)  # first index on ties, like torch
    is_correct = mask & (preds == labels)
    seq_correct = jnp.sum(is_correct, axis=-1) == counts
    valid = new_carry.halted & (counts > 0)
    q_halt = outputs["q_halt_logits"]
    metrics = {
        "count": jnp.sum(valid),
        "accuracy": jnp.sum(
            jnp.where(valid, jnp.sum(is_correct.astype(jnp.float32) / divisor, axis=-1), 0)
        ),
        "exact_accuracy": jnp.sum(valid & seq_correct),
        "q_halt_accuracy": jnp.sum(valid & ((sg(q_halt) >= 0) == seq_correct)),
        "steps": jnp.sum(jnp.where(valid, new_carry.steps, 0)),
    }
    lm_loss = jnp.sum(loss_fn(logits, labels, mask, loss_dtype) / divisor)
    q_halt_loss = bce_with_logits_sum(q_halt, seq_correct.astype(q_halt.dtype))
    metrics["lm_loss"] = sg(lm_loss)
    metrics["q_halt_loss"] = sg(q_halt_loss)
    q_continue_loss = 0.0
    if "target_q_continue" in outputs:
        q_continue_loss = bce_with_logits_sum(
            outputs["q_continue_logits"], outputs["target_q_continue"]
        )
        metrics["q_continue_loss"] = sg(q_continue_loss)
    return lm_loss + 0.5 * (q_halt_loss + q_continue_loss), metrics


def normalize_metrics(metrics: dict, *, mode: str, global_batch_size: int | None = None) -> dict:
    """Upstream pretrain.py's normalisation of the summed metrics.

    train: keys ending in "loss" / global_batch_size, the others / max(count, 1).
    eval:  every key (losses included) / count (rows that halted with labels).
    """
    count = metrics["count"]
    out = {}
    for k, v in metrics.items():
        if k == "count":
            out[k] = v
        elif mode == "train":
            if k.endswith("loss"):
                if global_batch_size is None:
                    raise ValueError("normalize_metrics(mode='train') needs global_batch_size")
                out[k] = v / global_batch_size
            else:
                out[k] = v / jnp.maximum(count, 1)
        elif mode == "eval":
            out[k] = v / count
        else:
            raise ValueError(f"normalize_metrics: mode={mode!r}: expected 'train' or 'eval'")
    return out

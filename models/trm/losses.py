"""Upstream's ACTLossHead (models/losses.py) as a pure function: `loss, metrics = act_loss(carry, outputs)`.

float64: upstream computes stablemax cross-entropy in float64. JAX silently computes "float64" in
float32 unless x64 is enabled, so `act_loss` refuses to run the float64 loss without x64
(ValueError) rather than degrade in silence. Either enable x64 for the run
(`jax.config.update("jax_enable_x64", True)`; the TRM port sets every dtype explicitly, so the model
is unaffected), or pass `loss_dtype="float32"` to accept float32 rounding of the loss (relative
~1e-7; a documented deviation). tests/test_trm_loss.py::test_stablemax_is_really_float64 fails if
the loss is ever computed in float32 while float64 was asked for.

Read beside parity/trm_torch/losses.py (the same functions; its `ACTLossHead` is `act_loss` here).
Axis names in variable suffixes: B batch, L labelled positions (seq_len), V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

IGNORE_LABEL_ID = -100
LOSS_TYPES = ("stablemax_cross_entropy", "softmax_cross_entropy")
LOSS_DTYPES = ("float64", "float32")


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
    if loss_dtype not in LOSS_DTYPES:
        raise ValueError(f"act_loss: loss_dtype={loss_dtype!r}: expected 'float64' or 'float32'")
    return jnp.dtype(loss_dtype)


def _pick(logprobs_blv, labels_bl, valid_mask_bl):
    """-logprobs at each label (torch's gather), 0 where the label is ignored. A one-hot select
    rather than take_along_axis: the same values (x * 1 plus exact zeros) and the same gradient
    (the cotangent where the label is, else 0), without the scatter-add that differentiating a
    gather costs (docs/porting_trm_training.md, "An embedding's gradient is a scatter")."""
    safe_bl = jnp.where(valid_mask_bl, labels_bl, 0)  # ignored labels pick class 0, then masked
    onehot_blv = jax.nn.one_hot(safe_bl, logprobs_blv.shape[-1], dtype=jnp.bool_)
    picked_bl = jnp.sum(jnp.where(onehot_blv, logprobs_blv, 0), axis=-1)
    return -jnp.where(valid_mask_bl, picked_bl, 0)


def stablemax_cross_entropy(logits, labels, valid_mask, loss_dtype: str = "float64"):
    logprobs_blv = log_stablemax(logits.astype(_resolve_dtype(loss_dtype)), axis=-1)
    return _pick(logprobs_blv, labels, valid_mask)


def softmax_cross_entropy(logits, labels, valid_mask, loss_dtype: str = "float64"):
    # upstream: float32 F.cross_entropy with ignore_index (its valid_mask TypeError is fixed here)
    del loss_dtype
    logprobs_blv = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return _pick(logprobs_blv, labels, valid_mask)


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
    labels_bl = new_carry.current_data["labels"]
    logits_blv = outputs["logits"]
    sg = jax.lax.stop_gradient  # upstream's torch.no_grad metrics block

    mask_bl = labels_bl != IGNORE_LABEL_ID
    counts_b = jnp.sum(mask_bl, axis=-1)
    divisor_b1 = jnp.maximum(counts_b, 1)[..., None]
    preds_bl = jnp.argmax(sg(logits_blv), axis=-1)  # first index on ties, like torch
    is_correct_bl = mask_bl & (preds_bl == labels_bl)
    seq_correct_b = jnp.sum(is_correct_bl, axis=-1) == counts_b
    valid_b = new_carry.halted & (counts_b > 0)
    q_halt_b = outputs["q_halt_logits"]
    metrics = {
        "count": jnp.sum(valid_b),
        "accuracy": jnp.sum(
            jnp.where(valid_b, jnp.sum(is_correct_bl.astype(jnp.float32) / divisor_b1, axis=-1), 0)
        ),
        "exact_accuracy": jnp.sum(valid_b & seq_correct_b),
        "q_halt_accuracy": jnp.sum(valid_b & ((sg(q_halt_b) >= 0) == seq_correct_b)),
        "steps": jnp.sum(jnp.where(valid_b, new_carry.steps, 0)),
    }
    lm_loss = jnp.sum(loss_fn(logits_blv, labels_bl, mask_bl, loss_dtype) / divisor_b1)
    q_halt_loss = bce_with_logits_sum(q_halt_b, seq_correct_b.astype(q_halt_b.dtype))
    metrics["lm_loss"] = sg(lm_loss)
    metrics["q_halt_loss"] = sg(q_halt_loss)
    q_continue_loss = 0.0
    if "target_q_continue" in outputs:
        q_continue_loss = bce_with_logits_sum(
            outputs["q_continue_logits"], outputs["target_q_continue"]
        )
        metrics["q_continue_loss"] = sg(q_continue_loss)
    return lm_loss + 0.5 * (q_halt_loss + q_continue_loss), metrics


# Per-step values the train step reports beside the sums: passed through, never normalised.
NOT_SUMS = ("lr", "puzzle_emb_lr", "grad_norm", "puzzle_emb_grad_norm")


def normalize_metrics(metrics: dict, *, mode: str, global_batch_size: int | None = None) -> dict:
    """Upstream pretrain.py's normalisation of the summed metrics (jnp scalars inside jit and host
    floats alike).

    train: keys ending in "loss" / global_batch_size, every other sum / max(count, 1), so `count`
           itself becomes 1 (0 with no valid row), as in upstream's logs; NOT_SUMS pass through.
    eval:  every key (losses included) / count (rows that halted with labels); `count` stays.
    """
    if mode not in ("train", "eval"):
        raise ValueError(f"normalize_metrics: mode={mode!r}: expected 'train' or 'eval'")
    if mode == "train" and global_batch_size is None:
        raise ValueError("normalize_metrics(mode='train') needs global_batch_size")
    count = metrics["count"]
    out = {}
    for k, v in metrics.items():
        if k in NOT_SUMS or (mode == "eval" and k == "count"):
            out[k] = v
        elif mode == "eval":
            out[k] = v / count
        elif k.endswith("loss"):
            out[k] = v / global_batch_size
        else:
            out[k] = v / jnp.maximum(count, 1)
    return out

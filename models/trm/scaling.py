"""Test-time scaling: K noisy trajectories per puzzle, one answer chosen (PTRM-style).

A trained TRM's answer depends on where its recursion goes; Gaussian noise on the latents before
every ACT step sends each of K copies of a puzzle down another path, and the Q head (trained to
say "this answer is right") or a majority vote picks one of the K answers:

    out = trajectories_step(graphdef, state, batch, trajectories=K,
                            noise=LatentNoise(sigma, seed), select="q_halt")

`batch` holds B puzzles (their rows and "example", each row's index in the test split); inside,
every row is repeated K times (row b's trajectories are rows b*K .. b*K+K-1, noise ids
(example, k)), models/trm/evaluation.py's `eval_step` runs all B*K rows as one batch, and the K
answers of each puzzle are reduced on the device to

    out["sums"]           eval_step's sums over all B*K trajectories (loss, q accuracy, steps,
                          and their count)
    out["chosen"]         the CHOSEN answers' exact_accuracy / accuracy sums and their count (B
                          puzzles with labels)
    out["per_step"]       eval_step's per ACT step sums, over all trajectories
    out["by_k"]           for each k in `ks`: the chosen answer's exact / token sums had only the
                          first k trajectories been drawn, and the oracle ("any of the first k is
                          right"); trajectory k's noise does not depend on K, so by_k[k] is what a
                          run with --trajectories k and the same seed gives
    out["preds"], out["q_halt_logits"]   the chosen answer and its q, per puzzle

select="q_halt": the trajectory with the highest final q_halt logit (with eval_step's `halt`, the
q at the step the row halted). select="vote": the answer (the prediction on the labelled cells)
that most trajectories give; among tied answers, the one whose best trajectory has the highest q.
K=1 with sigma 0 is the plain evaluation, exactly (the same eval_step on the same rows).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from models.trm.evaluation import LatentNoise, eval_step
from models.trm.losses import IGNORE_LABEL_ID

SELECT = ("q_halt", "vote")


@dataclasses.dataclass(frozen=True)
class Scaling:
    """Test-time scaling options (hashable: a jit cache key): K trajectories per puzzle, the noise
    on their latents, how one answer is chosen (one of SELECT)."""

    trajectories: int
    noise: LatentNoise
    select: str = "q_halt"


def prefix_ks(trajectories: int) -> tuple[int, ...]:
    """k = 1, 2, 4, ... up to K, and K itself: the curve a report gives for K trajectories."""
    ks, k = [], 1
    while k < trajectories:
        ks.append(k)
        k *= 2
    return (*ks, trajectories)


def trajectories_step(
    graphdef,
    state,
    batch: dict,
    *,
    trajectories: int,
    noise: LatentNoise | None,
    select: str = "q_halt",
    extra_steps: int = 0,
    halt: bool = False,
    ks: tuple[int, ...] | None = None,
) -> dict:
    """K trajectories of each of the batch's B puzzles, one answer chosen; see the module
    docstring. Pure and jittable (K, noise, select, extra_steps, halt, ks static)."""
    K = int(trajectories)
    ks = prefix_ks(K) if ks is None else ks
    rows = {k: v for k, v in batch.items() if k != "example"}
    expanded = {k: jnp.repeat(v, K, axis=0) for k, v in rows.items()}
    B, L = batch["labels"].shape
    example_bk = jnp.broadcast_to(batch["example"][:, None], (B, K))
    k_bk = jnp.broadcast_to(jnp.arange(K)[None, :], (B, K))
    expanded["noise_ids"] = jnp.stack([example_bk, k_bk], -1).reshape(B * K, 2).astype(jnp.int32)
    out = eval_step(graphdef, state, expanded, extra_steps=extra_steps, halt=halt, noise=noise)
    preds_bkl = out["preds"].reshape(B, K, L)
    q_bk = out["q_halt_logits"].reshape(B, K)
    by_k, idx_b, count = select_answers(preds_bkl, q_bk, batch["labels"], select=select, ks=ks)
    return {
        "sums": out["sums"],
        "chosen": {
            "exact_accuracy": by_k[K]["exact_accuracy"],
            "accuracy": by_k[K]["accuracy"],
            "count": count,
        },
        "per_step": out["per_step"],
        "by_k": by_k,
        "preds": jnp.take_along_axis(preds_bkl, idx_b[:, None, None], axis=1)[:, 0],
        "q_halt_logits": jnp.take_along_axis(q_bk, idx_b[:, None], axis=1)[:, 0],
    }


def select_answers(preds_bkl, q_bk, labels_bl, *, select: str, ks: tuple[int, ...]):
    """-> (by_k: k -> {exact_accuracy, accuracy, oracle_exact_accuracy} sums, the index of the
    chosen trajectory of each puzzle among all K, the count of puzzles with labels)."""
    if select not in SELECT:
        raise ValueError(f"select={select!r}: expected one of {SELECT}")
    mask_bl = labels_bl != IGNORE_LABEL_ID
    counts_b = jnp.sum(mask_bl, axis=-1)
    valid_b = counts_b > 0
    right_bkl = mask_bl[:, None, :] & (preds_bkl == labels_bl[:, None, :])
    exact_bk = valid_b[:, None] & (jnp.sum(right_bkl, -1) == counts_b[:, None])
    # eval_step.step_sums' formula, so one trajectory scores as the plain evaluation does
    frac_bkl = right_bkl.astype(jnp.float32) / jnp.maximum(counts_b, 1)[:, None, None]
    token_bk = jnp.where(valid_b[:, None], jnp.sum(frac_bkl, -1), 0.0)
    same_bkk = jnp.all(
        (preds_bkl[:, :, None, :] == preds_bkl[:, None, :, :]) | ~mask_bl[:, None, None, :], -1
    )

    def chosen(k: int):
        """Index of the chosen trajectory among the first k, per puzzle."""
        q = q_bk[:, :k]
        if select == "q_halt":
            return jnp.argmax(q, axis=-1)
        votes_bk = jnp.sum(same_bkk[:, :k, :k], axis=-1)  # how many of the k agree with each
        # the answer's best q among its voters breaks a tie in votes
        best_q_bk = jnp.max(jnp.where(same_bkk[:, :k, :k], q[:, None, :], -jnp.inf), axis=-1)
        top_bk = votes_bk == jnp.max(votes_bk, axis=-1, keepdims=True)
        return jnp.argmax(jnp.where(top_bk, best_q_bk, -jnp.inf), axis=-1)

    def pick(x_bk, idx_b):
        return jnp.take_along_axis(x_bk, idx_b[:, None], axis=1)[:, 0]

    by_k = {}
    for k in ks:
        idx_b = chosen(k)
        by_k[k] = {
            "exact_accuracy": jnp.sum(pick(exact_bk, idx_b)).astype(jnp.float32),
            "accuracy": jnp.sum(pick(token_bk, idx_b)).astype(jnp.float32),
            "oracle_exact_accuracy": jnp.sum(jnp.any(exact_bk[:, :k], -1)).astype(jnp.float32),
        }
    return by_k, chosen(q_bk.shape[1]), jnp.sum(valid_b).astype(jnp.float32)

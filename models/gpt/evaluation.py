"""One GPT evaluation batch as a pure function (nanoGPT's estimate_loss, one batch).

    graphdef = eval_graphdef(graphdef, state)        # the same state, dropout off
    sums = eval_step(graphdef, state, batch)          # {"loss", "count"}: add over batches
    mean_loss = sums["loss"] / sums["count"]

nanoGPT's estimate_loss averages the mean loss of eval_iters batches per split with the model in
eval mode; the sums here add over batches to that average.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


def eval_graphdef(graphdef, state):
    """The graphdef of the (model, optimizer) `graphdef` with the model in eval mode (dropout
    off): a different static graphdef over the same state (shapes are enough)."""
    model, optimizer = nnx.merge(graphdef, state)
    model.eval()
    return nnx.graphdef((model, optimizer))


def eval_step(graphdef, state, batch: dict) -> dict:
    """The batch's mean loss (dropout off: `graphdef` from `eval_graphdef`) as a sum over one
    batch: {"loss", "count": 1}. `batch` holds "x" and "y", [B, T]."""
    model, _ = nnx.merge(graphdef, state)
    return {"loss": model(batch["x"], batch["y"])[1], "count": jnp.float32(1)}

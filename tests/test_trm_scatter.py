"""The TRM step sums no gradient in bf16 and holds no scatter (docs/porting_trm_training.md, "An
embedding's gradient is a scatter").

A Sudoku batch puts ~69% of its 768 x 81 input cells on the blank token, so the token embedding's
gradient, a scatter-add of 62,208 rows into an 11-row table when it is differentiated as a
gather, piles ~43k updates on one row: a bf16 scatter-add rounds every partial sum to bf16 (below:
~38% of the row's scale off) and on a GPU is a compare-and-swap loop that those updates contend
for. The same holds for SignSGD's one-row Sudoku table (768 updates on one row). Proven here:

- the lowered real trm_sudoku step (configs/experiment/trm_sudoku.yaml, no data, no run) holds no
  scatter at all; with today's defaults switched back (model.embed_grad=scatter_bf16,
  optim.table_update=sparse) the same check finds the bf16 scatter-add, so it can see one;
- CastedEmbedding's gradient on Sudoku token statistics against the float64 sum of the same bf16
  cotangents: every variant's forward is the same bits; "onehot" and "scatter_f32" within
  F32_SUM_BOUND of the row scale, "scatter_bf16" far outside it.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.trm.config import EMBED_GRADS
from models.trm.layers import CastedEmbedding

# Measured on this test's batch (AMD and Intel-emulated AVX2 CPUs alike, XLA's own dot and
# scatter): onehot 4.8e-7, scatter_f32 5.6e-7, scatter_bf16 0.38 of the largest row's scale. The
# bound is 20x the float32 figures and 400x below one bf16 ulp (2^-8 of scale).
F32_SUM_BOUND = 1e-5
BF16_SUM_AT_LEAST = 1e-2
BLANK_FRACTION = 0.69  # Sudoku-Extreme's train split: 69% of the input cells are blank


def scatters(stablehlo: str) -> list[tuple[str, str]]:
    """(element type, combining op) of every stablehlo.scatter in a lowered module."""
    out = []
    for m in re.finditer(
        r'"stablehlo\.scatter"\(.*?\n\s*\^bb0\(%\w+: tensor<(\w+)>.*?\n\s*(.*?)\n', stablehlo
    ):
        body = m.group(2)
        op = re.search(r"stablehlo\.(\w+)", body)
        out.append((m.group(1), op.group(1) if op else "set"))
    return out


def _lowered_trm_sudoku_step(*overrides: str) -> str:
    from train import mesh as mesh_lib
    from train.compose import load_config
    from train.families import make_task
    from train.jit import build_train_step

    cfg = load_config(["+experiment=trm_sudoku", "mesh=cpu", *overrides])
    mesh = mesh_lib.make_mesh(cfg.mesh, devices=jax.devices()[:1])
    task = make_task(cfg, mesh, need_data=False)
    jitted, args = build_train_step(cfg, mesh, task=task)
    return jitted.lower(*args).as_text()


def test_the_real_trm_sudoku_step_holds_no_scatter():
    """...and no conditional: a step past total_steps is masked out, not branched around
    (models/trm/training.py), so XLA:TPU's cost model can predict the step (train/aot.py)."""
    lowered = _lowered_trm_sudoku_step()
    assert scatters(lowered) == []
    assert "stablehlo.case" not in lowered and "stablehlo.if" not in lowered
    old = scatters(
        _lowered_trm_sudoku_step("model.embed_grad=scatter_bf16", "optim.table_update=sparse")
    )
    assert ("bf16", "add") in old, old  # the check sees the scatter it guards against


def _sudoku_ids(rng, rows=768, cells=81):
    digits = rng.integers(2, 11, size=(rows, cells))
    return np.where(rng.random((rows, cells)) < BLANK_FRACTION, 1, digits).astype(np.int32)


@pytest.mark.parametrize("grad", EMBED_GRADS)
def test_embedding_gradient_sums_in_float32(grad):
    rng = np.random.default_rng(0)
    ids = jnp.asarray(_sudoku_ids(rng))
    cot = jnp.asarray(rng.standard_normal((*ids.shape, 512)) * 1e-3, jnp.bfloat16)
    emb = CastedEmbedding(11, 512, 0.05, jnp.bfloat16, grad=grad, rngs=nnx.Rngs(0))
    weight = emb.embedding_weight[...]
    graphdef, state = nnx.split(emb)
    rows, vjp = jax.vjp(lambda s: nnx.merge(graphdef, s)(ids), state)
    (grads,) = vjp(cot)
    grad_w = grads["embedding_weight"][...]
    same_rows = jnp.take(weight.astype(jnp.bfloat16), ids, axis=0)
    assert rows.dtype == jnp.bfloat16 and bool(jnp.all(rows == same_rows)), "forward changed"
    exact = np.zeros((11, 512))
    np.add.at(exact, np.asarray(ids).reshape(-1), np.asarray(cot, np.float64).reshape(-1, 512))
    err = np.abs(np.asarray(grad_w, np.float64) - exact).max() / np.abs(exact).max()
    assert grad_w.dtype == jnp.float32
    if grad == "scatter_bf16":
        assert err > BF16_SUM_AT_LEAST, err
    else:
        assert err < F32_SUM_BOUND, err

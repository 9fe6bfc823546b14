"""The jitted train step: a family's pure step, `jax.jit` with explicit shardings and donation.

    step_fn = jit_train_step(task)              # state, metrics = step_fn(state, batch)
    jitted, (abstract_state, abstract_batch) = build_train_step(cfg, mesh)
    compiled = jitted.lower(abstract_state, abstract_batch).compile()   # AOT (train/aot.py)

The family's `train_step(state, batch) -> (state, metrics)` is a PURE function of pytrees:
`nnx.merge(graphdef, state)` at the top, the model's own step, `nnx.split` / `nnx.state` at the end
(MaxText's shape). Nothing is mutated across the jit boundary, so nothing is lost (jax.jit does not
propagate NNX in-place mutation; docs/training.md, "jax.jit does not propagate NNX in-place mutation"). The
state argument is donated: XLA reuses its buffers for the new state, so params + optimizer state
exist once in device memory.
"""

from __future__ import annotations

import jax

from train import mesh as mesh_lib
from train.families import make_task
from train.nonfinite import guard_step
from train.task import Task


def with_shardings(abstract_tree, shardings):
    """ShapeDtypeStructs carrying the given shardings (restore targets, AOT arguments)."""
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_tree, shardings
    )


def jit_train_step(task: Task):
    """`train_step(state, batch) -> (state, metrics)`: the task's pure step, jitted with the
    in/out shardings of state and batch, the state donated."""
    batch_sh = jax.tree.map(lambda a: a.sharding, task.abstract_batch())
    # the non-finite guard of `trainer.on_nonfinite` (train/nonfinite.py): metrics gain
    # `nonfinite`; in skip mode a step with a non-finite loss or gradient norm returns its input
    return jax.jit(
        guard_step(task.train_step, task.cfg.trainer.on_nonfinite),
        in_shardings=(task.state_shardings, batch_sh),
        out_shardings=(task.state_shardings, mesh_lib.replicated(task.mesh)),
        donate_argnums=0,
    )


def build_train_step(cfg, mesh, *, task: Task | None = None, need_data: bool = False):
    """-> (jitted_step, (abstract_state, abstract_batch)) for `cfg` on `mesh`, WITHOUT running it.

    The abstract arguments are ShapeDtypeStructs with NamedShardings on `mesh`, so
    `jitted_step.lower(*abstract_args).compile()` compiles the real production step ahead of time
    (train/aot.py does this for a TPU v4-64 topology). With need_data=False, data-dependent sizes
    (TRM: seq_len, vocab_size, num_puzzle_identifiers; GPT: vocab_size) come from the config when
    the dataset is not on disk.
    """
    task = task or make_task(cfg, mesh, need_data=need_data)
    abstract_state = with_shardings(task.abstract_state, task.state_shardings)
    return jit_train_step(task), (abstract_state, task.abstract_batch())

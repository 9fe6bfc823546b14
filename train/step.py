"""The jitted train step: split the NNX graph once, jax.jit with explicit shardings + donation.

    jitted, (abstract_state, abstract_batch) = build_train_step(cfg, mesh)
    compiled = jitted.lower(abstract_state, abstract_batch).compile()   # AOT (train/aot.py)

A *task* (train/gpt_task.py, train/trm_task.py) owns the model-specific parts: it builds the model
and optimizer inside `init_state(key)` (so `jax.eval_shape` gives the abstract state without
allocating, and `jax.jit(init_state, out_shardings=...)` creates every array directly in its
shard), and `train_step(state, batch) -> (state, metrics)` is a PURE function of pytrees:
`nnx.merge(graphdef, state)` at the top, the model's own step function, `nnx.state(...)` at the
end. Nothing is mutated across the jit boundary, so nothing is lost (jax.jit does not propagate
NNX in-place mutation; docs/training.md, trap 2). The state argument is donated: XLA reuses its
buffers for the new state, so params + optimizer state exist once in device memory.
"""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding

from train import mesh as mesh_lib


def make_task(cfg, mesh, *, need_data: bool = True):
    """The task object for `cfg.task` (data metadata is read from disk unless need_data=False)."""
    if cfg.task == "gpt":
        from train.gpt_task import GPTTask

        return GPTTask(cfg, mesh, need_data=need_data)
    if cfg.task == "trm":
        from train.trm_task import TRMTask

        return TRMTask(cfg, mesh, need_data=need_data)
    raise ValueError(f"unknown task {cfg.task!r}")


def with_shardings(abstract_tree, shardings):
    """ShapeDtypeStructs carrying the given shardings (restore targets, AOT arguments)."""
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_tree, shardings
    )


def jit_train_step(task):
    """jax.jit(task.train_step) with in/out shardings of state and batch, state donated."""
    state_sh = task.state_shardings
    batch_sh = jax.tree.map(lambda a: a.sharding, task.abstract_batch())
    replicated = mesh_lib.replicated(task.mesh)
    return jax.jit(
        task.train_step,
        in_shardings=(state_sh, batch_sh),
        out_shardings=(state_sh, replicated),
        donate_argnums=0,
    )


def build_train_step(cfg, mesh, *, task=None, need_data: bool = False):
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


def is_sharded_like(tree, shardings) -> bool:
    """True when every leaf's sharding is equivalent to the expected NamedSharding (tests)."""
    ok = jax.tree.map(
        lambda x, s: (
            x.sharding.is_equivalent_to(s, x.ndim) if isinstance(s, NamedSharding) else True
        ),
        tree,
        shardings,
    )
    return all(jax.tree.leaves(ok))

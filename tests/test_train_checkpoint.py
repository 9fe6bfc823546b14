"""Checkpointer: keep-last-N plus keep-best, atomic step directories, iterator state, and restore
onto another mesh (unit level: no model)."""

from __future__ import annotations

import os

import grain
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from omegaconf import OmegaConf

from parity.compare import EXACT, assert_close
from train.checkpoint import Checkpointer
from train.config import CheckpointConfig


def _cfg(**kw):
    return OmegaConf.structured(CheckpointConfig(**kw))


def test_keeps_last_n_and_the_best(tmp_path):
    ckpt = Checkpointer(str(tmp_path), _cfg(keep_last=2, best_metric="eval/x", best_mode="min"))
    state = {"w": jnp.arange(4.0)}
    for step, x in zip([1, 2, 3, 4, 5], [0.5, 0.1, 0.7, 0.6, None]):
        metrics = None if x is None else {"eval/x": x}
        ckpt.save(step, state, meta={"step": step}, metrics=metrics, force=True)
    ckpt.close()
    kept = sorted(int(d) for d in os.listdir(tmp_path) if d.isdigit())
    assert kept == [2, 4, 5], kept  # best (0.1 at step 2) + the last two
    assert not [d for d in os.listdir(tmp_path) if "tmp" in d]  # no half-written steps left


def test_restores_state_iterator_and_onto_another_mesh(tmp_path):
    devices = jax.devices()
    mesh8 = jax.make_mesh(
        (8,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices
    )
    mesh2 = jax.make_mesh(
        (2,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices[:2]
    )
    w = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh8, PartitionSpec("fsdp")))
    it = iter(grain.MapDataset.range(100).to_iter_dataset())
    for _ in range(7):
        next(it)
    ckpt = Checkpointer(str(tmp_path), _cfg())
    ckpt.save(7, {"w": w, "step": jnp.int32(7)}, it, meta={"step": 7}, force=True)
    ckpt.close()

    target = {
        "w": jax.ShapeDtypeStruct(
            (8, 4), jnp.float32, sharding=NamedSharding(mesh2, PartitionSpec("fsdp"))
        ),
        "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh2, PartitionSpec())),
    }
    fresh = iter(grain.MapDataset.range(100).to_iter_dataset())
    ckpt = Checkpointer(str(tmp_path), _cfg())
    state, meta = ckpt.restore(ckpt.latest_step(), target, fresh)
    ckpt.close()
    assert meta["step"] == 7
    assert state["w"].sharding.mesh.devices.size == 2
    assert_close("restored w", np.asarray(state["w"]), np.arange(32.0).reshape(8, 4), EXACT)
    assert next(fresh) == 7  # the data position came back

"""Checkpoints: one Orbax CheckpointManager per run directory, async and atomic.

A checkpoint step directory holds three items:
  state/  the whole train state pytree (params, optimizer states, EMA, step, RNG keys and, for TRM,
          the persistent ACT carry), written by every process for its own shards;
  data/   the Grain iterator state, one JSON per process (`process_<i>-of-<n>.json`);
  meta/   small JSON (step, best metric so far, config) written by process 0.
Orbax writes each step to a temporary directory and renames it after `commit_success`, so a
process killed mid-save leaves no half-written step that `latest_step()` would pick up.
Restoring takes an ABSTRACT target (ShapeDtypeStructs carrying NamedShardings of the *current*
mesh), so a checkpoint written on 8 devices restores onto 2 (or another process count).
"""

from __future__ import annotations

import logging
import math

import grain
import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as cm

from train.metrics import is_local

log = logging.getLogger(__name__)


def _has_grain_state(it) -> bool:
    return it is not None and hasattr(it, "get_state") and hasattr(it, "set_state")


class Checkpointer:
    """Thin wrapper with a v1-shaped surface: save(step, state, data_iter), restore(...)."""

    def __init__(self, directory: str, ckpt_cfg):
        # Local or a bucket URL (gs://...): Orbax takes either as an epath.Path.
        self.directory = epath.Path(directory)
        if is_local(directory):
            self.directory = self.directory.resolve()
        best = ckpt_cfg.best_metric
        policies = [cm.preservation_policy.LatestN(n=int(ckpt_cfg.keep_last))]
        if ckpt_cfg.keep_best and best:
            worst = math.inf if ckpt_cfg.best_mode == "min" else -math.inf
            policies.append(
                cm.preservation_policy.BestN(
                    get_metric_fn=lambda m: float(m.get(best, worst)),
                    # BestN keeps the tail of the sorted list: descending for "min".
                    reverse=ckpt_cfg.best_mode == "min",
                    n=1,
                    keep_checkpoints_without_metrics=False,
                )
            )
        self.manager = ocp.CheckpointManager(
            self.directory,
            item_names=("state", "data", "meta"),
            item_handlers={
                "state": ocp.StandardCheckpointHandler(),
                "data": grain.checkpoint.CheckpointHandler(),
                "meta": ocp.JsonCheckpointHandler(),
            },
            options=ocp.CheckpointManagerOptions(
                enable_async_checkpointing=bool(ckpt_cfg.async_save),
                preservation_policy=cm.preservation_policy.AnyPreservationPolicy(policies),
                cleanup_tmp_directories=True,
            ),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, data_iter=None, meta=None, metrics=None, force=False):
        items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta or {})}
        if _has_grain_state(data_iter):
            items["data"] = grain.checkpoint.CheckpointSave(data_iter)
        return self.manager.save(
            step, args=ocp.args.Composite(**items), metrics=metrics, force=force
        )

    def read_meta(self, step: int) -> dict:
        """Only the small meta item of a step (checked before the state is restored)."""
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
            "meta"
        ]

    def restore(self, step: int, abstract_state, data_iter=None):
        """Restores onto the shardings in `abstract_state`; the iterator is restored in place.

        The data item is only restored when this run has the same process count as the one that
        wrote it (Grain keeps one iterator file per process); otherwise the data stream restarts
        and a warning says so.
        """
        items = {
            "state": ocp.args.StandardRestore(abstract_state),
            "meta": ocp.args.JsonRestore(),
        }
        own_file = f"process_{jax.process_index()}-of-{jax.process_count()}.json"
        if _has_grain_state(data_iter):
            if (self.directory / str(step) / "data" / own_file).exists():
                items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
            else:
                log.warning("checkpoint %d has no data state for %s: data restarts", step, own_file)
        restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        return restored["state"], restored["meta"]

    def wait(self):
        self.manager.wait_until_finished()

    def close(self):
        self.manager.wait_until_finished()
        self.manager.close()

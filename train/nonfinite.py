"""Non-finite loss or gradients: detected inside the jitted step, acted on by the host one step late.

    step = guard_step(pure_step, mode)   # state, metrics = step(state, batch); metrics["nonfinite"]
    guard = NonfiniteGuard(mode, last_good)
    guard.watch(step, metrics)           # after step N is dispatched: acts on step N-1's flag
    guard.check_pending()                # before an eval / checkpoint of step N: step N's flag

The flag is computed on the device from every metric named `*loss` or `*grad_norm` (GPT: loss,
grad_norm; TRM: lm_loss, q_halt_loss, grad_norm, puzzle_emb_grad_norm): one scalar, returned with
the step's metrics. The host reads it after the trainer has waited for that step anyway
(train.trainer.StepClock waits for step N-1 once step N is queued), so the check adds no wait.

`trainer.on_nonfinite`:
  stop  (default) NonfiniteError naming the step, the metrics and the last good checkpoint; the
        state of that step (and the one after, already queued) is never evaluated or saved.
  skip  inside the step, the NEW state is replaced by the OLD one where the flag is set
        (jnp.where, no host sync): the update, optimizer counts, EMA, RNG and TRM carry stay as
        they were; the host counts the event (`train/skipped_steps`) and warns. Costs one more
        copy of the state in device memory (old and new are both alive at the select).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from train.config import NONFINITE_MODES

log = logging.getLogger(__name__)

FLAG = "nonfinite"  # the step's metric: 1.0 when a checked metric is NaN or +-inf, else 0.0
_WARN_FIRST = 10  # skip mode warns for the first skips, then every 100th


class NonfiniteError(RuntimeError):
    """A step gave a non-finite loss or gradient norm and trainer.on_nonfinite=stop."""


def checked_keys(metrics: dict) -> list[str]:
    """The metrics the flag is computed from: losses and global gradient norms."""
    return sorted(k for k in metrics if k != FLAG and k.endswith(("loss", "grad_norm")))


def nonfinite_flag(metrics: dict):
    """Device bool scalar: True when any checked metric has a NaN or an infinity."""
    keys = checked_keys(metrics)
    if not keys:
        raise ValueError(f"no loss or grad_norm among the step's metrics {sorted(metrics)}")
    finite = [jnp.all(jnp.isfinite(metrics[k])) for k in keys]
    return ~jnp.all(jnp.stack(finite))


def guard_step(step: Callable, mode: str) -> Callable:
    """`step(state, batch) -> (state, metrics)` with the flag added to its metrics; with
    mode="skip" the returned state IS the input state (bit for bit) when the flag is set."""
    if mode not in NONFINITE_MODES:
        raise ValueError(f"on_nonfinite must be one of {NONFINITE_MODES}, got {mode!r}")

    def train_step(state, batch):  # jit names the program (and its compilation-cache file) so
        # The input's arrays, taken BEFORE the step: an NNX step merges the state into Variables
        # and updates them in place, which can rebind the input pytree's leaves to the new values.
        old = jax.tree.leaves(state)
        new_state, metrics = step(state, batch)
        bad = nonfinite_flag(metrics)
        if mode == "skip":
            leaves, treedef = jax.tree.flatten(new_state)
            if len(leaves) != len(old):
                raise ValueError(f"the step returned {len(leaves)} state leaves for {len(old)}")
            kept = [jnp.where(bad, o, n) for o, n in zip(old, leaves, strict=True)]
            new_state = jax.tree.unflatten(treedef, kept)
        return new_state, {**metrics, FLAG: bad.astype(jnp.float32)}

    return train_step


def _host_value(x) -> np.ndarray:
    """A metric on this process's host. The step's metrics are replicated (jit_train_step's
    out_shardings), so every process reads the same value from its own copy, and the value
    `copy_to_host_async` started fetching in `watch` is the one read here."""
    return np.asarray(x)


class NonfiniteGuard:
    """Reads each step's flag one step late and acts on it (trainer.on_nonfinite).

    `last_good()` describes the newest checkpoint on disk (for the stop message); `skipped` is the
    count so far (a resumed run continues it from the checkpoint's meta)."""

    def __init__(self, mode: str, last_good: Callable[[], str], skipped: int = 0):
        self.mode, self.last_good, self.skipped = mode, last_good, int(skipped)
        self.pending = None  # (step, metrics) dispatched, flag not yet read

    def watch(self, step: int, metrics: dict) -> None:
        """Step `step` was dispatched: act on the previous step's flag (already computed)."""
        if FLAG in metrics and isinstance(metrics[FLAG], jax.Array):
            metrics[FLAG].copy_to_host_async()  # arrives with the step: the read is free
        previous, self.pending = self.pending, (step, metrics)
        if previous is not None:
            self._check(*previous)

    def check_pending(self) -> None:
        """Act on the last dispatched step's flag now (waits for it): before it is evaluated or
        saved, so a non-finite state is never checkpointed."""
        previous, self.pending = self.pending, None
        if previous is not None:
            self._check(*previous)

    def host_metrics(self) -> dict:
        """Logged with the step's metrics: the skips known so far (up to the previous step)."""
        return {"train/skipped_steps": self.skipped} if self.mode == "skip" else {}

    def final(self) -> dict:
        """For final.json: the run's total of skipped steps (skip mode)."""
        return {"nonfinite_skipped": self.skipped} if self.mode == "skip" else {}

    def _check(self, step: int, metrics: dict) -> None:
        if not float(_host_value(metrics[FLAG])):
            return
        values = {f"train/{k}": float(_host_value(metrics[k])) for k in checked_keys(metrics)}
        bad = [k for k, v in values.items() if not math.isfinite(v)]
        shown = ", ".join(f"{k}={v}" for k, v in values.items())
        if self.mode == "stop":
            raise NonfiniteError(
                f"non-finite {', '.join(bad)} at step {step} ({shown}); stopped before evaluating "
                f"or saving it (trainer.on_nonfinite=stop); last good checkpoint: "
                f"{self.last_good()}. trainer.on_nonfinite=skip skips such steps instead"
            )
        self.skipped += 1
        if self.skipped <= _WARN_FIRST or self.skipped % 100 == 0:
            log.warning(
                "step %d skipped: non-finite %s (%s); %d step(s) skipped so far "
                "(trainer.on_nonfinite=skip)",
                step,
                ", ".join(bad),
                shown,
                self.skipped,
            )

"""Preemption: a SIGTERM or SIGINT during training saves the step reached, then the run exits.

What a spot preemption, a maintenance event, `python -m launch.tpu stop` or Ctrl-C sends is a
request to stop, not a crash. The trainer asks `Preemption.due(step)` once per step, before it
fetches the next batch; when it says so, the trainer saves that step (model, optimizer, EMA, TRM
carry, data-iterator state), waits until the checkpoint is committed and raises `Preempted`, which
`python -m train.main` turns into one line and exit status EXIT_PREEMPTED (75, sysexits'
EX_TEMPFAIL: "try again"), so a launcher can tell "preempted, resume me" from "failed" (1).

One process: the signal handlers set a flag. A second signal while the step is saved is reported
and ignored: the save is never cut short (only SIGKILL can, and Orbax commits atomically).

Several processes (a TPU pod): every process must save the SAME step, whichever host got the
signal. JAX's coordination service does that agreement: `jax.distributed.initialize` installs a
SIGTERM notifier, and `multihost_utils.reached_preemption_sync_point(step)`, called at every step,
becomes true on every process at one step after any of them was signalled. SIGINT is forwarded to
this process as SIGTERM, so Ctrl-C on one host reaches the same agreement. A Python SIGTERM
handler would replace JAX's notifier, so none is installed there.
"""

from __future__ import annotations

import logging
import os
import signal

import jax
from jax.experimental import multihost_utils

log = logging.getLogger(__name__)

EXIT_PREEMPTED = 75  # sysexits.h EX_TEMPFAIL: a temporary failure, run the same command again


class Preempted(Exception):  # noqa: N818 (not an error: the run stopped on request)
    """Training stopped on a signal after committing the checkpoint of `step` at `path`."""

    def __init__(self, step: int, path: str | None, why: str = ""):
        self.step, self.path = step, path
        if path:
            text = f"checkpoint {path} committed; run the same command again to resume"
        else:
            text = f"{why}; run the same command again to start over"
        super().__init__(f"preempted at step {step}: {text}")


class Preemption:
    """Installed for the duration of the loop (`with Preemption() as p:`), handlers restored at
    exit. `due(step)`: stop after `step`?"""

    def __init__(self):
        self.requested = False
        self.multiprocess = jax.process_count() > 1
        self._previous = {}

    def __enter__(self):
        signals = (signal.SIGINT,) if self.multiprocess else (signal.SIGINT, signal.SIGTERM)
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        return False

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.multiprocess:  # JAX's notifier listens for SIGTERM and tells every process
            log.warning("%s: asking every process to stop at the same step", name)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if self.requested:
            log.warning("%s again: still saving the checkpoint; it will not be cut short", name)
            return
        self.requested = True
        log.warning("%s: finishing this step, then saving a checkpoint and exiting", name)

    def due(self, step: int) -> bool:
        """Whether to save and stop after `step` (called at every step, with increasing steps)."""
        if self.multiprocess:
            return multihost_utils.reached_preemption_sync_point(step)
        return self.requested

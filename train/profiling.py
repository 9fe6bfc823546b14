"""A jax.profiler trace of a window of the trainer's own steps (MaxText's profiler window).

    python -m train.main +experiment=X trainer.profile_start=10 trainer.profile_steps=3
    python -m bench.profile --trace RUN_DIR/profile --steps 3      # time per XLA op

Steps `profile_start` .. `profile_start + profile_steps - 1` (counted from 1, as the logs count)
are traced into `<run dir>/profile` (TensorBoard / Perfetto read it). The window starts after the
earlier steps have finished and ends after its last step has, so the trace holds those steps
and their host work (data, logging, checkpoint checks) and nothing else; the two waits make the
window's own step times a little longer than the loop's. `bench.profile` traces the same jitted
step alone, on a fixed batch: a gap between the two is in the trainer, not in the step. On a
GPU set XLA_FLAGS=--xla_gpu_enable_command_buffer= for the run, or the trace shows CUDA-graph
`command_buffer` events instead of ops (bench.profile sets it itself).
"""

from __future__ import annotations

import logging

import jax

log = logging.getLogger(__name__)


class StepProfiler:
    def __init__(self, cfg, run_dir):
        self.start = int(cfg.trainer.profile_start)
        self.steps = int(cfg.trainer.profile_steps)
        self.directory = run_dir / "profile"
        self.active = False

    def before(self, step: int, state) -> None:
        """Step `step` (from 1) is about to be dispatched."""
        if self.start and step == self.start and not self.active:
            jax.block_until_ready(state)  # the earlier steps stay out of the trace
            self.directory.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.directory))
            self.active = True

    def after(self, step: int, outputs) -> None:
        """Step `step` has been dispatched; `outputs` are its results."""
        if self.active and step >= self.start + self.steps - 1:
            jax.block_until_ready(outputs)
            self.close()
            log.info(
                "profile: steps %d-%d traced in %s (per op: python -m bench.profile --trace %s "
                "--steps %d)",
                self.start,
                step,
                self.directory,
                self.directory,
                step - self.start + 1,
            )

    def close(self) -> None:
        if self.active:
            jax.profiler.stop_trace()
            self.active = False

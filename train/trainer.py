"""The training loop, shared by both models: read top to bottom.

    state = init or restore  ->  for step: batch -> jitted step (donated state) -> log one step
    late -> eval / checkpoint when due  ->  final eval + checkpoint

Nothing in the loop waits on the device except evaluation and checkpointing (both by design);
metrics of step N are converted to floats after step N+1 is dispatched (train/metrics.py).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time

import jax
import numpy as np
from etils import epath
from omegaconf import OmegaConf

from train import step as step_lib
from train.checkpoint import Checkpointer
from train.config import ConfigError
from train.flops import peak_flops
from train.metrics import MetricLogger
from train.trm_task import enable_x64_if_needed

log = logging.getLogger(__name__)


def run_dir_of(cfg) -> epath.Path:
    """<run.out_dir>/<run.name>: a local path or a bucket URL (gs://...), through etils.epath."""
    return epath.Path(cfg.run.out_dir) / cfg.run.name


def train(cfg, mesh) -> dict:
    """Runs (or resumes) the experiment `cfg` on `mesh`; returns the last logged metrics."""
    started = time.perf_counter()
    run_dir = run_dir_of(cfg)
    enable_x64_if_needed(cfg)  # TRM: upstream's stablemax loss runs in float64
    task = step_lib.make_task(cfg, mesh)
    config_dict = OmegaConf.to_container(cfg, resolve=True)
    if jax.process_index() == 0:  # only process 0 writes files outside Orbax
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))

    ckpt = Checkpointer(run_dir / "checkpoints", cfg.checkpoint)
    data_iter = task.train_iterator()
    step, meta = 0, {}
    latest = ckpt.latest_step() if cfg.run.resume else None
    if latest is not None:
        check_resumable(cfg, ckpt.read_meta(latest), f"{run_dir} step {latest}")
        abstract = step_lib.with_shardings(task.abstract_state, task.state_shardings)
        state, meta = ckpt.restore(latest, abstract, data_iter)
        step = int(meta["step"])
        log.info("resumed %s from step %d", run_dir, step)
    else:
        state = task.create_state()
        if cfg.trainer.init_from not in ("", "scratch"):
            state = task.import_weights(state, cfg.trainer.init_from)
    step_fn = step_lib.jit_train_step(task)

    t = cfg.trainer
    total = task.total_steps
    stop = min(total, t.max_steps) if t.max_steps else total
    eval_every = getattr(task, "eval_interval_steps", 0) or t.eval_interval
    ckpt_every = cfg.checkpoint.interval
    logger = MetricLogger(run_dir, cfg, cfg.run.name, config_dict, stop)
    n_dev = mesh.devices.size
    peak = peak_flops() * n_dev
    best = meta.get("best")
    last = {}

    def do_eval(at_step):
        nonlocal best, last
        metrics = task.evaluate(state, at_step)
        if metrics:
            logger.write_now(at_step, metrics)
            key = cfg.checkpoint.best_metric
            if key in metrics:
                better = best is None or (
                    metrics[key] < best
                    if cfg.checkpoint.best_mode == "min"
                    else metrics[key] > best
                )
                best = metrics[key] if better else best
            last = {**last, **metrics}
        return metrics

    def do_save(at_step, metrics=None):
        if not cfg.checkpoint.enabled:
            return
        numeric = {k: v for k, v in (metrics or {}).items() if isinstance(v, float | int)}
        ckpt.save(
            at_step,
            state,
            data_iter,
            meta={"step": at_step, "best": best, "resume": resume_settings(cfg)},
            metrics=numeric or None,
            force=True,
        )
        logger.sync()  # metrics up to a checkpoint survive with it (gs://: one rewrite)

    if t.eval_at_start and step == 0:
        do_eval(0)
    # Step time is averaged over each logging window: with async dispatch the host runs ahead of
    # the device, and only the device_get of the previous window's metrics paces it.
    saved_at = step
    window, compiled, previous = (time.perf_counter(), step), False, None
    with jax.set_mesh(mesh):
        while step < stop:
            try:
                local = next(data_iter)
            except StopIteration:  # TRM: upstream's epochs / eval_interval iterations are done
                break
            batch = task.to_global(local)
            state, metrics = step_fn(state, batch)  # async dispatch: returns before it finishes
            step += 1
            # One step late: wait for step N-1 while step N is queued, so the device never idles
            # and the host never runs more than one step ahead (bounded memory, honest timings).
            if previous is not None:
                jax.block_until_ready(previous)
            done = (time.perf_counter(), step - 1)  # step N-1 has now finished
            previous = metrics
            if window[1] == step - 1 and not compiled:
                jax.block_until_ready(metrics)  # once: keep compile time out of step time
                window, compiled = (time.perf_counter(), step), True
                # What the compilation cache shortens (docs/training.md, "Compilation cache").
                log.info(
                    "first step done %.1f s after the trainer started (init + compile + 1 step)",
                    window[0] - started,
                )
            if step % t.log_interval == 0 or step == stop:
                host = {}
                if done[1] > window[1]:  # average over the steps finished since the last log
                    dt = (done[0] - window[0]) / (done[1] - window[1])
                    window = done
                    host = {
                        "step_time_ms": 1e3 * dt,
                        f"{task.items_name}_per_s": task.items_per_step / dt,
                        "mfu": task.flops_per_step / dt / peak,
                    }
                logger.push(step, {f"train/{k}": v for k, v in metrics.items()}, host)
            if hasattr(task, "eval_due"):  # TRM: at the end of each upstream iteration
                eval_due = task.eval_due(data_iter)
            else:
                eval_due = bool(eval_every) and step % eval_every == 0
            evaled = do_eval(step) if eval_due or step == stop else None
            if (ckpt_every and step % ckpt_every == 0) or eval_due or step == stop:
                do_save(step, evaled)
                saved_at = step
            if step == _SIGKILL_AT:
                _sigkill_self(ckpt, logger)
            if evaled is not None or (ckpt_every and step % ckpt_every == 0):
                window = (time.perf_counter(), step)  # eval/checkpoint time is not step time
        if saved_at != step:  # the data ran out before `stop` (TRM drops partial batches)
            do_save(step, do_eval(step))
        logger.flush()
    ckpt.close()
    logger.close()
    if jax.process_index() == 0:
        (run_dir / "final.json").write_text(json.dumps({"step": step, **_jsonable(last)}))
    return {"step": step, **last}


# Settings a checkpoint only makes sense with: the saved state has the batch in it (TRM's ACT carry
# is [global_batch, ...]) and the data position counts global batches of a seeded plan.
RESUME_KEYS = ("trainer.global_batch_size", "trainer.gradient_accumulation_steps", "run.seed")


def resume_settings(cfg) -> dict:
    return {k: OmegaConf.select(cfg, k) for k in RESUME_KEYS}


def check_resumable(cfg, meta: dict, where: str) -> None:
    """ConfigError when this run changed a setting the checkpoint depends on.

    Without it the failure surfaces deep inside the restore (the data iterator refusing its state,
    or a carry shape mismatch); a changed batch size between a run and its rerun is an easy mistake
    (docs/training.md, trap "resume with another batch size").
    """
    saved = meta.get("resume") or {}  # checkpoints written before this check have none
    now = resume_settings(cfg)
    diff = [
        f"{k}={saved[k]!r} (this run: {now[k]!r})" for k in now if k in saved and saved[k] != now[k]
    ]
    if diff:
        raise ConfigError(
            f"cannot resume {where}: it was written with {', '.join(diff)}; the saved state and "
            "data position depend on these. Rerun with the saved values, or start a new run "
            "(another run.name)"
        )


# Test hook (the kill-and-resume tests in tests/test_train_gpt.py and tests/test_train_trm.py):
# the process kills ITSELF with SIGKILL at this step, i.e. no clean exit, no atexit handlers, no
# final checkpoint; only already-committed checkpoints survive.
_SIGKILL_AT = int(os.environ.get("TRAIN_TEST_SIGKILL_AT_STEP", "-1"))


def _sigkill_self(ckpt, logger):
    ckpt.wait()  # let the in-flight async save commit, so the test knows which step resumes
    logger.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _jsonable(d):
    return {k: (float(v) if isinstance(v, np.floating | float) else v) for k, v in d.items()}

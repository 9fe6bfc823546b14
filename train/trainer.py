"""The training loop, shared by every model family: read top to bottom.

    state = init or restore  ->  for step: stop requested? save + exit -> batch -> jitted step
    (donated state) -> log one step late -> eval / checkpoint when due  ->  final eval + checkpoint

The loop reaches a model family only through the hooks of train/task.py. Nothing in the loop
waits on the device except evaluation and checkpointing (both by design); metrics of step N are
converted to floats after step N+1 is dispatched (train/metrics.py).
"""

from __future__ import annotations

import json
import logging
import math
import pickle
import sys
import time

import jax
import numpy as np
from etils import epath
from omegaconf import OmegaConf

from train import families, gcs, memory, rundir
from train import jit as jit_lib
from train import mesh as mesh_lib
from train.checkpoint import Checkpointer
from train.errors import ConfigError, disk_full_names, one_line
from train.flops import peak_flops
from train.goodput import Goodput, summary
from train.metrics import MetricLogger, dumps, read_jsonl, write_text_atomic
from train.nonfinite import NonfiniteGuard
from train.preemption import Preempted, Preemption
from train.profiling import StepProfiler

log = logging.getLogger(__name__)


def run_dir_of(cfg) -> epath.Path:
    """<run.out_dir>/<run.name>: a local path or a bucket URL (gs://...), through etils.epath."""
    return epath.Path(cfg.run.out_dir) / cfg.run.name


def train(cfg, mesh) -> dict:
    """Runs (or resumes) the experiment `cfg` on `mesh`; returns the last logged metrics.

    Raises train.nonfinite.NonfiniteError when a step's loss or gradient norm is not finite and
    trainer.on_nonfinite=stop (checkpoints up to the last good step are committed first),
    train.preemption.Preempted after a SIGTERM / SIGINT, once the step reached is committed,
    train.errors.DiskFullError when a write runs out of space (the last committed checkpoint is
    kept), and ConfigError when another trainer is writing the run directory (train/rundir.py)."""
    gcs.require(cfg.run.out_dir, "run.out_dir")  # before the lease is claimed there
    run_dir, goodput, clock = run_dir_of(cfg), Goodput(), StepClock()
    # from the start: a signal during startup stops cleanly; the run directory is claimed
    # before anything in it is read or written
    with Preemption() as preemption, rundir.claim(run_dir, cfg.run.lease_ttl_s) as claim:
        with goodput.measure("startup"):
            task, ckpt, data_iter, state, step, meta = _start(cfg, mesh, run_dir)
        stop = min(task.total_steps, cfg.trainer.max_steps or task.total_steps)
        if step >= stop:  # a finished run started again: nothing to do, its results stay
            ckpt.close()
            return _already_finished(run_dir, step)
        if step:
            goodput.resumed(meta.get("goodput"), _steps_logged_after(run_dir, step))
        log.info(
            "run directory %s: config.yaml, metrics.jsonl, final.json; checkpoints in %s",
            run_dir,
            ckpt.directory,
        )
        step_fn = jit_lib.jit_train_step(task)
        config_dict = OmegaConf.to_container(cfg, resolve=True)
        logger = MetricLogger(
            run_dir, cfg, cfg.run.name, config_dict, stop, task.console_metrics, step
        )
        loop = _Loop(cfg, task, ckpt, logger, data_iter, step, meta, goodput, preemption, claim)
        loop.profiler = StepProfiler(cfg, run_dir)
        peak = peak_flops() * mesh.devices.size
        first = step
        try:
            with jax.set_mesh(mesh):
                state, step = _loop(loop, state, step, stop, step_fn, clock, peak)
        finally:  # also on NonfiniteError / Preempted: commit the checkpoints, write the metrics
            loop.profiler.close()  # a window the run did not reach the end of
            with goodput.measure("checkpoint"):
                _close(ckpt.close, logger.close)
        if step == first and first > 0:  # TRM: the restored data iterator had no batch left
            return _already_finished(run_dir, step)
        totals = goodput.totals()
        final = {"step": step, **_jsonable(loop.last), **loop.guard.final(), "goodput": totals}
        if jax.process_index() == 0:
            write_text_atomic(run_dir / "final.json", dumps(final))
        log.info("%s", summary_line(cfg, run_dir, ckpt, step, loop.best, loop.best_step))
        log.info("time: %s", summary(totals))
        return {"step": step, **loop.last}


def _start(cfg, mesh, run_dir):
    """Everything before the first step: checks, the task, config.yaml, the checkpointer, the
    data iterator and the state (restored, or new) -> (task, ckpt, data_iter, state, step, meta)."""
    batch = {"trainer.global_batch_size": int(cfg.trainer.global_batch_size)}
    mesh_lib.check_batch_divisible(mesh, cfg.mesh.rules, batch)  # not JAX's sharding error
    _check_init_from(cfg)
    task = families.make_task(cfg, mesh)  # refuses float64 on a TPU; x64 on when needed
    memory.check_state_fits(task)  # an absurd size: one line now, not XLA's after compiling
    task.validate_data()  # a broken split or vocab fails here, not at the first evaluation
    ckpt = Checkpointer(run_dir / "checkpoints", cfg.checkpoint)
    try:
        data_iter = task.train_iterator()
        state, step, meta = _init_or_restore(cfg, task, ckpt, data_iter, run_dir)
        # after make_task (it holds the sizes the data set gave) and after the resume checks (a
        # refused resume leaves the run's config.yaml as its checkpoints were written with)
        _write_config(cfg, run_dir)
    except BaseException:
        ckpt.close()  # an open manager left to the interpreter's exit floods the log
        raise
    return task, ckpt, data_iter, state, step, meta


def _close(*closers) -> None:
    """Runs every closer. With an exception already in flight (a failed save, a full disk, a
    preemption) their errors are logged, not raised: the first error is the one reported."""
    failing = sys.exc_info()[1] is not None
    if failing and gcs.unreachable(sys.exc_info()[1]):  # a bucket that stopped answering: a save
        return  # in flight would retry its writes for minutes, and nothing more can be written
    first = None
    for close in closers:
        try:
            close()
        except Exception as e:
            if failing:
                log.debug("while closing after an error: %s", one_line(e))
            elif first is None:
                first = e
    if first is not None:
        raise first


def _steps_logged_after(run_dir, step: int) -> int:
    """Steps the previous process logged after the checkpoint `step` it is resumed from: they are
    trained again (0 after a preemption, which saves the step it reached)."""
    path = run_dir / "metrics.jsonl"
    if jax.process_index() != 0 or not path.exists():
        return 0
    logged = [r["step"] for r in read_jsonl(path) if any(k.startswith("train/") for k in r)]
    return max([s - step for s in logged if s > step], default=0)


def _already_finished(run_dir, step: int) -> dict:
    """A run directory whose checkpoint is already at the end: final.json is left as it is."""
    log.warning(
        "%s already finished at step %d (final.json kept); raise trainer.total_steps, "
        "trainer.max_steps or the family's schedule to continue it, or use another run.name",
        run_dir,
        step,
    )
    path = run_dir / "final.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    return {**saved, "step": step}


def summary_line(cfg, run_dir, ckpt, step: int, best, best_step) -> str:
    """The run's last log line: steps, the best metric and its step, where the results are."""
    key = cfg.checkpoint.best_metric
    best_text = (
        f"best {key}={best:.6g} at step {best_step}"
        if key and best is not None
        else f"no {key or 'checkpoint.best_metric'} value"
    )
    where = ckpt.directory if cfg.checkpoint.enabled else "none (checkpoint.enabled=false)"
    return (
        f"done: {step} steps, {best_text}; checkpoints: {where}; summary: {run_dir / 'final.json'}"
    )


def _loop(loop, state, step: int, stop: int, step_fn, clock, peak: float):
    """Steps until `stop` (or the data ends): -> (state, step). Evaluates and saves when due;
    saves and raises Preempted when a stop is requested."""
    cfg, task, data_iter = loop.cfg, loop.task, loop.data_iter
    if cfg.trainer.eval_at_start and step == 0:
        loop.evaluate(state, 0)
    clock.start(step)
    unlogged = None  # the metrics of the last step when they were not logged
    while step < stop:
        if loop.claim is not None:
            loop.claim.check()  # a bucket's lease taken over by another trainer stops this one
        loop.ckpt.check()  # a save that failed in the background (a full disk) stops the run
        if loop.preemption.due(step):  # every process agrees on this step
            loop.preempt(state, step, unlogged)
        loop.profiler.before(step + 1, state)
        with loop.goodput.measure("data"):
            local = next(data_iter, None)
            batch = None if local is None else task.to_global(local)
        if batch is None:  # TRM: upstream's epochs / eval_interval iterations are done
            break
        step += 1
        phase = "steps" if clock.compiled else "compile"  # the first step of a process compiles
        with loop.goodput.measure(phase):
            state, metrics = step_fn(state, batch)  # dispatched: it runs while the host goes on
            clock.dispatched(step, metrics)  # waits for step - 1 (the first step: for itself)
        loop.goodput.steps_timed += phase == "steps"
        loop.profiler.after(step, (state, metrics))
        loop.guard.watch(step, metrics)  # acts on step - 1's nonfinite flag (already computed)
        unlogged = metrics
        if _log_due(cfg, step, stop):
            device = {f"train/{k}": v for k, v in metrics.items()}
            host = {**_throughput(task, clock.lap(), peak), **loop.guard.host_metrics()}
            loop.logger.push(step, device, host)
            unlogged = None
        evaluate, save = _due(cfg, task, step, stop, data_iter)
        if save:
            loop.checkpoint(state, step, evaluate)
            clock.start(step)  # eval and checkpoint time is not step time
    if loop.saved_at != step:  # the data ran out before `stop` (TRM drops partial batches)
        loop.checkpoint(state, step, evaluate=True)
    loop.guard.check_pending()
    loop.logger.flush()
    return state, step


def _write_config(cfg, run_dir) -> None:
    if jax.process_index() == 0:  # only process 0 writes files outside Orbax
        with disk_full_names(run_dir):
            run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))


def _init_or_restore(cfg, task, ckpt, data_iter, run_dir):
    """-> (state, step, meta: best metric so far, skipped steps): the latest checkpoint of the run
    directory (the data iterator restored in place), else a new state (+ trainer.init_from)."""
    abstract = jit_lib.with_shardings(task.abstract_state, task.state_shardings)
    found = None
    if cfg.run.resume:  # the newest step that restores; damaged newer ones are moved aside
        written = _saved_config(run_dir)
        check = lambda meta, step: check_resumable(  # noqa: E731
            cfg, task, meta, f"{run_dir} from step {step}", written
        )
        found = ckpt.restore_newest(abstract, data_iter, check)
    init_from = cfg.trainer.init_from
    if found is None:
        state = task.create_state()
        if init_from not in ("", "scratch"):
            state = _import(task, state, init_from)
        return state, 0, {}
    _, state, meta = found
    log.info("resumed %s from step %d", run_dir, int(meta["step"]))
    if init_from not in ("", "scratch"):
        log.warning(
            "trainer.init_from=%s was NOT imported: resuming %s from its own checkpoint at step "
            "%d (run.resume=false or another run.name starts from init_from)",
            init_from,
            run_dir,
            int(meta["step"]),
        )
    return state, int(meta["step"]), meta


def _import(task, state, path: str):
    """task.import_weights, its failures one line naming trainer.init_from (the file exists:
    _check_init_from; a wrong format, shapes that do not fit the model, or a reader this
    environment lacks, torch for a .pt file, fail here)."""
    try:
        return task.import_weights(state, path)
    except (
        OSError, ValueError, KeyError, TypeError, RuntimeError, ImportError, pickle.UnpicklingError
    ) as e:  # fmt: skip
        reason = one_line(e)
        raise ConfigError(f"trainer.init_from={path!r}: cannot import it: {reason}") from e


def _check_init_from(cfg) -> None:
    path = cfg.trainer.init_from
    if path in ("", "scratch"):
        return
    gcs.require(path, "trainer.init_from")
    if not epath.Path(path).exists():
        raise ConfigError(f"trainer.init_from={path!r}: no such file (a checkpoint to import)")


def _log_due(cfg, step: int, stop: int) -> bool:
    return step % cfg.trainer.log_interval == 0 or step == stop


def _due(cfg, task, step: int, stop: int, data_iter) -> tuple[bool, bool]:
    """(evaluate, save) after `step`: evaluate when the task says so (Task.eval_due) and at the
    end; save then too, and every checkpoint.interval steps."""
    evaluate = step == stop or task.eval_due(step, data_iter)
    every = cfg.checkpoint.interval
    return evaluate, evaluate or (bool(every) and step % every == 0)


def _throughput(task, seconds_per_step: float | None, peak: float) -> dict:
    """Host metrics of a logging window (none when no step finished since the last one)."""
    if seconds_per_step is None:
        return {}
    return {
        "step_time_ms": 1e3 * seconds_per_step,
        f"{task.items_name}_per_s": task.items_per_step / seconds_per_step,
        "mfu": task.flops_per_step / seconds_per_step / peak,
    }


class StepClock:
    """Seconds per step, averaged over each logging window and measured one step late.

    With async dispatch the host runs ahead of the device. Waiting for step N-1 while step N is
    queued keeps the device busy and the host at most one step ahead (bounded memory, honest
    timings). The first step is waited for once, so compile time stays out of step time.
    """

    def __init__(self):
        self.started = time.perf_counter()  # the trainer's start: the first-step log line
        self.window = (self.started, 0)  # (time, step) the current window starts at
        self.done = self.window  # (time, step) of the last step known to have finished
        self.compiled = False
        self.previous = None  # metrics of the last dispatched step

    def start(self, step: int) -> None:
        """A new window from now (after init, and after each eval / checkpoint)."""
        self.window = (time.perf_counter(), step)

    def dispatched(self, step: int, metrics) -> None:
        """Step `step` is queued: wait for step - 1 (one step late)."""
        if self.previous is not None:
            jax.block_until_ready(self.previous)
        self.done = (time.perf_counter(), step - 1)
        self.previous = metrics
        if not self.compiled and self.window[1] == step - 1:
            jax.block_until_ready(metrics)  # once: keep compile time out of step time
            self.compiled = True
            self.start(step)
            # What the compilation cache shortens (docs/training.md, "Compilation cache").
            log.info(
                "first step done %.1f s after the trainer started (init + compile + 1 step)",
                self.window[0] - self.started,
            )

    def lap(self) -> float | None:
        """Seconds per step over the steps finished since the window started (None if none
        did); the next window starts where this one ended."""
        (t0, s0), (t1, s1) = self.window, self.done
        if s1 <= s0:
            return None
        self.window = self.done
        return (t1 - t0) / (s1 - s0)


class _Loop:
    """What the loop's evaluations and checkpoints share: the task, the checkpointer, the logger,
    the data iterator (saved with the state) and the results so far."""

    def __init__(self, cfg, task, ckpt, logger, data_iter, step, meta, goodput, preemption, claim):  # fmt: skip
        self.cfg, self.task, self.data_iter = cfg, task, data_iter
        self.ckpt, self.logger = ckpt, logger
        self.goodput, self.preemption, self.claim = goodput, preemption, claim
        self.best = meta.get("best")  # best value of checkpoint.best_metric so far (checkpointed)
        self.best_metric_missing = False  # warned that no evaluation metric has that name
        self.best_step = meta.get("best_step")  # its step (checkpointed with it)
        self.last = {}  # the last value of every eval metric (returned, final.json)
        self.saved_at = step  # the last step saved (or restored)
        skipped = meta.get("nonfinite_skipped", 0)
        self.guard = NonfiniteGuard(cfg.trainer.on_nonfinite, self.last_good, skipped)

    def last_good(self) -> str:
        """The newest committed checkpoint (the stop message names it)."""
        if not self.cfg.checkpoint.enabled:
            return "none (checkpoint.enabled=false)"
        self.ckpt.wait()  # an async save in flight commits first
        latest = self.ckpt.latest_step()
        if latest is None:
            return f"none in {self.ckpt.directory} (no checkpoint was saved yet)"
        return f"{self.ckpt.directory / str(latest)} (step {latest})"

    def checkpoint(self, state, step: int, evaluate: bool) -> None:
        """Evaluate (when due) and save step `step`, once its nonfinite flag is known to be clear
        (trainer.on_nonfinite=stop raises here instead; skip: the state is the last good one)."""
        self.guard.check_pending()
        self.save(state, step, self.evaluate(state, step) if evaluate else None)

    def preempt(self, state, step: int, unlogged=None):
        """Logs `step`'s metrics (`unlogged`, when its step was no logging step), saves it
        (unless it is saved already), waits until it is committed, and raises Preempted. A step
        with a non-finite flag is never saved: stop mode raises here."""
        if unlogged is not None:
            self.logger.push(step, {f"train/{k}": v for k, v in unlogged.items()})
        self.guard.check_pending()
        if self.saved_at != step:
            self.save(state, step)
        self.logger.flush()
        with self.goodput.measure("checkpoint"):
            self.ckpt.wait()
        if not self.cfg.checkpoint.enabled:
            raise Preempted(step, None, "nothing saved (checkpoint.enabled=false)")
        latest = self.ckpt.latest_step()
        if latest is None:
            raise Preempted(step, None, "nothing trained yet, nothing saved")
        raise Preempted(step, str(self.ckpt.directory / str(latest)))

    def evaluate(self, state, step: int) -> dict:
        with self.goodput.measure("eval"):
            metrics = self.task.evaluate(state, step)
        if metrics:
            self.logger.write_now(step, metrics)
            key = self.cfg.checkpoint.best_metric
            if key and key not in metrics and not self.best_metric_missing:
                self.best_metric_missing = True  # said once, at the first evaluation
                log.warning(
                    "checkpoint.best_metric=%r is not one of this run's evaluation metrics (%s): "
                    "no checkpoint is kept as the best",
                    key,
                    ", ".join(sorted(metrics)),
                )
            best = _best(self.cfg.checkpoint, self.best, metrics)
            if best is not None and best != self.best:
                self.best_step = step
            self.best = best
            self.last = {**self.last, **metrics}
        return metrics

    def save(self, state, step: int, metrics: dict | None = None) -> None:
        self.saved_at = step
        if not self.cfg.checkpoint.enabled:
            return
        numeric = {
            k: v
            for k, v in (metrics or {}).items()
            if isinstance(v, float | int) and math.isfinite(v)  # Orbax writes them as JSON
        }
        meta = {
            "step": step,
            "best": self.best,
            "best_step": self.best_step,
            "resume": resume_settings(self.cfg, self.task),
            "nonfinite_skipped": self.guard.skipped,
            "goodput": self.goodput.totals(),  # a resumed run adds to these
        }
        with self.goodput.measure("checkpoint"):
            self.ckpt.save(
                step, state, self.data_iter, meta=meta, metrics=numeric or None, force=True
            )
        # metrics up to a checkpoint survive with it, its own step's included (gs://: one rewrite)
        self.logger.flush()


def _best(ckpt_cfg, best, metrics: dict):
    """The best value of checkpoint.best_metric after `metrics` (best_mode: min or max)."""
    key = ckpt_cfg.best_metric
    if key not in metrics or not math.isfinite(metrics[key]):  # a NaN eval is never the best
        return best
    if best is None:
        return metrics[key]
    return min(best, metrics[key]) if ckpt_cfg.best_mode == "min" else max(best, metrics[key])


# Settings a checkpoint only makes sense with: the saved state has the batch in it (TRM's ACT carry
# is [global_batch, ...]) and the data position counts global batches of a seeded plan. Besides
# these, every model.* key and the family's own (Task.resume_keys, Task.resume_free_keys).
RESUME_KEYS = ("trainer.global_batch_size", "run.seed")


def resume_settings(cfg, task) -> dict:
    """The settings a checkpoint of `task` depends on (dotted key -> value), saved in its meta."""
    model = OmegaConf.to_container(cfg.model, resolve=True) if "model" in cfg else {}
    keys = [*RESUME_KEYS, *task.resume_keys, *(f"model.{k}" for k in model or {})]
    return {k: OmegaConf.select(cfg, k) for k in keys if k not in task.resume_free_keys}


def _saved_config(run_dir):
    """The run's config.yaml (None when there is none, or it does not parse)."""
    path = run_dir / "config.yaml"
    try:
        return OmegaConf.create(path.read_text()) if path.exists() else None
    except Exception:  # a damaged config.yaml: the checkpoint's own record still decides
        return None


def check_resumable(cfg, task, meta: dict, where: str, written=None) -> None:
    """ConfigError naming every setting this run changed that the checkpoint depends on (model
    fields, an optimizer switch that shapes the state, batch, data layout), with both values.

    The checkpoint's meta records them; for a key it lacks, the run's config.yaml (`written`)
    stands in. Without this check the failure surfaces deep inside the restore (a tree-structure
    or shape mismatch, the data iterator refusing its state, a carry shape mismatch) and reads
    like damage (docs/training.md, "A changed model read as a damaged checkpoint")."""
    # a checkpoint of an older version names a family's moved knob by its old key
    moved = task.moved_keys
    former = {new: old for old, new in moved.items()}
    recorded = {moved.get(k, k): v for k, v in (meta.get("resume") or {}).items()}
    now = resume_settings(cfg, task)
    diff = []
    for key, value in now.items():
        if key in recorded:
            saved = recorded[key]
        elif written is not None and _select(written, key, former) is not None:
            saved = _select(written, key, former)
        else:
            continue
        if saved != value:
            diff.append(f"{key}={saved!r} (this run: {value!r})")
    if diff:
        raise ConfigError(
            f"cannot resume {where}: it was written with {', '.join(diff)}; the saved state and "
            "data position depend on these. Rerun with the saved values, or start a new run "
            "(another run.name)"
        )


def _select(written, key: str, former: dict):
    """`key` of a saved config.yaml, or its former key there (an older version's)."""
    value = OmegaConf.select(written, key, default=None)
    if value is None and key in former:
        value = OmegaConf.select(written, former[key], default=None)
    return value


def _jsonable(d):
    return {k: (float(v) if isinstance(v, np.floating | float) else v) for k, v in d.items()}

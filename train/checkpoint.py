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

import gc
import logging
import math
import os
import stat
import sys
import time
import traceback
import warnings
from contextlib import contextmanager, nullcontext, suppress

import grain
import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as cm

from train.errors import ConfigError, DiskFullError, is_disk_full, one_line
from train.metrics import is_local
from train.task import sync_processes

log = logging.getLogger(__name__)

# Orbax's and Grain's small files of a step (JSON): far below this; larger means damage
_METADATA_LIMIT = 64 << 20


def _forget_bucket_listings(directory) -> None:
    """gcsfs keeps the folder listings it read; a reader of a live run must see the steps written
    since (an in-flight step's empty meta/ listed once reads as "not found" ever after)."""
    if is_local(str(directory)):
        return
    with suppress(ImportError):
        import gcsfs

        for fs in list(gcsfs.GCSFileSystem._cache.values()):  # every client etils made
            fs.invalidate_cache()


def _vanished(e: BaseException) -> bool:
    """Whether `e` (or its cause) says a file or directory is not there (any more)."""
    while e is not None:
        if isinstance(e, FileNotFoundError) or "NOT_FOUND" in str(e):
            return True
        e = e.__cause__
    return False


def _is_metadata(name: str) -> bool:
    return name in ("metadata", "_CHECKPOINT_METADATA", "_METADATA") or name.endswith(".json")


# What Orbax logs of a live trainer's step that is still being written (or removed): no news to a
# reader, which reads only committed steps
_IN_FLIGHT = ("Metadata file does not exist", "Failed to read Metadata file")

# How often a reader lists the steps again when a live trainer removed the one it was reading
_RELISTS = 5


def _has_grain_state(it) -> bool:
    return it is not None and hasattr(it, "get_state") and hasattr(it, "set_state")


class Checkpointer:
    """Thin wrapper with a v1-shaped surface: save(step, state, data_iter), restore(...)."""

    def __init__(self, directory: str, ckpt_cfg, *, read_only: bool = False):
        # Local or a bucket URL (gs://...): Orbax takes either as an epath.Path.
        self.directory = epath.Path(directory)
        if is_local(directory):
            self.directory = self.directory.resolve()
        self.ckpt_cfg = ckpt_cfg
        # A reader (train.evaluate / sample / export) of a run that may be training right now:
        # it creates, cleans, moves and deletes nothing there, so a live trainer's in-flight save
        # (its *.orbax-checkpoint-tmp directory) is never touched. Only the trainer writes.
        self.read_only = read_only
        self.in_flight = None  # the step an async save is writing, until it is known to be done
        self.failed = None  # the DiskFullError of a failed save: nothing more is saved
        # Orbax's threads log a failed write with its traceback, several times; the trainer
        # reports a full disk in one line of its own (DiskFullError), so those records are
        # dropped while this checkpointer is open, and for good once a save failed.
        self._quiet = _DropDiskFullRecords()
        self._quiet.install()
        # while a save is in flight, and after one failed; one count of what both dropped
        self._closed_loop = _ClosedLoopReports(self._quiet.dropped)
        if not read_only:
            self._refuse_linked_steps()
        try:
            self.manager = self._while_steps_vanish(self._make_manager)
        except Exception as e:  # Orbax reads every step's metadata here: a damaged one can raise
            self._quiet.remove()
            raise ConfigError(
                f"cannot open the checkpoints in {self.directory}: {_why(e)}. Move the "
                "damaged step directories out of it, or start a new run (another run.name)"
            ) from e

    def _while_steps_vanish(self, open_steps):
        """`open_steps()` (which lists the steps and reads their metadata); a reader tries again
        when a step it listed was removed meanwhile by the run's live trainer (keep_last)."""
        for attempt in range(_RELISTS):
            try:
                return open_steps()
            except Exception as e:
                if not (self.read_only and _vanished(e)) or attempt + 1 == _RELISTS:
                    raise
                time.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")

    def _make_manager(self):
        if self.read_only:
            _forget_bucket_listings(self.directory)
            # what was asked (read_only), and a live trainer's step whose metadata it has not
            # written yet: no news to a reader
            with _absl_dropped("Given directory is read only", *_IN_FLIGHT):
                return ocp.CheckpointManager(
                    self.directory,
                    item_names=("state", "data", "meta"),
                    item_handlers=self._handlers(),
                    options=ocp.CheckpointManagerOptions(
                        read_only=True,
                        create=False,
                        cleanup_tmp_directories=False,
                        save_interval_steps=0,
                    ),
                )
        ckpt_cfg = self.ckpt_cfg
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
        return ocp.CheckpointManager(
            self.directory,
            item_names=("state", "data", "meta"),
            item_handlers=self._handlers(),
            options=ocp.CheckpointManagerOptions(
                enable_async_checkpointing=bool(ckpt_cfg.async_save),
                preservation_policy=cm.preservation_policy.AnyPreservationPolicy(policies),
                cleanup_tmp_directories=True,
            ),
        )

    def _refuse_linked_steps(self) -> None:
        """ConfigError when a step directory is a symbolic link: the trainer deletes old steps
        (checkpoint.keep_last), and neither deletes through a link nor its target."""
        if not is_local(str(self.directory)) or not self.directory.is_dir():
            return
        for entry in os.scandir(self.directory):
            if entry.name.isdigit() and entry.is_symlink():
                raise ConfigError(
                    f"{entry.path} is a symbolic link (to {os.readlink(entry.path)}); the trainer "
                    "removes old checkpoint steps and does not remove through a link: put the "
                    "step directory itself there, or start a new run (another run.name)"
                )

    def _check_step_files(self, step: int) -> None:
        """OSError (damage) when a file of the step directory is not a regular file (a link to
        a device, a pipe), or its small metadata files are larger than any this writes: read,
        they would never end."""
        root = self.directory / str(step)
        if not is_local(str(root)):
            return
        for folder, _, files in os.walk(root):
            for name in files:
                path = os.path.join(folder, name)
                info = os.stat(path)
                if not stat.S_ISREG(info.st_mode):
                    raise OSError(f"{path} is not a regular file")
                if _is_metadata(name) and info.st_size > _METADATA_LIMIT:
                    raise OSError(
                        f"{path} holds {info.st_size} bytes; a checkpoint's metadata file holds "
                        f"less than {_METADATA_LIMIT}"
                    )

    @staticmethod
    def _handlers() -> dict:
        return {
            "state": ocp.StandardCheckpointHandler(),
            "data": grain.checkpoint.CheckpointHandler(),
            "meta": ocp.JsonCheckpointHandler(),
        }

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def restore_newest(self, abstract_state, data_iter=None, check_meta=None, *, steps=None):
        """-> (step, state, meta) of the NEWEST checkpoint that restores, or None when there is
        none. A newer step that fails (a truncated, zero-filled or missing file) is reported in
        one warning line; the trainer (not `read_only`), which saves again, moves it aside to
        `damaged-<step>` next to the steps: nothing is deleted, and the saves that follow (the
        same step numbers again) do not collide with it. A reader leaves it where it is, and a
        step that a live trainer removes while it is being read (its `keep_last`) is no damage:
        the reader lists the steps again and reads the newest. `check_meta(meta, step)` may raise
        ConfigError (a changed setting): that is not damage, it propagates. `steps`: the ones to
        try (default every saved step). ConfigError when steps exist but none restores."""
        asked = steps
        for attempt in range(_RELISTS):
            if attempt:
                self._while_steps_vanish(self._reload)  # the steps on disk now
            listed = self.manager.all_steps() if asked is None else asked
            todo = sorted((s for s in listed if self._committed(s)), reverse=True)
            found, damaged, removed = self._restore_first(
                todo, abstract_state, data_iter, check_meta
            )
            if not todo and listed:  # a live trainer's first step, still being written
                removed = [min(listed)]
                time.sleep(0.1 * (attempt + 1))
            if not removed or found is not None:
                break
            log.info(
                "checkpoint step %s of %s was removed by its live trainer while being read; "
                "reading the newest again", ", ".join(map(str, removed)), self.directory.parent,
            )  # fmt: skip
            if asked is not None:  # --step N: nothing else to read
                raise ConfigError(
                    f"checkpoint step {removed[0]} in {self.directory} was removed by the run's "
                    f"trainer while it was being read (checkpoint.keep_last); steps now: "
                    f"{sorted(self.manager.all_steps())}"
                )
        if found is not None:
            if not self.read_only:
                self._move_aside(damaged)
            return found
        if self.read_only and not damaged and listed:
            raise ConfigError(
                f"no checkpoint in {self.directory} is committed yet (step "
                f"{', '.join(map(str, sorted(listed)))} is still being written by its trainer)"
            )
        if damaged and self.read_only:  # nothing to move, the warnings say why
            raise ConfigError(
                f"no checkpoint of {', '.join(map(str, damaged))} in {self.directory} restores "
                "(damaged; the warning above says why)"
            )
        if damaged:
            raise ConfigError(
                f"no checkpoint in {self.directory} restores (damaged steps: "
                f"{', '.join(map(str, damaged))}; the warnings above say why). Move the damaged "
                "step directories out of it to start over in this run directory, or start a new "
                "run (another run.name)"
            )
        return None

    def _committed(self, step: int) -> bool:
        """Whether `step` is a whole checkpoint to a reader: locally its directory (Orbax renames
        a step into place once written); in a bucket, where Orbax writes a step in place and
        deletes it object by object, its directory with its commit marker."""
        root = self.directory / str(step)
        if not self.read_only or is_local(str(self.directory)):
            return not self.read_only or root.exists()
        return (root / "commit_success.txt").exists()

    def _superseded(self, step: int) -> bool:
        """A reader's step that failed to read: whether its live trainer has removed it, or is
        removing it (a bucket deletes a step object by object), having committed a newer one."""
        if not self._committed(step):
            return True
        _forget_bucket_listings(self.directory)
        try:  # the folder's own listing: Orbax's reads every step's metadata, a removed one too
            listed = [int(p.name) for p in self.directory.iterdir() if p.name.isdigit()]
        except OSError:
            return False
        return any(s > step and self._committed(s) for s in listed)

    def _reload(self) -> None:
        _forget_bucket_listings(self.directory)
        with _absl_dropped(*_IN_FLIGHT):
            self.manager.reload()

    def _restore_first(self, steps, abstract_state, data_iter, check_meta):
        """-> ((step, state, meta) of the first of `steps` that restores, or None; the damaged
        steps tried before it; the steps that disappeared while being read)."""
        damaged, removed, failed = [], [], []  # failed: any read that failed (quiet its reports)
        # from before the first read: a failing one reports at once
        quiet = _abandoned_reads_dropped(lambda: bool(failed)) if steps else nullcontext()
        with quiet:
            for step in steps:
                try:
                    meta = self.read_meta(step)
                    if check_meta is not None:
                        check_meta(meta, step)
                    state, meta = self.restore(step, abstract_state, data_iter)
                except ConfigError:
                    raise
                except Exception as e:
                    failed.append(step)
                    if self.read_only and self._superseded(step):
                        removed.append(step)  # a live trainer's keep_last: list them again
                        return None, damaged, removed
                    self._not_damage(e, step)
                    log.warning(
                        "checkpoint step %d in %s is damaged (%s); trying the previous one",
                        step, self.directory, _why(e),
                    )  # fmt: skip
                    damaged.append(step)
                else:
                    return (step, state, meta), damaged, removed
        return None, damaged, removed

    def _not_damage(self, e: BaseException, step: int) -> None:
        """ConfigError when `e` says intact files hold another model's state (not damage; nothing
        is moved): a reader's config.yaml and overrides, or a trainer's changed settings."""
        if not _does_not_fit(e):
            return
        if self.read_only:
            raise ConfigError(
                f"{self.directory / str(step)} does not restore onto the model of its run's "
                f"config.yaml and the command's overrides ({_why(e, limit=200)})"
            ) from e
        raise ConfigError(
            f"cannot resume {self.directory.parent} from step {step}: its saved state does not "
            f"fit this run's ({_why(e, limit=200)}); a setting that shapes the model or "
            "optimizer changed since it was written (its config.yaml has the old values). Rerun "
            "with the saved values, or start a new run (another run.name)"
        ) from e

    def _move_aside(self, steps) -> None:
        """Renames damaged step directories to damaged-<step> (process 0), then reopens the
        manager so that it no longer lists them."""
        if not steps:
            return
        if jax.process_index() == 0:
            for step in steps:
                src, dst = self.directory / str(step), self.directory / f"damaged-{step}"
                n = 1
                while dst.exists():  # damaged twice at the same step: keep both
                    dst, n = self.directory / f"damaged-{step}.{n}", n + 1
                src.rename(dst)
                log.warning("moved the damaged checkpoint step %d aside to %s", step, dst)
        sync_processes("checkpoint_move_damaged")
        self.manager.close()
        self.manager = self._make_manager()

    def save(self, step: int, state, data_iter=None, meta=None, metrics=None, force=False):
        """Starts saving `step` (async: it commits in the background). DiskFullError when this
        save, or the one before it, ran out of space (see `check`)."""
        self.check()
        items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta or {})}
        if _has_grain_state(data_iter):
            items["data"] = grain.checkpoint.CheckpointSave(data_iter)
        self._closed_loop.install()
        with self._disk_full_is_one_error(step):
            saved = self.manager.save(
                step, args=ocp.args.Composite(**items), metrics=metrics, force=force
            )
            self.in_flight = step
            if not self.ckpt_cfg.async_save:
                self.in_flight = None
                self._closed_loop.remove()
        return saved

    def check(self) -> None:
        """Raises the DiskFullError of a save that failed in the background, once it is known
        (cheap: the trainer calls it every step; nothing waits on a save in progress)."""
        if self.failed is not None:
            raise self.failed
        if self.in_flight is None or self.manager.is_saving_in_progress():
            return
        self.wait()  # the save is done: this returns at once, raising what it failed with

    @contextmanager
    def _disk_full_is_one_error(self, step: int):
        """A save that fails for want of space becomes one DiskFullError naming the step, the
        directory, its free space and the last committed step; the half-written step is
        removed. Nothing is saved after it."""
        try:
            yield
        except Exception as e:
            if not is_disk_full(e):
                raise
            self._abandon(step)
            # The failed write's frames hold Orbax's other pending write futures: cleared, they
            # are collected (and report, quietly) when close() settles, not when the process
            # exits after the error line.
            _clear_frames(e)
            raise self.failed from e

    def _abandon(self, step: int) -> None:
        with suppress(Exception):  # the other writes of that save fail the same way
            self.manager.wait_until_finished()
        # what those writes report from now on, whatever the error, is about the abandoned step
        self._quiet.abandoned = f"{self.directory}/{step}.orbax-checkpoint-tmp"
        _let_abandoned_reads_finish(self._quiet.dropped, quiet_rounds=5)
        _remove_tmp_dirs(self.directory)
        latest = self.manager.latest_step()
        kept = f"step {latest}" if latest is not None else "none"
        self.failed = DiskFullError(
            self.directory,
            f"checkpoint {'step ' + str(step) if step is not None else ''} to {self.directory}",
            f"; the last committed checkpoint ({kept}) is kept and the partial one removed",
        )

    def read_meta(self, step: int) -> dict:
        """Only the small meta item of a step (checked before the state is restored)."""
        self._check_step_files(step)
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
            data_dir = self.directory / str(step) / "data"
            if (data_dir / own_file).exists():
                items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
            elif data_dir.exists() and not list(data_dir.glob("process_*.json")):
                raise FileNotFoundError(f"{data_dir / own_file} is missing (no iterator state)")
            else:
                log.warning("checkpoint %d has no data state for %s: data restarts", step, own_file)
        restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        return restored["state"], restored["meta"]

    def wait(self):
        if self.failed is not None:
            raise self.failed
        with self._disk_full_is_one_error(self.in_flight):
            self.manager.wait_until_finished()
        self.in_flight = None
        self._closed_loop.remove()  # the save committed: no write of it is left to complete

    def close(self):
        """Waits for the save in flight (DiskFullError if it failed) and closes the manager."""
        try:
            self.wait()
        finally:
            with suppress(Exception) if self.failed else nullcontext():
                self.manager.close()
            if self.failed:
                # The failed save's other writes complete, and are collected, at any moment up to
                # the process's exit (on a loaded machine, after the error line): the two filters
                # stay, dropping only their reports. What they wrote meanwhile is removed.
                _let_abandoned_reads_finish(self._quiet.dropped, quiet_rounds=5)
                _remove_tmp_dirs(self.directory)
            else:
                self._closed_loop.remove()
                self._quiet.remove()


@contextmanager
def _absl_dropped(*prefixes: str):
    """Inside it, Orbax's (absl's) log records that start with one of `prefixes` are dropped."""

    def keep(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(prefixes)

    absl = logging.getLogger("absl")
    absl.addFilter(keep)
    try:
        yield
    finally:
        absl.removeFilter(keep)


@contextmanager
def _abandoned_reads_dropped(settle):
    """Keeps a failed restore to its one warning line, for the duration of the resume.

    A restore that fails on one array leaves Orbax's reads of the other arrays pending: Orbax runs
    them on a private event loop and closes it without cancelling them (it avoids asyncio.run's
    teardown). TensorStore still completes each read later, into the closed loop ("Event loop is
    closed", from TensorStore's threads); when the garbage collector finalizes the pending reads
    each re-raises with its TensorStore spec, asyncio logs each future's "exception was never
    retrieved", and reads that never started warn "was never awaited": thousands of lines in a
    process that goes on (a notebook, a test session). Inside this context exactly those reports
    are dropped (an unraisable hook wrapping the one installed, an asyncio log filter, a warning
    filter); any other unraisable error, warning or log record passes through. When `settle()`
    says a read failed, the exit first lets the abandoned reads finish and collects them (until
    no report arrived for one round), then puts the hook, filter and warning filter back as they
    were and keeps a guard against the same reports for the rest of the process
    (`_keep_dropping_abandoned_reads`): on a loaded machine a read can still complete after the
    round that looked quiet, and be finalized at exit. Tests:
    tests/test_train_damaged_checkpoint.py::test_no_checkpoint_restores_prints_nothing_after_its_error,
    tests/test_evaluate.py::test_a_reshaping_override_is_one_line_on_a_loaded_machine."""
    previous, dropped, failed = sys.unraisablehook, [0], False
    hook = _dropping_abandoned_reads(previous, dropped)

    asyncio_log = logging.getLogger("asyncio")
    sys.unraisablehook = hook
    asyncio_log.addFilter(_not_an_abandoned_read)
    try:
        with warnings.catch_warnings():
            # reads that never started: "coroutine ... was never awaited" when collected
            warnings.filterwarnings("ignore", "coroutine '_read_array", RuntimeWarning)
            try:
                yield
            finally:
                failed = settle()
                if failed:
                    _let_abandoned_reads_finish(dropped)
    finally:
        asyncio_log.removeFilter(_not_an_abandoned_read)
        if sys.unraisablehook is hook:  # else someone installed another since: keep theirs
            sys.unraisablehook = previous
        if failed:  # also when the failure propagates (a misfit's ConfigError)
            _keep_dropping_abandoned_reads()


def _dropping_abandoned_reads(previous, dropped: list):
    """An unraisable hook that counts a pending Orbax read's report in `dropped` and passes every
    other report to `previous`."""

    def hook(unraisable):
        code = getattr(unraisable.object, "cr_code", None)
        orbax_read = code is not None and "orbax" in code.co_filename
        if orbax_read or _into_a_closed_loop(unraisable):
            dropped[0] += 1
        else:
            previous(unraisable)

    hook.drops_abandoned_reads = True
    return hook


def _keep_dropping_abandoned_reads() -> None:
    """After a failed restore, for the rest of the process: the reads it abandoned stay quiet
    whenever they complete or are finalized (at exit, the usual moment on a loaded machine), as a
    failed save's writes do (`_ClosedLoopReports`, `_DropDiskFullRecords`). Only those reports
    are dropped; installed once, over whatever hook is current."""
    if not getattr(sys.unraisablehook, "drops_abandoned_reads", False):
        sys.unraisablehook = _dropping_abandoned_reads(sys.unraisablehook, [0])
    logging.getLogger("asyncio").addFilter(_not_an_abandoned_read)  # once: a filter is a set
    warnings.filterwarnings("ignore", "coroutine '_read_array", RuntimeWarning)


def _into_a_closed_loop(unraisable) -> bool:
    """TensorStore's report of an operation that completed after Orbax closed its event loop."""
    return unraisable.object is None and "Event loop is closed" in str(unraisable.exc_value)


def _clear_frames(e: BaseException | None) -> None:
    """Drops the local variables of the finished frames in `e`'s traceback and its causes'."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        e = e.__cause__ or e.__context__


def _let_abandoned_reads_finish(dropped: list, rounds: int = 50, quiet_rounds: int = 1) -> None:
    """Collects the abandoned reads (or writes) until `quiet_rounds` rounds in a row (gc, 0.1 s,
    gc) bring no new report (TensorStore completes them in its threads within milliseconds on an
    idle machine; at most `rounds` rounds)."""
    quiet = 0
    for _ in range(rounds):
        before = dropped[0]
        gc.collect()
        time.sleep(0.1)
        gc.collect()
        quiet = quiet + 1 if dropped[0] == before else 0
        if quiet >= quiet_rounds:
            return


def _not_an_abandoned_read(record: logging.LogRecord) -> bool:
    if "exception was never retrieved" not in record.getMessage() or not record.exc_info:
        return True
    tb = record.exc_info[2]
    while tb is not None:
        if "orbax" in tb.tb_frame.f_code.co_filename:
            return False
        tb = tb.tb_next
    return "TensorStore" not in str(record.exc_info[1]) and "OCDBT" not in str(record.exc_info[1])


def _why(e: BaseException, limit: int = 300) -> str:
    """`Type: message` on one line, for the damage warnings and errors."""
    return f"{type(e).__name__}: {one_line(e, limit=limit)}"


# What Orbax says when intact files hold another state than the one asked for (a changed model or
# optimizer): the saved tree has other keys, or an array another shape. Not damage.
_MISFIT_TEXTS = (
    "tree structures do not match",
    "Requested shape",
    "does not match the shape",
    "shape mismatch",
)


def _does_not_fit(e: BaseException) -> bool:
    return any(t in str(e) for t in _MISFIT_TEXTS)


def _remove_tmp_dirs(directory) -> None:
    """Removes the temporary directories of an abandoned save (process 0; Orbax names them
    `<step>.orbax-checkpoint-tmp*`)."""
    if jax.process_index() != 0:
        return
    for tmp in directory.glob("*.orbax-checkpoint-tmp*"):
        with suppress(OSError):
            tmp.rmtree() if tmp.is_dir() else tmp.unlink()


class _ClosedLoopReports:
    """Drops TensorStore's reports of writes that complete after Orbax closed its event loop.

    Orbax runs a save's writes on a private event loop. When one write fails (a full disk), the
    save ends and the loop is closed while the other writes are still running; TensorStore then
    completes each into the closed loop, and each prints an unraisable RuntimeError "Event loop is
    closed" (no object, a two-frame traceback) from TensorStore's threads, at any moment after
    the failure. Installed while a save is in flight, and for good once one failed, the hook
    drops exactly those reports; any other unraisable error reaches the hook
    that was installed before. Test: tests/test_train_run_faults.py::
    test_a_full_disk_stops_at_the_failed_save_and_the_same_command_resumes (docs/training.md,
    "A full disk")."""

    def __init__(self, dropped: list):
        self.previous = None
        self.dropped = dropped  # [count], shared with the record filter

    def _hook(self, unraisable):
        if _into_a_closed_loop(unraisable):
            self.dropped[0] += 1
        else:
            self.previous(unraisable)

    def install(self) -> None:
        if self.previous is None:
            self.previous = sys.unraisablehook
            sys.unraisablehook = self._hook

    def remove(self) -> None:
        if self.previous is None:
            return
        if sys.unraisablehook == self._hook:  # else someone installed another since: keep theirs
            sys.unraisablehook = self.previous
        self.previous = None


class _DropDiskFullRecords(logging.Filter):
    """Drops the log records (message or traceback) of a write that failed on a full disk, from
    Orbax's threads (absl) and from its abandoned write tasks (asyncio), while installed."""

    LOGGERS = ("absl", "asyncio")

    def __init__(self):
        super().__init__()
        self.dropped = [0]
        self.abandoned = None  # the temporary directory of a failed save

    def install(self):
        for name in self.LOGGERS:
            logging.getLogger(name).addFilter(self)

    def remove(self):
        for name in self.LOGGERS:
            logging.getLogger(name).removeFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        about_abandoned = self.abandoned is not None and (
            self.abandoned in record.getMessage() or self.abandoned in str(exc)
        )
        if about_abandoned or is_disk_full(_RecordText(record)) or is_disk_full(exc):
            self.dropped[0] += 1
            return False
        return True


class _RecordText(Exception):
    def __init__(self, record: logging.LogRecord):
        super().__init__(record.getMessage())

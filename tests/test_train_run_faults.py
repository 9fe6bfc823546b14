"""Faults a run directory meets on a pod, each one line that loses nothing (docs/training.md, "One
writer per run directory", "A changed config", "A full disk"):

- two writers: a trainer claims its run directory (a flock locally, a lease object in a bucket);
  a second one stops before touching anything, naming the first; a claim whose owner died is
  taken over with one warning; `launch.tpu run` refuses with the same line;
- a changed config on resume: every differing key that shapes the saved state or the data
  position, with both values, before any restore; config.yaml and the checkpoints untouched;
  "damaged" only for damaged files (tests/test_train_damaged_checkpoint.py);
- a full disk: one `error:` line naming the path and its free space, exit status 74, the last
  committed checkpoint kept, the partial one removed, and the same command resumes.

The lease's storage here is an in-memory object with Cloud Storage's generation preconditions (no
bucket can be reached from a test); the flock, Orbax, the trainer and the tmpfs are the real ones.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import pytest

from launch import tpu as tpu_launch
from launch.local import run_processes
from tests.helpers import REPO, build_tiny_text, logged_steps, tiny_gpt_overrides
from train import rundir
from train.checkpoint import Checkpointer
from train.compose import load_config
from train.errors import ConfigError, DiskFullError, is_disk_full
from train.families import make_task
from train.mesh import make_mesh
from train.metrics import JsonlFile, read_jsonl, write_text_atomic
from train.trainer import resume_settings, train


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    return build_tiny_text(str(tmp_path_factory.mktemp("synthetic_char")))


def _tree(root) -> dict[str, tuple[int, int]]:
    """path -> (size, mtime_ns) of every file under `root`: what "untouched" means."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            st = os.stat(os.path.join(dirpath, f))
            out[os.path.relpath(os.path.join(dirpath, f), root)] = (st.st_size, st.st_mtime_ns)
    return out


def _one_device(cfg):
    return make_mesh(cfg.mesh, devices=jax.devices()[:1])


def _saved_run(text_dir, out, overrides=(), meta_resume=True):
    """A run directory as a 4-step run leaves it (config.yaml, a checkpoint at step 4), written
    with the trainer's own Checkpointer and meta from the initial state: no step is compiled."""
    base = tiny_gpt_overrides(text_dir, out, "r", steps=8)
    cfg = load_config([*base, *overrides])
    task = make_task(cfg, _one_device(cfg))
    run_dir = os.path.join(out, "r")
    ckpt = Checkpointer(os.path.join(run_dir, "checkpoints"), cfg.checkpoint)
    meta = {"step": 4, "best": None, "best_step": None}
    if meta_resume:
        meta["resume"] = resume_settings(cfg, task)
    ckpt.save(4, task.create_state(), task.train_iterator(), meta=meta, force=True)
    ckpt.close()
    from omegaconf import OmegaConf

    with open(os.path.join(run_dir, "config.yaml"), "w") as f:
        f.write(OmegaConf.to_yaml(cfg, resolve=True))
    return base, run_dir


# --- one writer ----------------------------------------------------------------------------


def test_a_second_writer_stops_before_touching_anything(text_dir, tmp_path):
    """A claim held on the run directory (as a running trainer holds it): train() raises the
    one line naming its host, pid and start, and no file of the run directory changes."""
    base, run_dir = _saved_run(text_dir, str(tmp_path))
    held = rundir.LocalClaim(run_dir)
    held.acquire()
    try:
        before = _tree(run_dir)
        cfg = load_config(base)
        with pytest.raises(ConfigError) as e:
            train(cfg, _one_device(cfg))
        msg = str(e.value)
        assert "\n" not in msg
        assert msg.startswith(f"run directory {run_dir} is being written by another trainer "), msg
        assert f"pid {os.getpid()}, since " in msg and "use another run.name" in msg, msg
        assert _tree(run_dir) == before
        # the read-only probe (launch.tpu runs it) gives the same line
        probe = subprocess.run(
            [sys.executable, "-m", "train.rundir", "check", run_dir],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert probe.returncode == 1 and probe.stderr.strip() == f"error: {msg}", probe.stderr
    finally:
        held.release()
    free = subprocess.run(
        [sys.executable, "-m", "train.rundir", "check", run_dir],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert free.returncode == 0 and not free.stderr, free.stderr
    assert free.stdout.strip() == f"{run_dir}: free (no live trainer holds it)"
    absent = subprocess.run(
        [sys.executable, "-m", "train.rundir", "check", run_dir + "-nope"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert absent.returncode == 3 and "no such run directory" in absent.stdout, absent


def test_a_run_that_stops_before_writing_leaves_no_run_directory(tmp_path):
    """A run whose data check fails after it claimed its new run directory (data.path holds no
    data set and no builder): one ConfigError line, and no runs/<name>/ with a stale writer.lock
    left behind; a directory that existed before keeps its lock file (emptied)."""
    empty = tmp_path / "no_data"
    empty.mkdir()
    overrides = [*tiny_gpt_overrides(str(empty), str(tmp_path / "runs"), "r"), "data.build=null"]
    cfg = load_config(overrides)
    with pytest.raises(ConfigError, match="data.path"):
        train(cfg, _one_device(cfg))
    assert not (tmp_path / "runs" / "r").exists(), os.listdir(tmp_path / "runs")
    (tmp_path / "runs" / "r").mkdir(parents=True)
    with pytest.raises(ConfigError, match="data.path"):
        train(cfg, _one_device(cfg))
    assert os.listdir(tmp_path / "runs" / "r") == [rundir.LOCK_FILE]
    assert (tmp_path / "runs" / "r" / rundir.LOCK_FILE).read_text() == ""


@pytest.mark.parametrize(
    "out_dir, name, why",
    [("file", "r", "a file is on its path"), ("runs", "file", "it is a file")],
)
def test_a_run_directory_that_is_a_file_is_one_line(tmp_path, out_dir, name, why):
    """run.out_dir or run.name naming a file: one ConfigError line naming the run directory and
    the keys, before anything is written; the file stays as it was."""
    (tmp_path / "runs").mkdir()
    mine = tmp_path / "file" if out_dir == "file" else tmp_path / "runs" / "file"
    mine.write_text("mine")
    cfg = load_config(tiny_gpt_overrides(str(tmp_path / "data"), str(tmp_path / out_dir), name))
    run_dir = tmp_path / out_dir / name
    with pytest.raises(ConfigError, match=f"run directory {run_dir} .run.out_dir / run.name. "
                       f"cannot be made: {why}$"):  # fmt: skip
        train(cfg, _one_device(cfg))
    assert mine.read_text() == "mine"


def test_launch_tpu_run_refuses_a_claimed_run_directory_with_the_same_line(tmp_path, monkeypatch):
    """launch.tpu's run script (run here with bash; code dir = this checkout) checks the claim
    before it starts anything: a held run directory is the trainer's own line, exit 1, no
    trainer started (no pid file)."""
    monkeypatch.setattr(tpu_launch, "REMOTE_DIR", REPO)
    monkeypatch.setattr(tpu_launch, "REMOTE_VENV", sys.prefix)
    monkeypatch.setattr(tpu_launch, "REMOTE_LOGS", str(tmp_path / "logs"))
    out = str(tmp_path / "runs")
    held = rundir.LocalClaim(os.path.join(out, "run"))
    held.acquire()
    try:
        script = tpu_launch.run_script(
            run_name="run", overrides=["+experiment=x", "run.name=run", f"run.out_dir={out}"]
        )
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
        expected = rundir.busy_error(os.path.join(out, "run"), held.owner())
    finally:
        held.release()
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == f"error: {expected}", done.stderr
    assert not list((tmp_path / "logs" / "run").glob("*.pid"))


def test_a_claim_whose_owner_was_killed_is_taken_over_with_one_warning(tmp_path, caplog):
    """A process that claimed the directory is killed with SIGKILL: the kernel drops its flock,
    the next claim succeeds and warns once, naming the dead owner."""
    run_dir = str(tmp_path / "r")
    code = (
        "import os, signal, sys; from train.rundir import LocalClaim; "
        f"LocalClaim({run_dir!r}).acquire(); print(os.getpid(), flush=True); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL
    dead = int(proc.stdout.strip())
    caplog.set_level(logging.WARNING)
    claim = rundir.LocalClaim(run_dir)
    claim.acquire()
    claim.release()
    warned = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
    assert len(warned) == 1 and f"pid {dead}," in warned[0], warned
    assert open(os.path.join(run_dir, rundir.LOCK_FILE)).read() == ""  # released cleanly
    caplog.clear()
    rundir.LocalClaim(run_dir).acquire()  # a clean release is not a takeover
    assert not [r for r in caplog.records if "took over" in r.getMessage()]


class _Bucket:
    """One object with Cloud Storage's generation preconditions, in memory: write / delete with
    `generation` succeed only when the object is at that generation (0: absent)."""

    def __init__(self):
        self.text, self.generation, self.lock = None, 0, threading.Lock()

    def read(self):
        with self.lock:
            return self.text, self.generation

    def write(self, text, generation):
        with self.lock:
            if generation != self.generation:
                raise rundir.Conflict("lease")
            self.text, self.generation = text, self.generation + 1
            return self.generation

    def delete(self, generation):
        with self.lock:
            if generation != self.generation or self.text is None:
                raise rundir.Conflict("lease")
            self.text, self.generation = None, 0


def test_a_lease_refuses_a_second_writer_and_expires_with_its_owner(caplog):
    """gs:// run directories: the lease is renewed by the heartbeat (a second trainer is refused
    while it lives, however long); an owner that stops renewing loses it after ttl_s, the next
    trainer takes it over with one warning, and the stalled owner's next renewal is refused, so
    its check() stops it. A clean release deletes the lease."""
    bucket, ttl = _Bucket(), 0.4
    first = rundir.LeaseClaim("gs://b/runs/r", store=bucket, ttl_s=ttl)
    first.acquire()
    time.sleep(2 * ttl)  # renewed meanwhile: still held
    with pytest.raises(ConfigError, match=r"being written by another trainer \(host .*, pid "):
        rundir.LeaseClaim("gs://b/runs/r", store=bucket, ttl_s=ttl).acquire()
    first._stop.set()  # the owner stalls: no more renewals (a hung or killed job)
    first._thread.join()
    first._stop.clear()
    time.sleep(ttl * 1.2)
    caplog.set_level(logging.WARNING)
    second = rundir.LeaseClaim("gs://b/runs/r", store=bucket, ttl_s=ttl)
    second.acquire()
    warned = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
    assert len(warned) == 1 and "stopped renewing its lease" in warned[0], warned
    first._thread = threading.Thread(target=first._heartbeat)  # the owner wakes up
    first._thread.start()
    first._thread.join(timeout=5 * ttl)
    with pytest.raises(rundir.LostClaim, match="took over its lease"):
        first.check()
    first.release()  # does not delete the lease it lost
    assert bucket.text is not None
    second.check()
    second.release()
    assert bucket.text is None


# --- a changed config -----------------------------------------------------------------------


def test_a_changed_model_names_every_key_and_touches_nothing(text_dir, tmp_path, caplog):
    """Resuming a 2-layer run with 3 layers and another width: one line with both keys and both
    values, raised before the restore; config.yaml and the checkpoint are left as they were and
    nothing is called damaged. A free key (dropout) is not compared."""
    base, run_dir = _saved_run(text_dir, str(tmp_path))
    before = _tree(run_dir)
    cfg = load_config([*base, "model.n_layer=3", "model.n_embd=64", "model.dropout=0.0"])
    caplog.set_level(logging.WARNING)
    with pytest.raises(ConfigError) as e:
        train(cfg, _one_device(cfg))
    msg = str(e.value)
    assert msg == (
        f"cannot resume {run_dir} from step 4: it was written with model.n_layer=2 (this run: "
        "3), model.n_embd=32 (this run: 64); the saved state and data position depend on these. "
        "Rerun with the saved values, or start a new run (another run.name)"
    ), msg
    assert not [r for r in caplog.records if "damaged" in r.getMessage()]
    assert {k: v for k, v in _tree(run_dir).items() if k != rundir.LOCK_FILE} == before


def test_a_checkpoint_without_the_record_is_checked_against_config_yaml(text_dir, tmp_path):
    """A checkpoint whose meta does not record the model keys: the run's config.yaml stands in."""
    base, run_dir = _saved_run(text_dir, str(tmp_path), meta_resume=False)
    cfg = load_config([*base, "model.n_head=4"])
    with pytest.raises(ConfigError, match=r"written with model.n_head=2 \(this run: 4\)"):
        train(cfg, _one_device(cfg))


def test_a_state_that_does_not_fit_is_not_called_damaged(text_dir, tmp_path, caplog):
    """Neither the checkpoint nor config.yaml records the changed key: Orbax's tree-structure
    mismatch is reported as a state that does not fit (not damage), and nothing is moved."""
    base, run_dir = _saved_run(text_dir, str(tmp_path), meta_resume=False)
    os.remove(os.path.join(run_dir, "config.yaml"))
    before = _tree(run_dir)
    cfg = load_config([*base, "model.n_layer=3"])
    caplog.set_level(logging.WARNING)
    with pytest.raises(ConfigError) as e:
        train(cfg, _one_device(cfg))
    msg = str(e.value)
    assert msg.startswith(f"cannot resume {run_dir} from step 4: its saved state does not fit"), msg
    assert "a setting that shapes the model or optimizer changed" in msg, msg
    assert not [r for r in caplog.records if "damaged" in r.getMessage()]
    assert {k: v for k, v in _tree(run_dir).items() if k != rundir.LOCK_FILE} == before


# --- a full disk ----------------------------------------------------------------------------

# What Orbax raised when a checkpoint write found a 12 MiB tmpfs full (orbax-checkpoint 0.12.8).
_ORBAX_ENOSPC = (
    'RESOURCE_EXHAUSTED: Error writing "1.step.value/0" in OCDBT database at local file '
    '"/tmp/t/r/checkpoints/100.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/ocdbt.process_0/"'
    ': Failed writing: "/tmp/t/r/checkpoints/100.orbax-checkpoint-tmp/d/83f4": Failed to write '
    "432161 bytes to file 18: No space left on device [os_error_code='28']"
)


def test_a_full_disk_is_recognised_in_every_form():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(ValueError(_ORBAX_ENOSPC))
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = ValueError(_ORBAX_ENOSPC)
    assert is_disk_full(wrapped)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(ValueError("RESOURCE_EXHAUSTED: Out of memory"))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_metrics_on_a_full_disk_raise_one_error_and_keep_whole_lines(tmp_path):
    """/dev/full answers every write with ENOSPC: metrics.jsonl behind it raises DiskFullError
    naming the file; a file write cut short leaves no half line; write_text_atomic leaves the
    previous file whole."""
    jsonl = tmp_path / "metrics.jsonl"
    os.symlink("/dev/full", jsonl)
    f = JsonlFile(str(jsonl))
    with pytest.raises(DiskFullError) as e:
        f.write({"step": 1})
    assert str(e.value).startswith(f"disk full: cannot write {jsonl} (")
    assert "free on " in str(e.value) and "run the same command again" in str(e.value)
    f.close()
    config = tmp_path / "config.yaml"
    config.write_text("model: {n_layer: 2}\n")
    os.symlink("/dev/full", tmp_path / ".config.yaml.tmp")
    with pytest.raises(DiskFullError, match="cannot write .*config.yaml"):
        write_text_atomic(config, "model: {n_layer: 3}\n")
    assert config.read_text() == "model: {n_layer: 2}\n"


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_run_whose_metrics_hit_a_full_disk_stops_with_one_error(text_dir, tmp_path):
    """The trainer's own write of metrics.jsonl fails (a symlink to /dev/full): train() raises
    DiskFullError naming the file, after closing the checkpointer (nothing left in flight)."""
    out = str(tmp_path)
    run_dir = os.path.join(out, "r")
    os.makedirs(run_dir)
    os.symlink("/dev/full", os.path.join(run_dir, "metrics.jsonl"))
    cfg = load_config(tiny_gpt_overrides(text_dir, out, "r", steps=4))
    with pytest.raises(DiskFullError, match=r"^disk full: cannot write .*metrics.jsonl \("):
        train(cfg, _one_device(cfg))
    assert not os.path.exists(os.path.join(run_dir, "final.json"))


def _mount_tmpfs(path, size: str) -> str | None:
    """Mounts a tmpfs of `size` at `path`; None, or why it cannot (not root, no mount)."""
    if os.geteuid() != 0:
        return "needs root to mount a tmpfs"
    if shutil.which("mount") is None:
        return "no mount command"
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True
    )
    return None if done.returncode == 0 else f"cannot mount a tmpfs: {done.stderr.decode()}"


@pytest.mark.slow
def test_a_full_disk_stops_at_the_failed_save_and_the_same_command_resumes(text_dir, tmp_path):
    """The run directory on a tmpfs too small for its second checkpoint (real Orbax, real
    ENOSPC): `python -m train.main` stops at the failed save with one error line naming the
    checkpoint, the directory and its free space, exit status 74, no traceback; the first
    checkpoint is intact and the partial one removed. With space back, the same command resumes
    from the first checkpoint and finishes."""
    mnt = str(tmp_path / "disk")
    why = _mount_tmpfs(mnt, "3m")
    if why:
        pytest.skip(why)
    try:
        args = [
            *tiny_gpt_overrides(text_dir, mnt, "r", steps=40),
            "model.n_embd=64",  # ~1.3 MiB a checkpoint (params + Adam moments)
            "checkpoint.interval=10",
            "checkpoint.keep_last=3",
        ]
        cmd = [sys.executable, "-m", "train.main", *args]
        first = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
        run_dir = os.path.join(mnt, "r")
        assert first.returncode == 74, first.stdout[-2000:] + first.stderr[-3000:]
        err_lines = first.stderr.strip().splitlines()
        assert "Traceback" not in first.stdout + first.stderr, first.stderr[-3000:]
        last = err_lines[-1]
        ckpt_dir = os.path.join(run_dir, "checkpoints")
        kept = sorted(int(s) for s in os.listdir(ckpt_dir) if s.isdigit())
        assert kept, os.listdir(ckpt_dir)
        free = last.split(" (")[1].split(")")[0]
        if "checkpoint step " in last:
            failed = int(last.split("checkpoint step ")[1].split()[0])
            assert last == (
                f"error: disk full: cannot write checkpoint step {failed} to {ckpt_dir} ({free}); "
                f"the last committed checkpoint (step {kept[-1]}) is kept and the partial one "
                "removed. Free some space, then run the same command again"
            ), last
        else:  # on a loaded machine a step's metrics line can meet the disk that the save filled
            # before the save reports its failure: the same one error, naming that file
            failed = None
            metrics = os.path.join(run_dir, "metrics.jsonl")
            assert last == (
                f"error: disk full: cannot write {metrics} ({free}). Free some space, then run "
                "the same command again"
            ), last
        assert "free on " + mnt in last, last
        assert [e for e in err_lines if e.startswith("error:")] == [last]
        assert sorted(os.listdir(ckpt_dir)) == [str(s) for s in kept]  # no *.orbax-checkpoint-tmp
        logged = logged_steps(run_dir)
        assert logged and max(logged) <= 40 and (failed is None or failed <= max(logged) + 1)
        subprocess.run(["mount", "-o", "remount,size=64m", mnt], check=True)
        again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stderr[-3000:]
        assert f"resumed {run_dir} from step {kept[-1]}" in again.stderr
        final = json.loads(open(os.path.join(run_dir, "final.json")).read())
        assert final["step"] == 40
        steps = [r["step"] for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl"))]
        assert set(range(1, 41)) <= set(steps)
    finally:
        subprocess.run(["umount", "-l", mnt], capture_output=True)


@pytest.mark.slow
def test_two_trainers_on_one_run_directory(text_dir, tmp_path):
    """The second `python -m train.main` on a run directory the first is writing stops before
    touching anything, one line naming the first's pid; the first runs to its end and logs every
    step once."""
    out = str(tmp_path)
    args = [*tiny_gpt_overrides(text_dir, out, "r", steps=60), "checkpoint.interval=20"]
    cmd = [sys.executable, "-m", "train.main", *args]
    first = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    run_dir = os.path.join(out, "r")
    deadline = time.monotonic() + 300
    while not logged_steps(run_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    # The first is paused while the second starts: with warm compilation caches it could otherwise
    # finish its 60 steps before the second is up, and the second would find a free directory.
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    first_out = first.communicate(timeout=600)[0].decode()
    assert first.returncode == 0, first_out[-3000:]
    assert second.returncode == 1
    line = second.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: run directory {run_dir} is being written by another "), line
    assert f"pid {first.pid}, since " in line, line
    assert logged_steps(run_dir) == list(range(1, 61))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_claim_through_process_0_and_stop_together(text_dir, tmp_path):
    """On several processes only process 0 claims; when it cannot, every process stops with one
    line (process 0's names the other writer) instead of waiting in a collective."""
    out = str(tmp_path)
    run_dir = os.path.join(out, "r")
    held = rundir.LocalClaim(run_dir)
    held.acquire()
    try:
        args = tiny_gpt_overrides(text_dir, out, "r", steps=4)
        status, results = run_processes(
            [sys.executable, "-m", "train.main", *args], processes=2, cpu_devices=1,
            platform="cpu", timeout=300, cwd=REPO, echo=False,
        )  # fmt: skip
        expected = rundir.busy_error(run_dir, held.owner())
    finally:
        held.release()
    assert [rc for rc, _ in results] == [1, 1], results
    last = [o.strip().splitlines()[-1] for _, o in results]
    assert last[0] == f"error: {expected}", last
    assert last[1] == f"error: process 0 could not claim {run_dir} (its log says why)", last

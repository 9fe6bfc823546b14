"""A SIGTERM or SIGINT, at whatever moment it comes, costs nothing: the trainer finishes the step
in flight, saves the step it reached (model, optimizer, dropout RNG, data iterator; TRM: carry,
EMA, both optimizers), waits for the commit, prints one line and exits with status 75; the
relaunch continues the loss curve EXACTLY, no step trained twice, none skipped. Two processes
agree on one step when only one of them is signalled, and `launch.tpu stop` (its remote script,
run here with bash) ends in that saved step."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from launch import local
from launch import tpu as tpu_launch
from parity.compare import EXACT, assert_close
from tests.helpers import (
    REPO,
    build_tiny_sudoku,
    build_tiny_text,
    logged_steps,
    run_and_signal,
    tiny_gpt_overrides,
    tiny_trm_overrides,
)
from train.metrics import read_jsonl
from train.preemption import EXIT_PREEMPTED

STEPS = 40


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    return build_tiny_text(str(tmp_path_factory.mktemp("synthetic_char")))


@pytest.fixture(scope="module")
def straight(text_dir, tmp_path_factory):
    """The uninterrupted run every preempted one is compared with: (run dir, overrides maker)."""
    out = str(tmp_path_factory.mktemp("straight"))

    def args(out_dir, name, *extra):
        return tiny_gpt_overrides(text_dir, out_dir, name, steps=STEPS) + [*extra]

    rc, log = run_and_signal(args(out, "run"), when=None)
    assert rc == 0, log[-3000:]
    return os.path.join(out, "run"), args


def _curve(run_dir, key="train/loss"):
    c = {}
    for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl")):
        if key in r:
            c.setdefault(r["step"], []).append(r[key])
    return c


def _preempted_at(rc: int, log: str, run_dir: str) -> int:
    """The one line, the exit status, the committed checkpoint of the step reached, and the
    metrics of exactly the steps trained: -> that step."""
    assert rc == EXIT_PREEMPTED, f"exit {rc}\n{log[-3000:]}"
    last = log.strip().splitlines()[-1]
    m = re.fullmatch(r"preempted at step (\d+): checkpoint (\S+) committed; run the same command "
                     r"again to resume", last)  # fmt: skip
    assert m, last
    step = int(m.group(1))
    assert m.group(2) == os.path.join(os.path.realpath(run_dir), "checkpoints", str(step))
    assert os.path.isfile(os.path.join(m.group(2), "_CHECKPOINT_METADATA"))
    assert logged_steps(run_dir) == list(range(1, step + 1))  # each step once, up to the stop
    return step


def _resume_matches(args, run_dir, straight_dir, step: int):
    rc, log = run_and_signal(args, when=None)
    assert rc == 0, log[-3000:]
    assert f"resumed {run_dir} from step {step}" in log, log[-2000:]
    got, want = _curve(run_dir), _curve(straight_dir)
    assert sorted(got) == list(range(1, STEPS + 1)) and all(len(v) == 1 for v in got.values())
    assert_close(
        "train/loss, preempted + resumed vs uninterrupted",
        [got[s][0] for s in sorted(got)],
        [want[s][0] for s in sorted(want)],
        EXACT,
    )
    final = json.load(open(os.path.join(run_dir, "final.json")))
    assert final["goodput"]["steps_redone"] == 0, final["goodput"]
    assert final["goodput"]["steps"] > 0 and 0 < final["goodput"]["goodput"] < 1


def _steps_logged_at_least(run_dir: str, n: int):
    return lambda _out: len(logged_steps(run_dir)) >= n


def test_sigterm_mid_run_saves_the_step_reached_and_resumes_exactly(straight, tmp_path):
    """No checkpoint is due before the end (checkpoint.interval=0, no evaluation): the preemption
    checkpoint is the only one, at whatever step the signal found."""
    straight_dir, args = straight
    run_dir = str(tmp_path / "run")
    rc, log = run_and_signal(
        args(str(tmp_path), "run"), when=_steps_logged_at_least(run_dir, 5), sig=signal.SIGTERM
    )
    step = _preempted_at(rc, log, run_dir)
    assert 5 <= step < STEPS
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == [str(step)]
    _resume_matches(args(str(tmp_path), "run"), run_dir, straight_dir, step)


def _saving(run_dir: str):
    """A `when`: an async save is in flight (Orbax writes a step into a temporary directory and
    renames it when committed)."""
    ckpts = os.path.join(run_dir, "checkpoints")
    return lambda _out: os.path.isdir(ckpts) and any("tmp" in d for d in os.listdir(ckpts))


def _evaluating(run_dir: str, step: int):
    """A `when`: step `step`'s evaluation has started (its metrics line is written first)."""
    return lambda _out: step in logged_steps(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize(
    "moment", ["before_the_first_step", "during_an_async_save", "during_an_evaluation", "sigint",
               "twice_while_saving"],
)  # fmt: skip
def test_a_signal_at_any_moment_loses_nothing(straight, tmp_path, moment):
    straight_dir, args = straight
    run_dir, out = str(tmp_path / "run"), str(tmp_path)
    extra, sig, repeat = [], signal.SIGTERM, None
    if moment == "before_the_first_step":
        when = lambda log: "run directory" in log  # noqa: E731 (the trainer has started)
    elif moment == "during_an_async_save":
        extra, when = ["checkpoint.interval=4"], _saving(run_dir)
    elif moment == "during_an_evaluation":
        extra = ["trainer.eval_interval=10", "data.eval_iters=60"]
        when = _evaluating(run_dir, 10)
    elif moment == "sigint":
        sig, when = signal.SIGINT, _steps_logged_at_least(run_dir, 7)
    else:
        repeat, when = 0.05, _steps_logged_at_least(run_dir, 7)
    rc, log = run_and_signal(args(out, "run", *extra), when=when, sig=sig, repeat_after=repeat)
    if moment == "before_the_first_step":
        assert rc == EXIT_PREEMPTED, log[-3000:]
        assert log.strip().splitlines()[-1].startswith("preempted at step 0: nothing trained yet")
        assert not os.path.exists(os.path.join(run_dir, "checkpoints", "0"))
        step = 0
    else:
        step = _preempted_at(rc, log, run_dir)
    if moment == "during_an_evaluation":
        evals = [r["step"] for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
                 if "eval/val_loss" in r]  # fmt: skip
        assert step == 10 and evals == [10], (step, evals)  # it finished, then saved that step
    if moment == "twice_while_saving":
        assert "again: still saving the checkpoint" in log, log[-3000:]
    if step:
        _resume_matches(args(out, "run", *extra), run_dir, straight_dir, step)
    else:
        rc, log = run_and_signal(args(out, "run", *extra), when=None)
        assert rc == 0 and "resumed" not in log, log[-3000:]


@pytest.mark.slow
def test_trm_sigterm_keeps_carry_ema_and_data_position(tmp_path):
    """TRM (float64 loss, as upstream): the carry, the EMA, both optimizers, the exploration
    stream and the data iterator come back; the curve of every logged metric continues EXACTLY."""
    data = build_tiny_sudoku(str(tmp_path / "sudoku"))
    out = str(tmp_path / "runs")

    def args(name):
        return tiny_trm_overrides(data, out, name, epochs=12)

    rc, log = run_and_signal(args("straight"), when=None)
    assert rc == 0, log[-3000:]
    run_dir = os.path.join(out, "run")
    rc, log = run_and_signal(
        args("run"), when=_steps_logged_at_least(run_dir, 5), sig=signal.SIGTERM
    )
    step = _preempted_at(rc, log, run_dir)
    rc, log = run_and_signal(args("run"), when=None)
    assert rc == 0, log[-3000:]
    for key in ("train/lm_loss", "train/q_halt_loss", "train/steps", "train/grad_norm"):
        got, want = _curve(run_dir, key), _curve(os.path.join(out, "straight"), key)
        assert sorted(got) == sorted(want) == list(range(1, 25)), key
        assert all(len(v) == 1 for v in got.values()), key
        assert_close(f"TRM {key} across a preemption at step {step}",
                     [got[s][0] for s in sorted(got)], [want[s][0] for s in sorted(want)], EXACT)  # fmt: skip


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_save_the_same_step_when_one_is_signalled(text_dir, tmp_path):
    """SIGTERM to process 1 only: JAX's preemption sync point makes both processes stop after the
    same step, both write their shards and data state of that one checkpoint, both exit 75 with
    the same line; the 2-process relaunch continues the curve of an uninterrupted 2-process run
    EXACTLY."""
    cmd = [sys.executable, "-m", "train.main"]

    def start(name):
        envs = local.process_envs(dict(os.environ), 2, 4, "cpu")
        logs = [open(tmp_path / f"{name}-{i}.log", "w+") for i in range(2)]
        args = tiny_gpt_overrides(text_dir, str(tmp_path), name, steps=STEPS)
        procs = [
            subprocess.Popen(
                cmd + args, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, text=True
            )  # fmt: skip
            for env, f in zip(envs, logs)
        ]
        return procs, logs

    def finish(procs, logs, timeout=600):
        codes = [p.wait(timeout=timeout) for p in procs]
        outs = []
        for f in logs:
            f.seek(0)
            outs.append(f.read())
        return codes, outs

    codes, outs = finish(*start("straight"))
    assert codes == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    run_dir = str(tmp_path / "run")
    procs, logs = start("run")
    deadline = time.monotonic() + 600
    while len(logged_steps(run_dir)) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    procs[1].send_signal(signal.SIGTERM)
    codes, outs = finish(procs, logs)
    assert codes == [EXIT_PREEMPTED] * 2, outs[0][-3000:] + outs[1][-3000:]
    lines = [o.strip().splitlines()[-1] for o in outs]
    assert lines[0] == lines[1] and lines[0].startswith("preempted at step "), lines
    step = int(lines[0].split()[3].rstrip(":"))
    data_files = sorted(os.listdir(os.path.join(run_dir, "checkpoints", str(step), "data")))
    assert [f for f in data_files if f.endswith(".json")] == [
        "process_0-of-2.json", "process_1-of-2.json"]  # fmt: skip
    codes, outs = finish(*start("run"))
    assert codes == [0, 0], outs[0][-3000:]
    got, want = _curve(run_dir), _curve(str(tmp_path / "straight"))
    assert sorted(got) == list(range(1, STEPS + 1)) and all(len(v) == 1 for v in got.values())
    assert_close("train/loss, 2 processes preempted + resumed vs uninterrupted",
                 [got[s][0] for s in sorted(got)], [want[s][0] for s in sorted(want)], EXACT)  # fmt: skip


@pytest.mark.slow
def test_launch_tpu_stop_ends_in_the_saved_step(straight, tmp_path, monkeypatch):
    """`python -m launch.tpu run` / `stop` send shell scripts to every worker over ssh; here both
    run with bash on this machine (code dir = this checkout, venv = this interpreter's): stop
    SIGTERMs the trainer, waits until it has saved and exited, and reports the saved step; `run`
    again resumes from it and the curve continues EXACTLY."""
    straight_dir, args = straight
    monkeypatch.setattr(tpu_launch, "REMOTE_DIR", REPO)
    monkeypatch.setattr(tpu_launch, "REMOTE_VENV", sys.prefix)
    monkeypatch.setattr(tpu_launch, "REMOTE_LOGS", str(tmp_path / "logs"))
    out = str(tmp_path / "runs")
    overrides = args(out, "run")
    run_dir = os.path.join(out, "run")
    script = tpu_launch.run_script(run_name="run", overrides=overrides)
    subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True, timeout=60)
    deadline = time.monotonic() + 600
    while len(logged_steps(run_dir)) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop = tpu_launch.stop_script(run_name="run")
    done = subprocess.run(["bash", "-c", stop], capture_output=True, text=True, timeout=700)
    assert done.returncode == 0, done.stderr
    m = re.search(r"saved and exited: preempted at step (\d+)", done.stdout)
    assert m, done.stdout + done.stderr
    step = int(m.group(1))
    assert logged_steps(run_dir) == list(range(1, step + 1))
    assert not list((tmp_path / "logs" / "run").glob("*.pid"))
    subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True, timeout=60)
    deadline = time.monotonic() + 600
    while not os.path.exists(os.path.join(run_dir, "final.json")) and time.monotonic() < deadline:
        time.sleep(0.1)
    got, want = _curve(run_dir), _curve(straight_dir)
    assert sorted(got) == list(range(1, STEPS + 1)) and all(len(v) == 1 for v in got.values())
    assert_close("train/loss, launch.tpu stop + run vs uninterrupted",
                 [got[s][0] for s in sorted(got)], [want[s][0] for s in sorted(want)], EXACT)  # fmt: skip

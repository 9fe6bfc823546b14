"""launch.local: per-process environment, override checks, and the process supervisor."""

from __future__ import annotations

import shlex
import sys

import pytest

from launch import local
from tests.helpers import run_overrides


def test_process_env_for_two_fake_hosts():
    env = local.process_env(
        {"XLA_FLAGS": "--xla_foo=1 --xla_force_host_platform_device_count=8"},
        process_id=1,
        num_processes=2,
        port=12345,
        cpu_devices=4,
        platform="cpu",
    )
    assert env["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:12345"
    assert (env["JAX_NUM_PROCESSES"], env["JAX_PROCESS_ID"]) == ("2", "1")
    assert env["JAX_PLATFORMS"] == "cpu"
    assert env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] == "gloo"
    # the inherited device count is replaced, other XLA flags kept
    assert env["XLA_FLAGS"] == "--xla_foo=1 --xla_force_host_platform_device_count=4"
    assert env["JAX_NUM_CPU_DEVICES"] == "4"


def test_single_process_env_sets_no_coordinator():
    env = local.process_env(
        {}, process_id=0, num_processes=1, port=None, cpu_devices=None, platform=None
    )
    assert env == {}


def test_dry_run_prints_one_command_per_process(capsys):
    argv = ["--processes", "2", "--cpu-devices", "4", "--dry-run", "--", "+experiment=x", "a=[1,2]"]
    assert local.main(argv) == 0
    lines = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 2
    for pid, line in enumerate(lines):
        assert f"JAX_PROCESS_ID={pid}" in line
        assert line[-4:] == ["-m", "train.main", "+experiment=x", "a=[1,2]"]


def test_flag_after_separator_is_rejected(capsys):
    assert local.main(["--dry-run", "--", "--lr=1"]) == 2
    assert "looks like a flag" in capsys.readouterr().err


def test_a_failing_process_stops_its_sibling(monkeypatch, capsys):
    """Process 1 exits 3 at once; process 0 would sleep 60 s: run() must return 3 promptly."""
    script = (
        "import os, sys, time; pid = int(os.environ['JAX_PROCESS_ID']); "
        "print('hello from', pid, flush=True); "
        "sys.exit(3) if pid == 1 else time.sleep(60)"
    )
    monkeypatch.setattr(local, "commands", lambda overrides: [sys.executable, "-c", script])
    rc = local.run([], processes=2, cpu_devices=1, timeout=30)
    assert rc == 3
    out = capsys.readouterr().out
    assert "[p1] hello from 1" in out


def test_run_processes_returns_each_output_and_times_out():
    """The same supervisor for any command: outputs come back per process, in process order."""
    hello = "import os; print('hello from', os.environ['JAX_PROCESS_ID'])"
    status, results = local.run_processes(
        [sys.executable, "-c", hello], processes=2, cpu_devices=1, echo=False
    )
    assert status == 0
    assert results == [(0, "hello from 0\n"), (0, "hello from 1\n")]
    status, results = local.run_processes(
        [sys.executable, "-c", "import time; time.sleep(60)"], timeout=1, echo=False
    )
    assert status == 124 and results[0][0] != 0


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_local_processes_train_and_rerun_resumes(tmp_path, capsys):
    """The launcher's real job: 2 processes x 4 CPU devices stand in for 2 hosts; running the
    same command again with a later stop resumes from the checkpoint instead of starting over."""
    common = run_overrides("trm_sudoku_tiny", tmp_path / "data", tmp_path / "runs", "local2", None)
    assert local.run([*common, "trainer.max_steps=2"], processes=2, cpu_devices=4, timeout=900) == 0
    first = capsys.readouterr().out
    assert "[p0]" in first and "[p1]" in first
    assert (tmp_path / "runs" / "local2" / "checkpoints").is_dir()
    assert local.run([*common, "trainer.max_steps=4"], processes=2, cpu_devices=4, timeout=900) == 0
    second = capsys.readouterr().out
    assert "resumed" in second and "from step 2" in second

"""`python -m train.main` is a Hydra app: --help lists the config groups, --cfg job prints the
composed config, --info says what the run would do, a bad override is one line and exit 1, and -m
sweeps run each job in its own run directory. Each test starts a fresh process (Hydra reads
sys.argv)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.helpers import REPO, build_tiny_sudoku, losses, tiny_trm_overrides
from train.compose import load_config
from train.errors import ConfigError


def _main(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "train.main", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_help_lists_the_config_groups():
    done = _main("--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "python -m train.main +experiment=NAME" in done.stdout
    for group in ("experiment", "model", "data", "optim", "mesh", "logging"):
        assert f"\n{group}: " in done.stdout, group
    assert "trm_sudoku_tiny" in done.stdout


def test_cfg_job_prints_the_composed_experiment():
    """With --resolve, a field's platform default is its value (TRM's float32 loss on a TPU
    mesh)."""
    overrides = ["+experiment=trm_sudoku_tiny", "optim.lr=3e-4", "mesh=v4-64"]
    done = _main(*overrides, "--cfg", "job", "--resolve")
    assert done.returncode == 0, done.stderr[-2000:]
    cfg = yaml.safe_load(done.stdout)
    assert cfg["family"] == "trm" and cfg["run"]["name"] == "trm_sudoku_tiny"
    assert cfg["optim"]["lr"] == 3e-4 and cfg["model"]["hidden_size"] == 32
    assert cfg["mesh"]["platform"] == "tpu" and cfg["model"]["loss_dtype"] == "float32"
    assert "hydra" not in cfg


def test_hydra_info_works_and_prints_each_line_once():
    done = _main("--info", "all")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Hydra" in done.stdout
    assert "Installed Hydra Plugins" not in done.stderr  # not also through the trainer's logger
    assert done.stdout.count("Installed Hydra Plugins") == 1


def test_info_says_what_the_run_would_do(tmp_path):
    """A bare --info: the experiment, family, mesh, data, steps and where the run writes, one
    line each, from the validated config; nothing is built or written. A bad key is the run's
    own one line."""
    out = str(tmp_path / "out")
    done = _main("+experiment=gpt_shakespeare_char_tiny", "--info", f"run.out_dir={out}",
                 "data.path=nowhere", "trainer.max_steps=50")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "experiment  gpt_shakespeare_char_tiny (configs/experiment/gpt_shakespeare_char_tiny.yaml)",
        "family      gpt: model GPTConfig, optim GPTOptimConfig, data GPTDataConfig",
        "mesh        cpu: data 1 x fsdp -1 x tensor 1 (-1: the devices left), params replicate",
        "data        nowhere: built on first use by data.build=shakespeare_char",
        "steps       301 (optim.max_iters=300 + 1, as nanoGPT's loop); stops at trainer.max_steps=50",
        f"writes      {out}/gpt_shakespeare_char_tiny: config.yaml, metrics.jsonl, final.json, "
        "checkpoints/",
        "logging     metrics.jsonl; wandb auto",
    ], done.stdout
    assert done.stderr == "" and not os.path.exists(out)


def test_a_typo_in_a_hydra_command_line_is_the_plain_runs_line():
    """`--cfg job` (Hydra's own command line) composes its overrides as a plain run first: a
    misspelt key is the same one line, not Hydra's block advising `+key`."""
    overrides = ["+experiment=trm_sudoku_tiny", "model.n_layr=1"]
    with pytest.raises(ConfigError) as e:
        load_config(overrides)
    done = _main(*overrides, "--cfg", "job")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"error: {e.value}\n", done.stderr


def test_bad_override_is_one_line_and_exit_1(tmp_path):
    done = _main("+experiment=trm_sudoku_tiny", "data.epochs=0", f"run.out_dir={tmp_path}")
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and "data.epochs" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert os.listdir(tmp_path) == []  # nothing ran


def test_bad_sweep_value_is_one_line_before_any_job_runs(tmp_path):
    """Every job of a -m sweep is composed and validated before the first one runs: a bad value
    in the second job is one line naming the job, and nothing ran (not even job 0)."""
    done = _main(
        "-m", "+experiment=trm_sudoku_tiny", f"run.out_dir={tmp_path}", "optim.lr=1e-4,fast"
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.startswith("error: sweep job 1 (") and "optim.lr='fast'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.slow  # two tiny TRM runs; the default tier checks a sweep's bad value
def test_multirun_runs_each_job_in_its_own_run_dir(tmp_path):
    data = build_tiny_sudoku(str(tmp_path / "sudoku"))
    out = str(tmp_path / "runs")
    overrides = tiny_trm_overrides(data, out, "sweep", epochs=1)
    done = _main("-m", *overrides, "optim.lr=1e-4,3e-4", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for num, lr in ((0, 1e-4), (1, 3e-4)):
        run_dir = os.path.join(out, f"sweep-{num}")
        with open(os.path.join(run_dir, "config.yaml")) as f:
            cfg = yaml.safe_load(f)
        assert cfg["run"]["name"] == f"sweep-{num}" and cfg["optim"]["lr"] == lr
        assert losses(run_dir, "train/lm_loss"), run_dir  # its own metrics.jsonl
    assert sorted(os.listdir(out)) == ["multirun.yaml", "sweep-0", "sweep-1"]
    assert not os.path.exists(os.path.join(REPO, "multirun.yaml"))

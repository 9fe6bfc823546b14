"""Whole runs that CI keeps (slow tier): the CPU experiments reach what upstream's own code reaches.

Each test runs `python -m train.main +experiment=...` as a user does (only folders, logging and the
compilation cache differ) and checks the run's own metrics.jsonl / `train.evaluate` report:

- gpt_shakespeare_char_cpu (nanoGPT's README CPU recipe): eval/val_loss <= GPT_VAL_LOSS_MAX at
  iteration 2000. nanoGPT's README says 1.88; upstream's train.py and ours, 6 seeds each, side by
  side: docs/benchmarks.md, "Whole runs against upstream".
- trm_sudoku_cpu: held-out exact accuracy >= TRM_EXACT_MIN at the end (the measured range of
  ours and upstream's seeds minus a margin, same section), and the recursion matters: the last ACT
  step's exact accuracy beats the first by >= TRM_ACT_GAIN_MIN.
- the `make demo` run (trm_sudoku_tiny, from nothing: it builds its own offline data) learns: its
  held-out exact accuracy is near 0 at the first evaluation (step 250) and well above 0 by step
  1000, and at the end it rises across ACT steps by >= DEMO_ACT_GAIN_MIN (the demo shows
  refinement, not puzzles already solved at step 1); where ../shared/data has sudoku-hard-test-1k,
  it solves >= DEMO_PUBLISHED_MIN of its solutions blanked as printed puzzles are.
- test-time scaling of the trm_sudoku_cpu run (`train.evaluate --trajectories 16 --noise 2`,
  sigma chosen on a validation split: docs/evaluation.md, "Test-time scaling"): the chosen
  answers' exact accuracy beats the plain evaluation's by >= TTSC_GAIN_MIN.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO, losses

pytestmark = pytest.mark.slow

GPT_VAL_LOSS_MAX = 1.95  # the bound; measured values in the module docstring's section
# trm_sudoku_cpu at step 4000, 6 runs (3 ours, 3 upstream's pretrain.py): 0.465 to 0.685; the bound
# is the lowest minus 0.115. Per ACT step the first solves none (0.0) and the eighth 0.55-0.685.
TRM_EXACT_MIN = 0.35
TRM_ACT_GAIN_MIN = 0.3
# make demo (trm_sudoku_tiny, 2000 steps), 5 seeds (bench/results/demo_seeds.json):
# per ACT step 0.44, 0.87, 0.92, 0.93 (means; gain 0.39 to 0.62); the bound is under the lowest.
DEMO_ACT_GAIN_MIN = 0.2
# The same runs learn: exact accuracy 0 at their first evaluation (step 250), 0.85-0.93 at 1000.
DEMO_FIRST_EVAL_MAX, DEMO_STEP_1000_MIN = 0.05, 0.3
# On sudoku-hard-test-1k's solutions blanked as printed puzzles are (30 blanks): 0.887 to 0.922
# over the 5 seeds; the bound is under the lowest.
DEMO_PUBLISHED_MIN = 0.85
# trm_sudoku_cpu's test split, 16 trajectories at the sigma chosen on validation against the plain
# evaluation: gain 0.345 (bench/results/ttsc/trm_sudoku_cpu.json, one seed measured); the bound is
# under half of it.
TTSC_TRAJECTORIES, TTSC_NOISE, TTSC_GAIN_MIN = 16, 2.0, 0.15


def _env() -> dict:
    """The environment a user runs in: one CPU device (conftest.py asks for 8 fake ones)."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env["XLA_FLAGS"] = " ".join(flags)
    return env


def _train(experiment: str, out_dir, name: str, *overrides: str, timeout: float) -> str:
    cmd = [
        sys.executable,
        "-m",
        "train.main",
        f"+experiment={experiment}",
        f"run.out_dir={out_dir}",
        f"run.name={name}",
        "logging.wandb=disabled",
        "trainer.progress_bar=false",
        "run.compilation_cache_dir=null",
        *overrides,
    ]
    p = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return os.path.join(out_dir, name)


def _evaluate(run_dir: str, out_json, *options: str) -> dict:
    cmd = [sys.executable, "-m", "train.evaluate", run_dir, "--json", str(out_json), *options]
    p = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(out_json.read_text())


def test_gpt_shakespeare_char_cpu_reaches_nanogpts_loss(tmp_path, shared_data_dir):
    run = _train(
        "gpt_shakespeare_char_cpu",
        tmp_path,
        "gpt_cpu",
        f"data.path={tmp_path / 'data'}",
        f"data.input={os.path.join(shared_data_dir, 'tinyshakespeare', 'input.txt')}",
        timeout=1500,
    )
    val = losses(run, "eval/val_loss")
    assert val[2000] <= GPT_VAL_LOSS_MAX, val


def test_trm_sudoku_cpu_reaches_the_measured_accuracy_and_uses_its_act_steps(tmp_path):
    run = _train(
        "trm_sudoku_cpu", tmp_path, "trm_cpu", f"data.path={tmp_path / 'data'}", timeout=2400
    )
    report = _evaluate(run, tmp_path / "eval.json")
    per_step = report["per_step"]["exact_accuracy"]
    assert report["exact_accuracy"] >= TRM_EXACT_MIN, report
    assert per_step[-1] - per_step[0] >= TRM_ACT_GAIN_MIN, per_step
    scaled = _evaluate(
        run, tmp_path / "ttsc.json", "--trajectories", str(TTSC_TRAJECTORIES),
        "--noise", str(TTSC_NOISE), "--batch", "256",
    )  # fmt: skip
    gain = scaled["exact_accuracy"] - report["exact_accuracy"]
    assert gain >= TTSC_GAIN_MIN, (report["exact_accuracy"], scaled["trajectories"])


def test_demo_learns_and_its_accuracy_rises_across_act_steps(tmp_path):
    """`python -m train.main +experiment=trm_sudoku_tiny` (`make demo`) from nothing: held-out
    exact accuracy under DEMO_FIRST_EVAL_MAX at the first evaluation, above DEMO_STEP_1000_MIN at
    step 1000, and at the end the last ACT step beats the first by >= DEMO_ACT_GAIN_MIN."""
    run = _train(
        "trm_sudoku_tiny", tmp_path, "demo", f"data.path={tmp_path / 'data'}", timeout=1200
    )
    exact = losses(run, "eval/all/exact_accuracy")
    assert min(exact) == 250 and exact[250] < DEMO_FIRST_EVAL_MAX, exact  # no test grid solved yet
    assert exact[1000] > DEMO_STEP_1000_MIN, exact
    per_step = _evaluate(run, tmp_path / "eval.json")["per_step"]["exact_accuracy"]
    assert per_step[-1] - per_step[0] >= DEMO_ACT_GAIN_MIN, per_step
    hard = os.path.join(os.path.dirname(REPO), "shared", "data", "sudoku", "sudoku-hard-test-1k")
    if os.path.isdir(hard):  # the published-style grids need the offline copy (tests only)
        from data.sudoku_easy import build_easy_sudoku

        printed = str(tmp_path / "published")
        build_easy_sudoku(printed, train=0, test=1000, blanks=30, num_aug=0,
                          test_csv=os.path.join(hard, "test.csv"), pattern="published")  # fmt: skip
        report = _evaluate(run, tmp_path / "published.json", "--data", printed)
        assert report["exact_accuracy"] >= DEMO_PUBLISHED_MIN, report["exact_accuracy"]

"""End-to-end GPT runs through the trainer: sharding invariance, resharding, kill -9 + resume
(and the goodput of the steps it redoes), export and import."""

from __future__ import annotations

import json
import os
import re
import signal

import jax
import pytest

from parity.compare import EXACT, FLOAT32, assert_close
from tests.helpers import (
    build_tiny_text,
    checkpoint_exists,
    logged_steps,
    losses,
    run_and_signal,
    tiny_gpt_overrides,
)
from train.compose import load_config
from train.mesh import make_mesh
from train.trainer import train


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    """A char-level data set built by data.shakespeare_char from tests.helpers.synthetic_text:
    what these tests check (sharding, resume, export) does not depend on the text."""
    return build_tiny_text(str(tmp_path_factory.mktemp("synthetic_char")))


def _run(overrides, n_devices):
    cfg = load_config(overrides)
    return train(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:n_devices]))


def _curve(run_dir):
    c = losses(run_dir)
    return [c[s] for s in sorted(c)]


def test_each_evaluation_prints_its_sample_and_wandb_off_is_disabled(text_dir, tmp_path, capsys):
    """The sample the config promises at each eval reaches the console: its first lines under
    the eval line (the whole text in metrics.jsonl). logging.wandb=off is `disabled`."""
    from train.metrics import TEXT_LINES, read_jsonl

    out = str(tmp_path)
    overrides = tiny_gpt_overrides(text_dir, out, "r", steps=2) + [
        "data.sample_tokens=60", "trainer.eval_interval=1", "optim.warmup_iters=1",
        "checkpoint.enabled=false", "logging.wandb=off",
    ]  # fmt: skip
    _run(overrides, 1)
    console = capsys.readouterr().out
    samples = [r for r in read_jsonl(os.path.join(out, "r", "metrics.jsonl")) if "eval/sample" in r]
    assert [r["step"] for r in samples] == [1, 2]
    assert not os.path.exists(os.path.join(out, "r", "wandb"))
    for r in samples:
        lines = [line for line in r["eval/sample"].splitlines() if line.strip()][:TEXT_LINES]
        block = "\n".join(["  eval/sample:", *(f"    {line[:100]}" for line in lines)])
        assert f"step {r['step']}: eval/val_loss " in console
        assert block in console, console


@pytest.mark.slow  # the default tier has the TRM twin (batch + carry sharding)
def test_gpt_same_losses_on_1_and_8_devices_and_restored_on_2(text_dir, tmp_path):
    """Data parallel over 8 fake devices computes the 1-device run: same loss at every step. A
    checkpoint saved on the 8-device mesh and resumed on 2 devices continues the 8-device curve.

    FLOAT32 (1e-5): the 8-way run sums per-shard partial gradients in a different order, which
    changes fp32 roundings (~1e-7 relative per op) and grows a little over 8 Adam steps; any
    sharding bug (a batch shard dropped or double counted, a wrong mean) moves losses by >1e-3.
    The 2-device resume differs from the 8-device run by reduction order alone, too.
    """
    out = str(tmp_path)
    _run(tiny_gpt_overrides(text_dir, out, "one"), 1)
    _run(tiny_gpt_overrides(text_dir, out, "eight"), 8)
    one, eight = _curve(os.path.join(out, "one")), _curve(os.path.join(out, "eight"))
    assert len(one) == 8
    assert_close("train/loss 8 devices vs 1", eight, one, FLOAT32)
    _run(tiny_gpt_overrides(text_dir, out, "moved") + ["trainer.max_steps=4"], 8)
    _run(tiny_gpt_overrides(text_dir, out, "moved"), 2)
    moved = _curve(os.path.join(out, "moved"))
    assert len(moved) == 8
    assert_close("train/loss resumed on 2 devices vs 8", moved, eight, FLOAT32)


@pytest.mark.slow  # default tier: test_train_preemption resumes a signalled run exactly
def test_gpt_kill_and_resume_is_bit_identical(text_dir, tmp_path):
    """Run 30 steps; separately run with checkpoints every 3 steps and kill -9 it from outside as
    soon as step 3 is committed (no clean exit; the run is a few steps further by then), relaunch:
    it resumes from its newest committed checkpoint and reproduces the curve EXACTLY (params, Adam
    moments, step, dropout RNG and the Grain iterator all come back). A SIGKILL cannot be caught:
    the relaunch trains again the steps logged after that checkpoint, and final.json's goodput
    says how many and what they cost.

    With dropout 0.1 AND 2 accumulation micro-steps: dropout runs inside the accumulation scan
    (models/gpt/training.py re-merges fresh Variables there; a model merged outside the scan
    raises TraceContextError when it draws a mask:
    docs/porting_nanogpt.md, "Dropout inside the accumulation scan")."""
    out = str(tmp_path)
    steps = ["data.gradient_accumulation_steps=2", "trainer.global_batch_size=16"]
    _run(tiny_gpt_overrides(text_dir, out, "straight", steps=30) + steps, 8)
    args = tiny_gpt_overrides(text_dir, out, "killed", steps=30) + steps + ["checkpoint.interval=3"]
    run_dir = os.path.join(out, "killed")
    rc, log = run_and_signal(args, when=checkpoint_exists(run_dir, 3), sig=signal.SIGKILL)
    assert rc == -signal.SIGKILL, log[-3000:]
    assert not os.path.exists(os.path.join(run_dir, "final.json")), "the run finished first"
    logged = max(logged_steps(run_dir))
    rc, log = run_and_signal(args, when=None)
    assert rc == 0, log[-3000:]
    resumed_at = re.search(r"resumed \S+ from step (\d+)", log)
    assert resumed_at and 3 <= int(resumed_at.group(1)) < 30, log[-2000:]
    resumed_from = int(resumed_at.group(1))
    # Where the results are, at the start; the summary line at the end (train.trainer).
    assert f"run directory {run_dir}: config.yaml, metrics.jsonl, final.json" in log
    final = json.load(open(os.path.join(run_dir, "final.json")))
    g = final["goodput"]
    assert g["steps_redone"] == logged - resumed_from and g["lost"] >= 0, (g, logged, resumed_from)
    assert "time: wall" in log
    summary = (
        f"done: 30 steps, best eval/val_loss={final['eval/val_loss']:.6g} at step 30; "
        f"checkpoints: {os.path.realpath(run_dir)}/checkpoints; summary: {run_dir}/final.json"
    )
    assert summary in log, log[-2000:]
    straight, resumed = _curve(os.path.join(out, "straight")), _curve(run_dir)
    assert len(resumed) == 30
    assert_close("train/loss after kill -9 + resume", resumed, straight, EXACT)


@pytest.mark.slow
def test_gpt_export_to_nanogpt_and_import_back(text_dir, tmp_path):
    """train.export writes nanoGPT's ckpt.pt; trainer.init_from=ckpt.pt starts a run from exactly
    those weights (EXACT: a copy)."""
    pytest.importorskip("torch")
    import numpy as np
    from flax import nnx

    from train.export import export
    from train.source import open_source

    out = str(tmp_path)
    _run(tiny_gpt_overrides(text_dir, out, "src", steps=3), 1)
    path = export(os.path.join(out, "src"), os.path.join(out, "ckpt.pt"))
    src = open_source(os.path.join(out, "src"))
    task, state = src.task, src.state
    cfg = load_config(tiny_gpt_overrides(text_dir, out, "dst") + [f"trainer.init_from={path}"])
    task2 = __import__("train.families", fromlist=["make_task"]).make_task(
        cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1])
    )
    imported = task2.import_weights(task2.create_state(), path)
    src_params = nnx.state(nnx.merge(task.graphdef, state)[0], nnx.Param)
    dst_params = nnx.state(nnx.merge(task2.graphdef, imported)[0], nnx.Param)
    for a, b in zip(jax.tree.leaves(src_params), jax.tree.leaves(dst_params)):
        assert_close("imported param", np.asarray(b), np.asarray(a), EXACT)

"""End-to-end TRM runs through the trainer: sharding invariance of the persistent carry, kill -9 +
resume (carry, EMA, both optimizers, exploration key, data position), and upstream's schedule."""

from __future__ import annotations

import os
import signal

import jax
import pytest

from parity.compare import EXACT, FLOAT32, assert_close
from tests.helpers import (
    build_tiny_sudoku,
    checkpoint_exists,
    losses,
    run_and_signal,
    tiny_trm_overrides,
)
from train.compose import load_config
from train.mesh import make_mesh
from train.metrics import read_jsonl
from train.trainer import train


@pytest.fixture(scope="module")
def sudoku_dir(tmp_path_factory):
    return build_tiny_sudoku(str(tmp_path_factory.mktemp("sudoku_tiny")))


def _curve(run_dir, key="train/lm_loss"):
    c = losses(run_dir, key)
    return [c[s] for s in sorted(c)]


def test_trm_same_losses_on_1_and_8_devices(sudoku_dir, tmp_path):
    """The batch AND the ACT carry shard over 8 devices; every step's loss equals the 1-device
    run's to FLOAT32 (fp32 reduction order across shards; loss in float32 here so the test process
    does not switch jax to x64 for every other test)."""
    out = str(tmp_path)
    for name, n in (("one", 1), ("eight", 8)):
        cfg = load_config(tiny_trm_overrides(sudoku_dir, out, name) + ["model.loss_dtype=float32"])
        train(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:n]))
    one, eight = _curve(os.path.join(out, "one")), _curve(os.path.join(out, "eight"))
    # 40 groups x 2 epochs / 16 = 5 scheduled steps; each 1-epoch iteration drops its partial batch
    assert len(one) == 4
    assert_close("train/lm_loss 8 devices vs 1", eight, one, FLOAT32)
    q1 = _curve(os.path.join(out, "one"), "train/q_halt_loss")
    q8 = _curve(os.path.join(out, "eight"), "train/q_halt_loss")
    assert_close("train/q_halt_loss 8 devices vs 1", q8, q1, FLOAT32)
    g1, g8 = (_curve(os.path.join(out, n), "train/grad_norm") for n in ("one", "eight"))
    assert_close("train/grad_norm 8 devices vs 1", g8, g1, FLOAT32)
    records = read_jsonl(os.path.join(out, "one", "metrics.jsonl"))
    norms = [
        (r["train/grad_norm"], r["train/puzzle_emb_grad_norm"])
        for r in records
        if "train/grad_norm" in r
    ]
    assert len(norms) == 4 and all(g > 0 and e > 0 for g, e in norms), norms
    evals = [r["step"] for r in records if "eval/all/exact_accuracy" in r]
    assert evals == [2, 4], evals  # after each upstream iteration (2 batches of 16 of 40 groups)


@pytest.mark.slow
def test_trm_kill_and_resume_is_bit_identical(sudoku_dir, tmp_path):
    """kill -9 from outside once step 3 is committed, relaunch: the resumed curve is
    bit-identical (float64 loss as upstream; carry, EMA, both optimizers, the model's exploration
    stream and the data position come back)."""
    out = str(tmp_path)

    def args(name):
        return tiny_trm_overrides(sudoku_dir, out, name, epochs=12) + ["checkpoint.interval=3"]

    rc, log = run_and_signal(args("straight"), when=None)
    assert rc == 0, log[-3000:]
    run_dir = os.path.join(out, "killed")
    rc, log = run_and_signal(args("killed"), when=checkpoint_exists(run_dir, 3), sig=signal.SIGKILL)
    assert rc == -signal.SIGKILL, log[-3000:]
    assert not os.path.exists(os.path.join(run_dir, "final.json")), "the run finished first"
    rc, log = run_and_signal(args("killed"), when=None)
    assert rc == 0 and "resumed" in log, log[-3000:]
    for key in ("train/lm_loss", "train/q_halt_loss", "train/steps"):
        straight, resumed = (
            _curve(os.path.join(out, "straight"), key),
            _curve(os.path.join(out, "killed"), key),
        )
        assert len(resumed) == 24
        assert_close(f"{key} after kill -9 + resume", resumed, straight, EXACT)


@pytest.mark.slow
def test_trm_export_to_upstream_and_import_back(sudoku_dir, tmp_path):
    """train.export writes the upstream state_dict of the EMA model; trainer.init_from=that file
    starts a run from exactly those weights (EXACT: a copy)."""
    pytest.importorskip("torch")
    import numpy as np

    from train.export import export
    from train.families import make_task
    from train.source import open_source

    out = str(tmp_path)
    over = ["model.loss_dtype=float32"]
    cfg = load_config(tiny_trm_overrides(sudoku_dir, out, "src") + over)
    train(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]))
    path = export(os.path.join(out, "src"), os.path.join(out, "step_4"))
    state = open_source(os.path.join(out, "src")).state
    cfg2 = load_config(tiny_trm_overrides(sudoku_dir, out, "dst") + over)
    task2 = make_task(cfg2, make_mesh(cfg2.mesh, devices=jax.devices()[:1]))
    imported = task2.import_weights(task2.create_state(), path)
    ema = jax.tree.leaves(state["train"].ema)  # upstream saves the EMA copy
    got = jax.tree.leaves(imported["train"].params)
    assert len(ema) == len(got) > 0
    for a, b in zip(ema, got):
        assert_close("imported param", np.asarray(b), np.asarray(a), EXACT)
    table = jax.tree.leaves(state["train"].table)[0]
    assert_close(
        "puzzle table",
        np.asarray(jax.tree.leaves(imported["train"].table)[0]),
        np.asarray(table),
        EXACT,
    )


@pytest.mark.slow  # two runs; the default tier: test_train_run_faults' changed model
def test_resume_with_another_batch_size_is_refused_clearly(sudoku_dir, tmp_path):
    """Rerunning a run with a changed trainer.global_batch_size fails BEFORE restoring, with a
    ConfigError naming the key and both values (what the 2-process rerun test hit when the
    experiment's batch size was edited between its two runs: the data iterator refused its state)."""
    from train.errors import ConfigError

    out = str(tmp_path)
    over = ["model.loss_dtype=float32", "trainer.max_steps=1"]
    mesh = make_mesh(load_config(tiny_trm_overrides(sudoku_dir, out, "r") + over).mesh)
    train(load_config(tiny_trm_overrides(sudoku_dir, out, "r") + over), mesh)
    cfg = load_config(
        tiny_trm_overrides(sudoku_dir, out, "r") + over + ["trainer.global_batch_size=8"]
    )
    with pytest.raises(ConfigError, match=r"trainer.global_batch_size=16 \(this run: 8\)"):
        train(cfg, mesh)

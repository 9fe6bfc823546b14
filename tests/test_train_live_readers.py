"""Reading a run while it trains: `train.evaluate` (and every reader: train.sample, train.export,
train.source) opens a live run's checkpoints read-only, so the trainer's in-flight saves, its
deletions of old steps and its curve are untouched (docs/training.md, "Reading a run while it
trains"). The bucket variant: tests/test_train_gcs.py,
test_evaluate_again_and_again_beside_a_live_bucket_run."""

from __future__ import annotations

import os

import pytest

from tests.helpers import (
    build_tiny_text,
    check_beside_a_live_run,
    losses,
    read_while_training,
    run_and_signal,
    tiny_gpt_overrides,
)

STEPS = 100  # a checkpoint at each step, two kept: saves and deletions all the time


@pytest.mark.slow
def test_evaluate_again_and_again_beside_a_live_run(tmp_path):
    """train.evaluate on the run directory of a trainer that saves (async) at every step and
    removes all but the last two, again and again until the trainer ends: the trainer exits 0,
    every kept checkpoint restores, the curve equals an undisturbed run's."""
    from train.source import open_source

    text_dir = build_tiny_text(str(tmp_path / "text"))
    out = str(tmp_path / "runs")

    def args(name):
        return [*tiny_gpt_overrides(text_dir, out, name, steps=STEPS), "checkpoint.interval=1",
                "checkpoint.keep_last=2"]  # fmt: skip

    rc, log = run_and_signal(args("straight"), when=None)
    assert rc == 0, log[-3000:]
    run_dir = os.path.join(out, "live")
    checkpoints = os.path.join(run_dir, "checkpoints")

    def ready():  # a step committed
        return os.path.isdir(checkpoints) and any(s.isdigit() for s in os.listdir(checkpoints))

    rc, log, reads = read_while_training(args("live"), lambda: None, ready=ready, reader=run_dir)
    kept = sorted(int(s) for s in os.listdir(checkpoints) if s.isdigit())
    check_beside_a_live_run(rc, log, reads, kept, STEPS)
    for step in kept:
        assert open_source(run_dir, step=step).step == step
    assert losses(run_dir) == losses(os.path.join(out, "straight"))

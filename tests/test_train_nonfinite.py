"""A non-finite loss or gradient never goes unnoticed (train/nonfinite.py, docs/training.md
"Non-finite loss or gradients"): the flag is computed inside the step, `trainer.on_nonfinite=stop`
stops with a message naming the step, the metric and the last good checkpoint before anything
non-finite is saved, `skip` keeps the old state (bit for bit), and metrics.jsonl / final.json stay
strict JSON (null + a `nonfinite` list)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import (
    REPO,
    build_tiny_sudoku,
    build_tiny_text,
    tiny_gpt_overrides,
    tiny_trm_overrides,
)
from train import families
from train import jit as jit_lib
from train.checkpoint import Checkpointer
from train.compose import load_config
from train.errors import ConfigError
from train.mesh import make_mesh
from train.metrics import dumps, read_jsonl, strict_json
from train.nonfinite import FLAG, guard_step
from train.trainer import train

# The tiny GPT (tests.helpers.tiny_gpt_overrides) with a sane lr for the first steps, then lr 1e6:
# nanoGPT's schedule decays from learning_rate to min_lr over lr_decay_iters and stays at min_lr,
# so here it RISES to 1e6 at iteration 4; the gradient norm overflows a step or two later. The
# exact step depends on float rounding (XLA fusions), so the tests read it from the run.
DIVERGING = [
    "optim.learning_rate=1e-3",
    "optim.lr_decay_iters=4",
    "optim.min_lr=1e6",
    "checkpoint.interval=1",
    "checkpoint.keep_last=2",
]


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    return build_tiny_text(str(tmp_path_factory.mktemp("synthetic_char")))


def _strict_lines(path) -> list[dict]:
    """Every line of a JSONL file through a parser that refuses NaN / Infinity."""

    def refuse(name):
        raise AssertionError(f"bare {name} in {path}")

    with open(path) as f:
        return [json.loads(line, parse_constant=refuse) for line in f if line.strip()]


def _host_leaves(tree) -> list[np.ndarray]:
    """Leaves as numpy (typed PRNG keys as their key data)."""
    return [
        np.asarray(
            jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x
        )
        for x in jax.tree.leaves(tree)
    ]


def _all_finite(tree) -> bool:
    return all(
        np.all(np.isfinite(x)) for x in _host_leaves(tree) if np.issubdtype(x.dtype, np.floating)
    )


# --- config ---------------------------------------------------------------------------------------
def test_on_nonfinite_is_validated_in_one_line(text_dir, tmp_path):
    overrides = tiny_gpt_overrides(text_dir, str(tmp_path), "x") + ["trainer.on_nonfinite=warn"]
    with pytest.raises(ConfigError) as e:
        load_config(overrides)
    msg = str(e.value)
    assert "\n" not in msg
    assert "trainer.on_nonfinite" in msg and "'warn'" in msg and "stop|skip" in msg, msg
    assert load_config(overrides[:-1]).trainer.on_nonfinite == "stop"  # the default


# --- strict JSON ----------------------------------------------------------------------------------
def test_strict_json_writes_null_and_a_flag():
    record = {"step": 3, "a": math.nan, "b": 1.5, "c": [1.0, math.inf], "d": "text", "e": -math.inf}
    out = strict_json(record)
    assert out == {
        "step": 3,
        "a": None,
        "b": 1.5,
        "c": [1.0, None],
        "d": "text",
        "e": None,
        "nonfinite": ["a", "c", "e"],
    }
    assert json.loads(dumps(record)) == out  # dumps uses allow_nan=False: it would raise otherwise
    assert strict_json({"x": 1.0}) == {"x": 1.0}  # no flag when everything is finite


# --- the guard inside the step --------------------------------------------------------------------
def _toy_step(state, batch):
    """state + batch; 'loss' = sum(batch): NaN when the batch has one."""
    new = {"w": state["w"] + batch, "count": state["count"] + 1}
    return new, {"loss": jnp.sum(batch), "grad_norm": jnp.float32(1.0), "lr": jnp.float32(jnp.nan)}


@pytest.mark.parametrize("mode", ["stop", "skip"])
def test_guard_flags_nonfinite_loss_and_skip_keeps_the_state(mode):
    step = jax.jit(guard_step(_toy_step, mode))
    state = {"w": jnp.arange(3.0), "count": jnp.int32(0)}
    new, m = step(state, jnp.ones(3))
    assert float(m[FLAG]) == 0.0 and int(new["count"]) == 1  # a NaN `lr` is not checked
    bad, m = step(new, jnp.array([1.0, jnp.nan, 0.0]))
    assert float(m[FLAG]) == 1.0
    if mode == "skip":
        assert all(
            np.array_equal(a, b) for a, b in zip(_host_leaves(bad), _host_leaves(new), strict=True)
        )
    else:
        assert int(bad["count"]) == 2 and np.isnan(np.asarray(bad["w"][1]))
    _, m = step(new, jnp.array([jnp.inf, 0.0, 0.0]))
    assert float(m[FLAG]) == 1.0


def _family_cfg(family, data_dir, out, mode):
    if family == "gpt":
        overrides = tiny_gpt_overrides(data_dir, out, "unit")
    else:
        overrides = tiny_trm_overrides(data_dir, out, "unit") + ["model.loss_dtype=float32"]
    return load_config(overrides + [f"trainer.on_nonfinite={mode}"])


def _poison(state):
    """The state with its first float leaf of 2+ dims (an embedding / weight) set to NaN."""
    leaves, treedef = jax.tree.flatten(state)
    i = next(
        i for i, x in enumerate(leaves) if jnp.issubdtype(x.dtype, jnp.floating) and x.ndim >= 2
    )
    leaves[i] = jnp.full_like(leaves[i], jnp.nan)
    return jax.tree.unflatten(treedef, leaves)


@pytest.mark.parametrize(
    "mode, family",  # each family and each mode in the default tier; the other pairs are slow
    [
        ("stop", "gpt"),
        ("skip", "trm"),
        pytest.param("skip", "gpt", marks=pytest.mark.slow),
        pytest.param("stop", "trm", marks=pytest.mark.slow),
    ],
)
def test_the_real_step_returns_the_flag_and_skip_returns_its_input(family, mode, tmp_path, request):
    """The trainer's own jitted step (train.jit.jit_train_step: the guard inside) of both families: a finite step
    has flag 0; a NaN weight gives flag 1, and with skip the state that comes out IS the state
    that went in, bit for bit (params, optimizer, step counts, EMA, carry, RNG)."""
    if family == "gpt":
        data = request.getfixturevalue("text_dir")
    else:
        data = build_tiny_sudoku(str(tmp_path / "sudoku"))
    cfg = _family_cfg(family, data, str(tmp_path), mode)
    mesh = make_mesh(cfg.mesh, devices=jax.devices()[:1])
    task = families.make_task(cfg, mesh)
    with jax.set_mesh(mesh):
        step = jit_lib.jit_train_step(task)
        batches = task.train_iterator()
        state, metrics = step(task.create_state(), task.to_global(next(batches)))
        assert float(metrics[FLAG]) == 0.0 and _all_finite(state)
        poisoned = _poison(state)
        before = _host_leaves(poisoned)
        after, metrics = step(poisoned, task.to_global(next(batches)))
    assert float(metrics[FLAG]) == 1.0
    same = [np.array_equal(a, b, equal_nan=True) for a, b in zip(before, _host_leaves(after))]
    assert all(same) == (mode == "skip"), same


# --- the trainer ----------------------------------------------------------------------------------
def _checkpoint_steps(run_dir) -> list[int]:
    return sorted(int(d) for d in os.listdir(os.path.join(run_dir, "checkpoints")) if d.isdigit())


def _restore(cfg, run_dir, step):
    mesh = make_mesh(cfg.mesh, devices=jax.devices()[:1])
    task = families.make_task(cfg, mesh)
    ckpt = Checkpointer(os.path.join(run_dir, "checkpoints"), cfg.checkpoint)
    try:
        abstract = jit_lib.with_shardings(task.abstract_state, task.state_shardings)
        return ckpt.restore(step, abstract)[0]
    finally:
        ckpt.close()


def test_stop_exits_nonzero_naming_step_metric_and_last_good_checkpoint(text_dir, tmp_path):
    """`python -m train.main` (in process): exit status 1 with the message; every kept checkpoint
    is finite and the newest is the step before the bad one; metrics.jsonl is strict JSON with
    null + the flag at the bad step."""
    from train.main import main

    overrides = tiny_gpt_overrides(text_dir, str(tmp_path), "stop", steps=16) + DIVERGING
    with pytest.raises(SystemExit) as e:
        main(overrides)
    msg = e.value.code
    assert isinstance(msg, str), msg  # sys.exit(str): exit status 1
    found = re.search(
        r"non-finite ([\w/, ]+?) at step (\d+) \(.*last good checkpoint: (\S+) \(step (\d+)\)", msg
    )
    assert found, msg
    metric, bad, path, good = (
        found.group(1),
        int(found.group(2)),
        found.group(3),
        int(found.group(4)),
    )
    assert metric.startswith("train/") and bad > 1, msg
    run_dir = os.path.join(str(tmp_path), "stop")
    kept = _checkpoint_steps(run_dir)
    assert kept[-1] == good == bad - 1 and all(s < bad for s in kept), (kept, msg)
    assert path == os.path.join(os.path.realpath(run_dir), "checkpoints", str(good))
    cfg = load_config(overrides)
    for s in kept:
        assert _all_finite(_restore(cfg, run_dir, s)), s
    records = _strict_lines(os.path.join(run_dir, "metrics.jsonl"))
    flagged = [r for r in records if r.get("train/nonfinite")]
    assert [r["step"] for r in flagged] == [bad], records
    assert metric in flagged[0]["nonfinite"] and flagged[0][metric] is None, flagged
    assert not os.path.exists(os.path.join(run_dir, "final.json"))


@pytest.mark.slow  # a whole run; the default tier checks skip on the real step
def test_skip_finishes_with_a_finite_state_and_logs_the_count(text_dir, tmp_path):
    overrides = tiny_gpt_overrides(text_dir, str(tmp_path), "skip", steps=16) + DIVERGING
    cfg = load_config(overrides + ["trainer.on_nonfinite=skip"])
    result = train(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]))
    run_dir = os.path.join(str(tmp_path), "skip")
    assert result["step"] == 16
    records = _strict_lines(os.path.join(run_dir, "metrics.jsonl"))
    flagged = [r["step"] for r in records if r.get("train/nonfinite")]
    assert flagged and flagged[0] > 3, records
    first = next(r for r in records if r["step"] == flagged[0] and "train/loss" in r)
    assert first["nonfinite"] and all(first[k] is None for k in first["nonfinite"]), first
    final = _strict_lines(os.path.join(run_dir, "final.json"))[0]
    assert final["nonfinite_skipped"] == len(flagged), (final, flagged)
    logged = [r["train/skipped_steps"] for r in records if "train/skipped_steps" in r]
    # counted one step late, as every metric is read: step 16's record counts steps 1-15
    assert logged[-1] == len([s for s in flagged if s < 16]), (logged, flagged)
    for s in _checkpoint_steps(run_dir):
        assert _all_finite(_restore(cfg, run_dir, s)), s
    assert read_jsonl(os.path.join(run_dir, "metrics.jsonl")) == records


@pytest.mark.slow  # a whole run; the default tier checks skip on the real step
def test_trm_skip_keeps_the_carry_and_ema_finite(tmp_path):
    """The TRM loop (persistent carry, EMA, two optimizers, exploration key) under lr 1e6 with
    skip: the run finishes, every kept checkpoint is finite, the evaluation (EMA weights) too."""
    data = build_tiny_sudoku(str(tmp_path / "sudoku"))
    overrides = tiny_trm_overrides(data, str(tmp_path), "trm", epochs=6) + [
        "model.loss_dtype=float32",
        "optim.lr=1e6",
        "checkpoint.interval=1",
        "trainer.on_nonfinite=skip",
    ]
    cfg = load_config(overrides)
    result = train(cfg, make_mesh(cfg.mesh, devices=jax.devices()[:1]))
    run_dir = os.path.join(str(tmp_path), "trm")
    records = _strict_lines(os.path.join(run_dir, "metrics.jsonl"))
    flagged = [r["step"] for r in records if r.get("train/nonfinite")]
    final = _strict_lines(os.path.join(run_dir, "final.json"))[0]
    assert flagged and final["nonfinite_skipped"] == len(flagged), (final, flagged)
    assert math.isfinite(result["eval/all/lm_loss"]), result
    for s in _checkpoint_steps(run_dir):
        assert _all_finite(_restore(cfg, run_dir, s)), s


@pytest.mark.multiprocess
@pytest.mark.slow  # two processes compile the tiny GPT: ~1 min on a loaded 2-core box
def test_two_processes_both_stop_with_the_same_error(text_dir, tmp_path):
    """2 local processes x 2 CPU devices (gloo), trainer.on_nonfinite=stop: the flag is a
    replicated metric, so both processes read it at the same step and both exit 1 with the same
    one-line error naming the same step and last good checkpoint; neither hangs in a collective.
    Each process is waited for on its own (launch.local would terminate the second when the
    first exits)."""
    from launch.local import process_envs

    out = str(tmp_path / "runs")
    overrides = tiny_gpt_overrides(text_dir, out, "mp", steps=16) + DIVERGING
    cmd = [sys.executable, "-m", "train.main", *overrides]
    procs = [
        subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for env in process_envs(dict(os.environ), 2, 2, "cpu")
    ]
    outputs = [p.communicate(timeout=400)[0].decode(errors="replace") for p in procs]
    errors = [[ln for ln in o.splitlines() if ln.startswith("error: ")] for o in outputs]
    assert [p.returncode for p in procs] == [1, 1], [o[-3000:] for o in outputs]
    assert len(errors[0]) == 1 and errors[0] == errors[1], errors
    assert "non-finite" in errors[0][0] and "last good checkpoint" in errors[0][0], errors
